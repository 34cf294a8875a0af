#include "server/server_conn.h"

#include <unistd.h>

#include "libd.h"

namespace libd {

using namespace proto;

namespace {
constexpr size_t kDirectMin = 16 * 1024;   // what is left of a payload this large skips the staging copy
constexpr size_t kMaxAttachments = 4096;   // grants one session may hold at once
constexpr uint64_t kAuthTimeoutMs = 10000;  // a silent client is dropped after this
}  // namespace

ServerConn::ServerConn(MemoryServer *srv, bool is_unix) : srv_(srv), unix_(is_unix), reader_(this) {
  if (unix_) {
    uv_pipe_init(srv->loop_.loop(), &h_.pipe, 0);
  } else {
    uv_tcp_init(srv->loop_.loop(), &h_.tcp);
  }
  h_.handle.data = this;
  uv_timer_init(srv->loop_.loop(), &auth_timer_);
  auth_timer_.data = this;
  uv_check_init(srv->loop_.loop(), &burst_end_);
  burst_end_.data = this;
  srv_->conns_.insert(this);
  srv_->nconns_++;
}

void ServerConn::start() {
  on_start();
  nonce_ = random_bytes(kNonceSize);
  Header h;
  h.opcode = kChallenge;
  h.size = nonce_.size();
  send_frame(h, nonce_);
  uv_timer_start(&auth_timer_, [](uv_timer_t *t) {
    auto *c = static_cast<ServerConn *>(t->data);
    if (!c->authed_) c->close();
  }, kAuthTimeoutMs, 0);
  uv_read_start(stream(), on_alloc, on_read);
}

void ServerConn::close() {
  if (closing_) return;
  closing_ = true;
  on_close();
  srv_->conns_.erase(this);
  srv_->nconns_--;
  // Every holder that leaves without having said it finished is lost to its owner, who must not
  // wait for it forever.
  for (auto &[h, a] : atts_) srv_->release_attachment(a.grant.id, unix_, session_, !a.notified);
  atts_.clear();
  for (auto &a : draining_) srv_->release_attachment(a.grant.id, unix_, session_, !a.notified);
  draining_.clear();
  uv_timer_stop(&auth_timer_);
  in_burst_ = false;  // (what the burst batched is dropped with the connection)
  pending_closes_ = 3;
  auto done = [](uv_handle_t *h) {
    auto *c = static_cast<ServerConn *>(h->data);
    if (--c->pending_closes_ == 0) delete c;
  };
  uv_close(reinterpret_cast<uv_handle_t *>(&auth_timer_), done);
  uv_close(reinterpret_cast<uv_handle_t *>(&burst_end_), done);
  uv_close(&h_.handle, done);
}

void ServerConn::cut(const std::function<bool(const Grant &)> &pred, int reason, bool quiesce) {
  if (closing_ || !authed_) return;
  std::vector<uint32_t> ended;
  for (auto &[h, a] : atts_)
    if (pred(a.grant)) ended.push_back(h);
  for (auto d = draining_.begin(); d != draining_.end();) {
    if (!pred(d->grant)) { ++d; continue; }
    if (quiesce && sending(d->element.get())) { close(); return; }  // detached, but its READ answers are still being sent
    srv_->release_attachment(d->grant.id, unix_, session_, false);
    d = draining_.erase(d);
  }
  if (ended.empty()) return;
  if (!session_) { close(); return; }
  if (quiesce)
    for (uint32_t h : ended)
      if (sending(atts_[h].element.get())) { close(); return; }
  for (uint32_t h : ended) {
    on_handle_cut(h);
    srv_->release_attachment(atts_[h].grant.id, unix_, session_, false);  // the owner's own doing: not a loss
    atts_.erase(h);
    Header d;
    d.opcode = kDetached;
    d.addr = h;
    d.status = reason;
    send_frame(d, {});
    if (closing_) return;  // the send failed: close() let go of the rest
  }
}

// ---- frames ----

int ServerConn::on_header(const Header &h, char **dest) {
  switch (h.opcode) {
    case kAuth:
      if (authed_ || got_auth_) return -EPROTO;
      got_auth_ = true;
      auth_flags_ = h.addr;
      ctl_.assign(size_t(h.size), '\0');
      *dest = ctl_.data();
      return 0;
    case kAttach:
      if (!authed_ || !session_) return -EPROTO;
      ctl_.assign(size_t(h.size), '\0');
      *dest = ctl_.data();
      return 0;
    case kDetach:
      return (authed_ && session_ && h.size == 0) ? 0 : -EPROTO;
    case kNotify:
      return (authed_ && h.size == 0) ? 0 : -EPROTO;
    default:
      return authed_ ? on_kind_header(h, dest) : -EPROTO;
  }
}

int ServerConn::on_frame(const Header &h) {
  switch (h.opcode) {
    case kAuth: return on_auth();
    case kAttach: return on_attach(h);
    case kDetach: return on_detach(h);
    case kNotify: return on_notify(h);
    default: return on_kind_frame(h);
  }
}

Attachment *ServerConn::attachment(const Header &h) {
  auto it = atts_.find(session_ ? handle_of(h.req_id) : 0);
  return it == atts_.end() ? nullptr : &it->second;
}

int ServerConn::check(const Attachment &a, const Header &h, unsigned need) {
  const Grant &g = a.grant;
  if (g.has_ended()) return -ECONNRESET;
  if (!(g.rights & need)) return -EACCES;
  if (h.addr < g.offset || h.size > g.offset + g.length - h.addr || h.addr > g.offset + g.length) return -ERANGE;
  // Memory lent as several ranges: one transfer moves within one of them (the client's list
  // names each range with its own entry).
  if (!a.element->ranges.empty() && !a.element->at(h.addr, h.size)) return -EINVAL;
  return 0;
}

int ServerConn::admit(uint32_t handle, GrantBody *body) {
  AuthBody a;
  std::string why;
  if (decode_auth(ctl_.data(), ctl_.size(), &a, &why)) return -EPROTO;
  Grant g;
  if (!srv_->find_grant(a.grant_id, &g) || (g.client != "*" && g.client != a.client_id) ||
      !macs_equal(a.mac, compute_mac(g.secret, nonce_, a.grant_id, a.client_id)))
    return -EACCES;
  std::shared_ptr<Element> element;
  // Counted under the server's lock in the same hold that finds the grant again: a revoke
  // either comes first (the grant is gone) or sees the attachment (and ends it).
  if (int rc = srv_->take_attachment(g, unix_, session_, &element)) return rc;
  Attachment &att = atts_[handle] = Attachment{g, element, false};
  *body = GrantBody{element->size, g.offset, g.length, g.rights};
  describe(handle, att, body);
  return 0;
}

int ServerConn::on_auth() {
  Header r;
  r.opcode = kAuthOk;
  session_ = (auth_flags_ & kAuthSession) != 0;
  GrantBody body;
  int rc = admit(0, &body);
  if (rc == -EPROTO) return rc;
  if (rc) {
    r.status = rc;
    send_frame(r, {});
    close_after_writes_ = true;
    return 0;
  }
  authed_ = true;
  uv_timer_stop(&auth_timer_);
  std::string payload = encode_grant(body);
  r.size = payload.size();
  send_auth_ok(r, payload);
  return 0;
}

int ServerConn::on_attach(const Header &h) {
  if (h.addr == 0 || h.addr > UINT32_MAX || atts_.count(uint32_t(h.addr))) return -EPROTO;
  Header r;
  r.opcode = kAttachOk;
  r.addr = h.addr;
  GrantBody body;
  // Each attachment costs the server memory: a session holds at most kMaxAttachments at once
  // (the peer opens another session for more).
  int rc = atts_.size() + draining_.size() >= kMaxAttachments ? -EMFILE : admit(uint32_t(h.addr), &body);
  if (rc == -EPROTO) return rc;
  if (rc == 0 && (h.req_id & kAttachQuiet)) return 0;  // the peer checked it itself: nothing to say
  std::string payload = rc == 0 ? encode_grant(body) : std::string();
  r.status = rc;  // a refused grant leaves the session as it was
  r.size = payload.size();
  send_frame(r, payload);
  return 0;
}

int ServerConn::on_detach(const Header &h) {
  auto it = atts_.find(uint32_t(h.addr));
  if (h.addr > UINT32_MAX || it == atts_.end()) return 0;  // ended by the owner meanwhile
  if (sending(it->second.element.get())) {
    // READ answers from its memory are still queued: the grant stays held (the owner's revoke
    // or withdraw waits for this loop) until they are sent.
    draining_.push_back(std::move(it->second));
  } else {
    srv_->release_attachment(it->second.grant.id, unix_, session_, !it->second.notified);
  }
  atts_.erase(it);
  return 0;
}

int ServerConn::on_notify(const Header &h) {
  Attachment *a = attachment(h);
  if (!a) return 0;  // its grant is over: nobody waits for the word any more
  // A holder may send its word right behind its requests, before their answers: a word of
  // success after a request of its that was refused is that refusal.
  Notice n{h.addr, h.status == 0 && a->refused ? a->refused : h.status};
  if (sending(a->element.get())) {
    // READ answers from the grant's memory are still queued: the owner, once told, may reuse
    // the memory, so it is told when they are sent (or, if the connection closes first, hears
    // of a holder lost without its word).
    held_.push_back({a->element.get(), a->grant.id, n});
    return 0;
  }
  a->notified = true;
  // Told once this read is handled: a DETACH that came with it is counted first, so the owner,
  // woken, ends the grant without a trip to this loop.
  notices_.push_back({a->grant.id, n});
  if (!in_read_) deliver_notices();
  return 0;
}

void ServerConn::release_held() {
  if (held_.empty()) return;
  if (closing_) {  // the answers were never all sent: the holders are lost, not done
    held_.clear();
    return;
  }
  for (auto n = held_.begin(); n != held_.end();) {
    if (sending(n->element)) { ++n; continue; }
    for (auto &[handle, a] : atts_)
      if (a.grant.id == n->grant) a.notified = true;
    for (auto &d : draining_)
      if (d.grant.id == n->grant) d.notified = true;
    notices_.push_back({std::move(n->grant), n->notice});
    n = held_.erase(n);
  }
}

void ServerConn::release_drained(const Element *e) {
  release_held();
  if (!in_read_) deliver_notices();
  for (auto d = draining_.begin(); d != draining_.end();) {
    if (d->element.get() != e) { ++d; continue; }
    srv_->release_attachment(d->grant.id, unix_, session_, !d->notified);
    d = draining_.erase(d);
  }
}

void ServerConn::deliver_notices() {
  auto pending = std::move(notices_);
  notices_.clear();
  for (auto &[grant, n] : pending) srv_->on_notice(grant, n);
}

void ServerConn::note_activity() { srv_->loop_.note_activity(); }

void ServerConn::read_handled() {
  flush();
  release_held();  // answers the kernel took at once: their words go now
  deliver_notices();
}

// ---- the socket ----

void ServerConn::on_alloc(uv_handle_t *h, size_t, uv_buf_t *buf) {
  auto *c = static_cast<ServerConn *>(h->data);
  char *p;
  size_t len;
  if (c->reader_.direct_target(kDirectMin, &p, &len)) {
    buf->base = p;
    buf->len = len;
  } else {
    buf->base = c->staging_;
    buf->len = kStagingSize;
  }
}

void ServerConn::on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  auto *c = static_cast<ServerConn *>(s->data);
  if (n < 0) { c->close(); return; }
  if (n == 0) {  // nothing more to read (libuv's EAGAIN)
    if (c->in_burst_) c->end_burst();
    return;
  }
  if (c->closing_ || c->close_after_writes_) return;
  c->note_activity();
  std::string why;
  c->in_read_ = true;
  int rc = buf->base == c->staging_ ? c->reader_.feed(buf->base, size_t(n), &why)
                                    : c->reader_.advance_direct(size_t(n), &why);
  if (rc) {
    c->end_burst();
    c->close();  // a protocol violation ends this connection only
    return;
  }
  // A full buffer: libuv reads on at once, and the answers to what comes next join the ones
  // batched so far. A first transfer's ATTACH and its large WRITE (or anything else cut at a
  // buffer's end) are then answered in one write, not an ATTACH answer on its own between them.
  if (size_t(n) == buf->len) {
    if (!c->in_burst_) {
      c->in_burst_ = true;
      uv_check_start(&c->burst_end_, [](uv_check_t *h) { static_cast<ServerConn *>(h->data)->end_burst(); });
    }
    return;
  }
  c->end_burst();
}

void ServerConn::end_burst() {
  if (in_burst_) {
    in_burst_ = false;
    uv_check_stop(&burst_end_);
  }
  in_read_ = false;
  read_handled();  // (on a connection closed meanwhile too: the words it took still reach their owners)
}

}  // namespace libd
