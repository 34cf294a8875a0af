#include "server/memory_server.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <array>
#include <deque>
#include <vector>

#include "core/error.h"
#include "libd.h"
#include "proto/auth.h"
#include "proto/frame.h"
#include "server/cm_listener.h"
#include "server/verbs_server.h"
#include "ibv/cm.h"
#include "ibv/record.h"

namespace libd {

using namespace proto;

namespace {
constexpr size_t kStagingSize = 64 * 1024;
constexpr size_t kDirectMin = 16 * 1024;              // payloads this large skip the staging copy
constexpr size_t kMaxAttachments = 4096;             // grants one session may hold at once
constexpr size_t kPauseReadingAt = 64ull << 20;       // queued response bytes before we stop reading
constexpr size_t kResumeReadingAt = 16ull << 20;
constexpr uint64_t kAuthTimeoutMs = 10000;            // a silent client is dropped after this
constexpr const char *kNoVerbs = "this memory server does not serve RDMA verbs (no device on its host, or verbs not enabled)";
}  // namespace

Element::~Element() {
  if (base && !lent) munmap(base, size);
  if (memfd >= 0) close(memfd);
}

// ---- one connection ----------------------------------------------------------------------

// A grant a connection carries. A plain connection carries its AUTH grant only (handle 0); a
// session (proto/frame.h, "Shared connections") any number of them.
struct MemoryServer::Attachment {
  Grant grant;
  std::shared_ptr<Element> element;
  bool notified = false;  // the holder said it finished: its leaving is not a loss
};

class MemoryServer::Conn : public FrameReader::Handler {
 public:
  Conn(MemoryServer *srv, bool is_unix) : srv_(srv), unix_(is_unix), reader_(this) {
    if (unix_) {
      uv_pipe_init(srv->loop_.loop(), &h_.pipe, 0);
    } else {
      uv_tcp_init(srv->loop_.loop(), &h_.tcp);
    }
    h_.handle.data = this;
    uv_timer_init(srv->loop_.loop(), &auth_timer_);
    auth_timer_.data = this;
    srv_->conns_.insert(this);
    srv_->nconns_++;
  }

  uv_stream_t *stream() { return &h_.stream; }
  bool authed() const { return authed_; }

  void start() {
    if (!unix_) {
      uv_tcp_nodelay(&h_.tcp, 1);
      uv_tcp_keepalive(&h_.tcp, 1, 10);
    }
    nonce_ = random_bytes(kNonceSize);
    Header h;
    h.opcode = kChallenge;
    h.size = nonce_.size();
    send_frame(h, nonce_);
    uv_timer_start(&auth_timer_, [](uv_timer_t *t) {
      auto *c = static_cast<Conn *>(t->data);
      if (!c->authed_) c->close();
    }, kAuthTimeoutMs, 0);
    uv_read_start(stream(), on_alloc, on_read);
  }

  // Idempotent; the object deletes itself once both handles are closed.
  void close() {
    if (closing_) return;
    closing_ = true;
    delete batch_;
    batch_ = nullptr;
    srv_->conns_.erase(this);
    srv_->nconns_--;
    verbs_ep_.reset();  // the client's remote key dies with its connection: revocation is immediate
    // Every holder that leaves without having said it finished is lost to its owner, who must not
    // wait for it forever.
    for (auto &[h, a] : atts_) srv_->release_attachment(a.grant.id, unix_, !a.notified);
    atts_.clear();
    for (auto &a : draining_) srv_->release_attachment(a.grant.id, unix_, !a.notified);
    draining_.clear();
    if (!cm_ticket_.empty()) srv_->cm_tickets_.erase(cm_ticket_);
    uv_timer_stop(&auth_timer_);
    pending_closes_ = 2;
    auto done = [](uv_handle_t *h) {
      auto *c = static_cast<Conn *>(h->data);
      if (--c->pending_closes_ == 0) delete c;
    };
    uv_close(reinterpret_cast<uv_handle_t *>(&auth_timer_), done);
    uv_close(&h_.handle, done);
  }

  // The owner ended the grants `pred` picks (revoked, expired, withdrawn): a plain connection
  // closes, a session ends those attachments and tells the client (DETACHED). A session that is
  // still sending such a grant's memory (READ answers queued) closes too: once the owner's call
  // returns, nothing may read that memory any more.
  void cut(const std::function<bool(const Grant &)> &pred, int reason) {
    if (closing_ || !authed_) return;
    std::vector<uint32_t> ended;
    for (auto &[h, a] : atts_)
      if (pred(a.grant)) ended.push_back(h);
    for (auto d = draining_.begin(); d != draining_.end();) {
      if (!pred(d->grant)) { ++d; continue; }
      if (sending(d->element.get())) { close(); return; }  // detached, but its READ answers are still being sent
      srv_->release_attachment(d->grant.id, unix_, false);
      d = draining_.erase(d);
    }
    if (ended.empty()) return;
    if (!session_) { close(); return; }
    for (uint32_t h : ended)
      if (sending(atts_[h].element.get())) { close(); return; }
    for (uint32_t h : ended) {
      if (reader_.in_payload() && reader_.current().opcode == kWrite && payload_handle_ == h) {
        reader_.discard_current();  // the rest of that WRITE is dropped, and refused
        write_status_ = -ECONNRESET;
      }
      srv_->release_attachment(atts_[h].grant.id, unix_, false);  // the owner's own doing: not a loss
      atts_.erase(h);
      Header d;
      d.opcode = kDetached;
      d.addr = h;
      d.status = reason;
      send_frame(d, {});
    }
  }

  // ---- FrameReader::Handler ----
  int on_header(const Header &h, char **dest) override {
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
      case kRead:
      case kPing:
        return (authed_ && !unix_) ? 0 : -EPROTO;
      case kNotify:
        return (authed_ && h.size == 0) ? 0 : -EPROTO;
      case kVerbsConnect:
        if (!authed_ || unix_ || session_ || verbs_ep_ || got_verbs_) return -EPROTO;
        got_verbs_ = true;
        if (!cm_ticket_.empty()) srv_->cm_tickets_.erase(cm_ticket_);  // the client gave up on rdma_cm
        ctl_.assign(size_t(h.size), '\0');
        *dest = ctl_.data();
        return 0;
      case kVerbsCmRequest:
        if (!authed_ || unix_ || session_ || verbs_ep_ || got_verbs_ || got_cm_request_ || h.size != 0) return -EPROTO;
        got_cm_request_ = true;
        return 0;
      case kWrite: {
        if (!authed_ || unix_) return -EPROTO;
        Attachment *a = attachment(h);
        write_status_ = a ? check(*a, h, LIBD_RIGHT_WRITE) : -ECONNRESET;
        payload_handle_ = session_ ? handle_of(h.req_id) : 0;
        *dest = write_status_ == 0 ? a->element->base + h.addr : nullptr;  // refused: drained
        return 0;
      }
      default:
        return -EPROTO;
    }
  }

  int on_frame(const Header &h) override {
    Header r;
    r.req_id = h.req_id;
    switch (h.opcode) {
      case kAuth: return on_auth();
      case kAttach: return on_attach(h);
      case kDetach: {
        auto it = atts_.find(uint32_t(h.addr));
        if (h.addr > UINT32_MAX || it == atts_.end()) return 0;  // ended by the owner meanwhile
        if (sending(it->second.element.get())) {
          // READ answers from its memory are still queued: the grant stays held (the owner's
          // revoke or withdraw waits for this loop) until they are sent.
          draining_.push_back(std::move(it->second));
        } else {
          srv_->release_attachment(it->second.grant.id, unix_, !it->second.notified);
        }
        atts_.erase(it);
        return 0;
      }
      case kVerbsConnect: return on_verbs_connect(h);
      case kVerbsCmRequest: return on_verbs_cm_request(h);
      case kPing:
        r.opcode = kPong;
        send_frame(r, {});
        return 0;
      case kNotify: {
        Attachment *a = attachment(h);
        if (!a) return 0;  // its grant is over: nobody waits for the word any more
        a->notified = true;
        // Told once this read is handled: a DETACH that came with it is counted first, so the
        // owner, woken, ends the grant without a trip to this loop.
        notices_.push_back({a->grant.id, Notice{h.addr, h.status}});
        if (!in_read_) deliver_notices();
        return 0;
      }
      case kWrite:
        r.opcode = kWriteResp;
        r.status = write_status_;
        r.size = h.size;
        send_frame(r, {});
        return 0;
      case kRead: {
        r.opcode = kReadResp;
        Attachment *a = attachment(h);
        r.status = a ? check(*a, h, LIBD_RIGHT_READ) : -ECONNRESET;
        r.size = h.size;
        send_data(r, r.status == 0 ? a->element->base + h.addr : nullptr, r.status == 0 ? a->element : nullptr);
        return 0;
      }
      default:
        return -EPROTO;
    }
  }

 private:
  union Handle {
    uv_handle_t handle;
    uv_stream_t stream;
    uv_tcp_t tcp;
    uv_pipe_t pipe;
  };

  // One uv_write carrying every frame produced while handling one read from the socket: many
  // small answers cost one system call instead of one each.
  struct WriteReq {
    uv_write_t req;
    std::deque<std::array<char, kHeaderSize>> hdrs;  // deque: stable addresses while growing
    std::deque<std::string> bodies;
    std::vector<uv_buf_t> bufs;
    std::vector<std::shared_ptr<Element>> elements;  // keeps READ data mapped until sent
    Conn *conn;
  };

  // The attachment a request names: on a session the top half of its req_id, else the AUTH grant.
  Attachment *attachment(const Header &h) {
    auto it = atts_.find(session_ ? handle_of(h.req_id) : 0);
    return it == atts_.end() ? nullptr : &it->second;
  }

  static int check(const Attachment &a, const Header &h, unsigned need) {
    const Grant &g = a.grant;
    if (!(g.rights & need)) return -EACCES;
    if (h.addr < g.offset || h.size > g.offset + g.length - h.addr || h.addr > g.offset + g.length) return -ERANGE;
    return 0;
  }

  // Checks an AUTH or ATTACH body against the grants and, if it opens one, attaches it as
  // `handle`. 0, or the status to answer (-EACCES for every refusal of the credentials alike: no
  // oracle for grant ids).
  int admit(uint32_t handle, GrantBody *body) {
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
    atts_[handle] = Attachment{g, element, false};
    *body = GrantBody{element->size, g.offset, g.length, g.rights};
    if (unix_ && element->lent) {
      // Lent memory has no memfd: the peer attaches to this process (cross-memory attach).
      body->cma_pid = uint32_t(getpid());
      body->cma_base = uint64_t(uintptr_t(element->base));
      if (session_ && handle == 0) srv_->cma_describe(body);  // where the grant table is
    }
    return 0;
  }

  int on_auth() {
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
    if (unix_ && atts_[0].element->lent) return send_raw(r, payload, -1);
    if (unix_) return send_fd(r, payload);
    send_frame(r, payload);
    return 0;
  }

  int on_attach(const Header &h) {
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

  // A control answer: the body when status is 0, else why (cut to what a control frame holds).
  int answer(const Header &h, Opcode opcode, int status, const std::string &body) {
    Header r;
    r.opcode = opcode;
    r.req_id = h.req_id;
    r.status = status;
    std::string payload = status == 0 ? body : body.substr(0, kMaxControlPayload);
    r.size = payload.size();
    send_frame(r, payload);
    return 0;
  }

  int on_verbs_connect(const Header &h) {
    ibv::Record client, reply;
    std::string why;
    if (ibv::decode_record(ctl_.data(), ctl_.size(), &client, &why)) return answer(h, kVerbsAccept, -EPROTO, why);
    if (!srv_->verbs_) return answer(h, kVerbsAccept, -EPROTONOSUPPORT, kNoVerbs);
    Attachment &a = atts_[0];
    int rc = srv_->verbs_->accept(a.element, a.grant, client, &verbs_ep_, &reply, &why);
    return answer(h, kVerbsAccept, rc, rc == 0 ? ibv::encode_record(reply) : why);
  }

  int on_verbs_cm_request(const Header &h) {
    if (!srv_->cm_)
      return answer(h, kVerbsCmTicket, -EPROTONOSUPPORT,
                    srv_->verbs_ ? "no rdma_cm listener: " + srv_->cm_status_ : std::string(kNoVerbs));
    cm_ticket_ = random_bytes(ibv::kTicketSize);
    srv_->cm_tickets_[cm_ticket_] = this;
    return answer(h, kVerbsCmTicket, 0, ibv::encode_cm_ticket(srv_->cm_->port(), cm_ticket_));
  }

 public:
  // The rdma_cm request that presented this connection's ticket (the ticket is spent).
  void on_cm_connect(rdma_cm_id *id) {
    cm_ticket_.clear();
    std::string why;
    auto it = atts_.find(0);
    if (closing_ || verbs_ep_ || got_verbs_ || it == atts_.end()) {
      CmListener::reject(id, "the connection that asked for this ticket is already connected or closing");
      return;
    }
    got_verbs_ = true;
    if (srv_->verbs_->accept_cm(it->second.element, it->second.grant, id, &verbs_ep_, &why) != 0)
      CmListener::reject(id, why);
  }

 private:
  // Control frames on a unix socket are sent with plain send(): they are small, and the memfd
  // must ride along with SCM_RIGHTS, which libuv streams cannot carry.
  int send_raw(const Header &h, const std::string &body, int fd_to_pass) {
    char buf[kHeaderSize + kMaxControlPayload];
    encode_header(h, buf);
    std::memcpy(buf + kHeaderSize, body.data(), body.size());
    struct iovec iov = {buf, kHeaderSize + body.size()};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(struct cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
    if (fd_to_pass >= 0) {
      msg.msg_control = cbuf;
      msg.msg_controllen = sizeof cbuf;
      struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(c), &fd_to_pass, sizeof(int));
    }
    uv_os_fd_t fd;
    uv_fileno(&h_.handle, &fd);
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n != ssize_t(iov.iov_len)) {
      close();
      return 0;
    }
    return 0;
  }

  int send_fd(const Header &h, const std::string &body) {
    // A read-only grant gets a read-only file description: mmap(PROT_WRITE, MAP_SHARED) on it
    // fails in the client's kernel, whatever the client's code does.
    Attachment &a = atts_[0];
    int fd = a.element->memfd;
    int ro = -1;
    if (!(a.grant.rights & LIBD_RIGHT_WRITE)) {
      std::string path = "/proc/self/fd/" + std::to_string(a.element->memfd);
      ro = open(path.c_str(), O_RDONLY | O_CLOEXEC);
      if (ro < 0) { close(); return 0; }
      fd = ro;
    }
    send_raw(h, body, fd);
    if (ro >= 0) ::close(ro);
    return 0;
  }

  WriteReq *batch() {
    if (!batch_) {
      batch_ = new WriteReq();
      batch_->conn = this;
    }
    return batch_;
  }

  void send_frame(const Header &h, const std::string &body) {
    if (closing_) return;
    if (unix_) { send_raw(h, body, -1); return; }
    WriteReq *w = batch();
    w->hdrs.emplace_back();
    encode_header(h, w->hdrs.back().data());
    w->bufs.push_back(uv_buf_init(w->hdrs.back().data(), kHeaderSize));
    if (!body.empty()) {
      w->bodies.push_back(body);
      w->bufs.push_back(uv_buf_init(w->bodies.back().data(), unsigned(body.size())));
    }
    if (!in_read_) flush();
  }

  void send_data(const Header &h, char *data, const std::shared_ptr<Element> &element) {
    if (closing_) return;
    WriteReq *w = batch();
    w->hdrs.emplace_back();
    encode_header(h, w->hdrs.back().data());
    w->bufs.push_back(uv_buf_init(w->hdrs.back().data(), kHeaderSize));
    if (data && h.size) {
      if (std::find(w->elements.begin(), w->elements.end(), element) == w->elements.end()) {
        w->elements.push_back(element);
        queued_[element.get()]++;  // from the moment it is batched: a DETACH in the same read sees it
      }
      uv_buf_t b;
      b.base = data;
      b.len = size_t(h.size);
      w->bufs.push_back(b);
    }
    if (!in_read_) flush();
  }

  void flush() {
    WriteReq *w = batch_;
    batch_ = nullptr;
    if (!w) return;
    if (closing_) { unqueue(w); delete w; return; }
    w->req.data = w;
    writes_++;
    int rc = uv_write(&w->req, stream(), w->bufs.data(), unsigned(w->bufs.size()), [](uv_write_t *req, int status) {
      auto *w = static_cast<WriteReq *>(req->data);
      Conn *c = w->conn;
      c->unqueue(w);
      delete w;
      c->writes_--;
      if (status < 0) { c->close(); return; }
      if (c->close_after_writes_ && c->writes_ == 0) { c->close(); return; }
      if (c->paused_ && uv_stream_get_write_queue_size(c->stream()) < kResumeReadingAt && !c->closing_) {
        c->paused_ = false;
        uv_read_start(c->stream(), on_alloc, on_read);
      }
    });
    if (rc < 0) {
      writes_--;
      unqueue(w);
      delete w;
      close();
      return;
    }
    // A client that asks faster than it reads stops being read: its queue cannot grow forever.
    if (!paused_ && uv_stream_get_write_queue_size(stream()) > kPauseReadingAt) {
      paused_ = true;
      uv_read_stop(stream());
    }
  }

  static void on_alloc(uv_handle_t *h, size_t, uv_buf_t *buf) {
    auto *c = static_cast<Conn *>(h->data);
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

  static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
    auto *c = static_cast<Conn *>(s->data);
    if (n < 0) { c->close(); return; }
    if (n == 0 || c->closing_ || c->close_after_writes_) return;
    std::string why;
    c->in_read_ = true;
    int rc = buf->base == c->staging_ ? c->reader_.feed(buf->base, size_t(n), &why)
                                      : c->reader_.advance_direct(size_t(n), &why);
    c->in_read_ = false;
    c->flush();
    c->deliver_notices();
    if (rc) c->close();  // a protocol violation ends this connection only
  }

  // True while answers that send `e`'s memory are batched or not yet all handed to the kernel.
  bool sending(const Element *e) const {
    auto it = queued_.find(e);
    return it != queued_.end() && (uv_stream_get_write_queue_size(&h_.stream) > 0 || in_batch(e));
  }
  bool in_batch(const Element *e) const {
    if (!batch_) return false;
    for (auto &x : batch_->elements)
      if (x.get() == e) return true;
    return false;
  }

  // A write is done with its elements: attachments that were detached while it was queued are
  // let go once nothing queued sends their memory any more.
  void unqueue(WriteReq *w) {
    for (auto &e : w->elements) {
      auto it = queued_.find(e.get());
      if (it == queued_.end() || --it->second > 0) continue;
      queued_.erase(it);
      for (auto d = draining_.begin(); d != draining_.end();) {
        if (d->element.get() != e.get()) { ++d; continue; }
        srv_->release_attachment(d->grant.id, unix_, !d->notified);
        d = draining_.erase(d);
      }
    }
  }

  void deliver_notices() {
    auto pending = std::move(notices_);
    notices_.clear();
    for (auto &[grant, n] : pending) srv_->on_notice(grant, n);
  }

  MemoryServer *srv_;
  bool unix_;
  Handle h_;
  uv_timer_t auth_timer_;
  FrameReader reader_;
  std::string nonce_;
  std::string ctl_;
  bool got_auth_ = false, authed_ = false, closing_ = false, paused_ = false, close_after_writes_ = false;
  bool got_verbs_ = false, got_cm_request_ = false;
  bool session_ = false;   // AUTH asked for a shared connection
  uint64_t auth_flags_ = 0;
  std::string cm_ticket_;  // handed out, not yet presented
  std::unique_ptr<VerbsEndpoint> verbs_ep_;  // this client's queue pair and remote key
  bool in_read_ = false;       // answers are batched until the read is handled
  WriteReq *batch_ = nullptr;  // the answers batched so far
  int pending_closes_ = 0;
  int writes_ = 0;
  int write_status_ = 0;
  uint32_t payload_handle_ = 0;  // the attachment the WRITE payload being received is for
  std::unordered_map<uint32_t, Attachment> atts_;
  std::unordered_map<const Element *, int> queued_;  // elements whose memory batched or queued writes send
  std::vector<Attachment> draining_;  // detached while their READ answers were queued: still held
  std::vector<std::pair<std::string, Notice>> notices_;  // NOTIFYs of the read being handled
  char staging_[kStagingSize];
};

// ---- the server --------------------------------------------------------------------------

MemoryServer::MemoryServer() = default;

MemoryServer::~MemoryServer() {
  stop();
  if (cma_table_) munmap(cma_table_, size_t(cma_slots_) * sizeof(CmaSlot));
}

// A seqlock write, one writer (under mu_): seq odd while the fields change, even after.
void MemoryServer::cma_write_locked(int64_t slot, const Grant *g, const char *base) {
  if (!cma_table_ || slot < 0 || slot >= int64_t(cma_slots_)) return;
  CmaSlot *c = &cma_table_[slot];
  uint64_t seq = __atomic_load_n(&c->seq, __ATOMIC_RELAXED);
  __atomic_store_n(&c->seq, seq + 1, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
  if (g) {
    std::string tag = cma_tag(g->secret, g->id, g->client);
    c->base = uint64_t(uintptr_t(base + g->offset));
    c->length = g->length;
    c->rights = g->rights;
    // No tag (hashing failed): the slot stays dead and holders ask the server instead.
    if (tag.size() == sizeof c->tag) std::memcpy(c->tag, tag.data(), sizeof c->tag);
    c->live = tag.size() == sizeof c->tag;
  } else {
    c->live = 0;
    std::memset(c->tag, 0, sizeof c->tag);
    c->base = c->length = 0;
    c->rights = 0;
  }
  __atomic_store_n(&c->seq, seq + 2, __ATOMIC_RELEASE);
}

bool MemoryServer::drop_grant_locked(const std::string &id) {
  auto it = grants_.find(id);
  if (it == grants_.end()) return false;
  if (it->second.slot >= 0) {
    cma_write_locked(it->second.slot, nullptr, nullptr);
    cma_free_.push_back(uint32_t(it->second.slot));
  }
  grants_.erase(it);
  return true;
}

void MemoryServer::cma_describe(GrantBody *body) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!cma_table_) return;
  body->cma_table = uint64_t(uintptr_t(cma_table_));
  body->cma_slots = cma_slots_;
}

size_t MemoryServer::cma_slots_used() {
  std::lock_guard<std::mutex> lk(mu_);
  return cma_table_ ? cma_slots_ - cma_free_.size() : 0;
}

int MemoryServer::add_element(const std::string &name, uint64_t size) {
  if (name.empty() || name.size() > 128) return set_error(-EINVAL, "element name must be 1..128 bytes");
  if (size == 0) return set_error(-EINVAL, "element '" + name + "': size must be > 0");
  std::lock_guard<std::mutex> lk(mu_);
  if (elements_.count(name)) return set_error(-EEXIST, "element '" + name + "' already exists");
  uint64_t used = 0;
  for (auto &[n, e] : elements_) used += e->size;
  if (size > capacity_ - used)
    return set_error(-ENOSPC, "element '" + name + "' of " + std::to_string(size) + " bytes does not fit: " +
                                  std::to_string(capacity_ - used) + " bytes left of " + std::to_string(capacity_));
  auto e = std::make_shared<Element>();
  e->name = name;
  e->size = size;
  e->memfd = memfd_create(("scad-" + name).c_str(), MFD_CLOEXEC);
  if (e->memfd < 0) return set_error(-errno, std::string("memfd_create: ") + strerror(errno));
  // memfds are born mode 0777: anyone holding a read-only descriptor could reopen it writable
  // through /proc/self/fd. 0600 leaves reopening to the server's own uid.
  if (fchmod(e->memfd, 0600) != 0) return set_error(-errno, std::string("fchmod memfd: ") + strerror(errno));
  if (ftruncate(e->memfd, off_t(size)) != 0)
    return set_error(-ENOMEM, "element '" + name + "': cannot size memfd: " + strerror(errno));
  void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, e->memfd, 0);
  if (p == MAP_FAILED) return set_error(-ENOMEM, "element '" + name + "': mmap: " + strerror(errno));
  e->base = static_cast<char *>(p);
  elements_[name] = e;
  return 0;
}

int MemoryServer::add_lent_element(const std::string &name, char *base, uint64_t size) {
  if (name.empty() || name.size() > 128) return set_error(-EINVAL, "element name must be 1..128 bytes");
  if (!base || size == 0) return set_error(-EINVAL, "element '" + name + "': lent memory needs an address and a size > 0");
  std::lock_guard<std::mutex> lk(mu_);
  if (elements_.count(name)) return set_error(-EEXIST, "element '" + name + "' already exists");
  auto e = std::make_shared<Element>();
  e->name = name;
  e->size = size;
  e->base = base;
  e->lent = true;
  elements_[name] = e;
  return 0;
}

int MemoryServer::remove_element(const std::string &name) {
  bool sync = false, async = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!elements_.erase(name)) return set_error(-ENOENT, "no element '" + name + "'");
    std::vector<std::string> gone;
    for (auto &[id, g] : grants_)
      if (g.element == name) gone.push_back(id);
    for (const auto &id : gone) {
      holders_locked(id, &sync, &async);
      drop_notices_locked(id);
      forget_expiry_locked(id);
      drop_grant_locked(id);
    }
  }
  // Connections over which the loop may still move its bytes let go of it before this returns;
  // with none (the holders detached, or only peers on this host, which move the bytes themselves
  // and find their grant gone before their next transfer), nothing on the loop reaches it.
  cut_holders([name](const Grant &g) { return g.element == name; }, -ECANCELED, sync, async);
  return 0;
}

uint64_t MemoryServer::used_bytes() {
  std::lock_guard<std::mutex> lk(mu_);
  uint64_t used = 0;
  for (auto &[n, e] : elements_) used += e->size;
  return used;
}

int MemoryServer::grant(Grant *g) {
  if (g->client.empty()) return set_error(-EINVAL, "grant: client must be an action id or '*'");
  if (g->rights == 0 || g->rights > 3) return set_error(-EINVAL, "grant: rights must be read, write or both");
  std::lock_guard<std::mutex> lk(mu_);
  auto it = elements_.find(g->element);
  if (it == elements_.end()) return set_error(-ENOENT, "grant: no element '" + g->element + "'");
  uint64_t size = it->second->size;
  if (g->length == 0 && g->offset <= size) g->length = size - g->offset;  // to the end
  if (g->offset > size || g->length > size - g->offset)
    return set_error(-ERANGE, "grant: range [" + std::to_string(g->offset) + ", +" + std::to_string(g->length) +
                                  ") is outside element '" + g->element + "' of " + std::to_string(size) + " bytes");
  // A grant on a whole lent element gets a slot in the table for peers on this host (if there is
  // one, and a slot free), named in the id the server makes up.
  int64_t slot = -1;
  std::string fresh = random_bytes(40);  // one system call: 8 bytes of id, 32 of secret
  if (g->id.empty() && cma_table_ && !cma_free_.empty() && it->second->lent && g->offset == 0 && g->length == size) {
    slot = cma_free_.back();
    g->id = "g" + to_hex(fresh.substr(0, 8)) + "_" + std::to_string(slot);
  }
  if (g->id.empty()) g->id = "g" + to_hex(fresh.substr(0, 8));
  if (g->secret.empty()) g->secret = to_hex(fresh.substr(8));
  for (char c : g->id)
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_')
      return set_error(-EINVAL, "grant id may hold letters, digits, '-' and '_' only");
  if (g->id.size() > 64 || g->secret.size() < 32 || g->secret.size() > 256)
    return set_error(-EINVAL, "grant: id up to 64 bytes, secret 32..256 bytes");
  if (grants_.count(g->id) || notices_.count(g->id)) return set_error(-EEXIST, "grant '" + g->id + "' already exists");
  g->slot = slot;
  if (slot >= 0) {
    cma_free_.pop_back();
    cma_write_locked(slot, g, it->second->base);
  }
  grants_[g->id] = *g;
  notices_[g->id] = Notices();
  if (g->ttl_ms && !stopped_) {
    auto at = std::chrono::steady_clock::now() + std::chrono::milliseconds(g->ttl_ms);
    expiry_of_[g->id] = expiry_q_.emplace(at, g->id);
    // The loop's timer is set for the earliest expiry; only a grant that expires sooner moves it
    // (posted, not waited for: this may even run on the loop thread).
    if (at < armed_for_) {
      armed_for_ = at;
      loop_.post([this] { arm_expiry(); });
    }
  }
  return 0;
}

int MemoryServer::revoke(const std::string &grant_id) {
  bool sync = false, async = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    bool had = drop_grant_locked(grant_id);
    auto it = notices_.find(grant_id);
    if ((it == notices_.end() || it->second.dropped) && !had) return set_error(-ENOENT, "no grant '" + grant_id + "'");
    drop_notices_locked(grant_id);  // an expired grant's record goes here too
    forget_expiry_locked(grant_id);
    holders_locked(grant_id, &sync, &async);
  }
  cut_holders([grant_id](const Grant &g) { return g.id == grant_id; }, -ECANCELED, sync, async);
  return 0;
}

void MemoryServer::forget_expiry_locked(const std::string &grant_id) {
  auto it = expiry_of_.find(grant_id);
  if (it == expiry_of_.end()) return;
  expiry_q_.erase(it->second);  // the timer, if it was set for this one, finds nothing due and moves on
  expiry_of_.erase(it);
}

void MemoryServer::arm_expiry() {
  std::chrono::steady_clock::time_point next;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopped_) return;
    next = expiry_q_.empty() ? std::chrono::steady_clock::time_point::max() : expiry_q_.begin()->first;
    armed_for_ = next;
  }
  if (!expiry_timer_) {
    expiry_timer_ = new uv_timer_t;
    uv_timer_init(loop_.loop(), expiry_timer_);
    expiry_timer_->data = this;
  }
  if (next == std::chrono::steady_clock::time_point::max()) {
    uv_timer_stop(expiry_timer_);
    return;
  }
  uv_update_time(loop_.loop());
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next - std::chrono::steady_clock::now()).count() + 1;
  uv_timer_start(expiry_timer_, [](uv_timer_t *t) { static_cast<MemoryServer *>(t->data)->on_expiry_timer(); },
                 uint64_t(std::max<int64_t>(left, 1)), 0);
}

void MemoryServer::on_expiry_timer() {
  std::vector<std::string> expired;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto now = std::chrono::steady_clock::now();
    while (!expiry_q_.empty() && expiry_q_.begin()->first <= now) {
      std::string id = expiry_q_.begin()->second;
      expiry_q_.erase(expiry_q_.begin());
      expiry_of_.erase(id);
      if (!drop_grant_locked(id)) continue;
      end_notices_locked(id, -EKEYEXPIRED);
      if (attached_.count(id)) expired.push_back(id);
    }
  }
  for (const auto &id : expired) cut_locked_loop([&](const Grant &g) { return g.id == id; }, -EKEYEXPIRED);
  arm_expiry();
}

void MemoryServer::drop_notices_locked(const std::string &grant_id) {
  auto it = notices_.find(grant_id);
  if (it == notices_.end()) return;
  wake_locked(it->second);  // before it goes: its watchers learn the grant is over
  // ...and never hear of it again: their eventfds may be closed and their numbers reused once
  // the owner learns the grant is gone, while a waiter still keeps the record.
  it->second.watchers.clear();
  if (it->second.waiters > 0) {
    it->second.ended = -ECANCELED;  // the last waiter, once told, erases it
    it->second.dropped = true;
  } else {
    notices_.erase(it);
  }
  notices_cv_.notify_all();
}

void MemoryServer::wake_locked(Notices &n) {
  notices_cv_.notify_all();
  uint64_t one = 1;
  for (int fd : n.watchers) {
    ssize_t w = ::write(fd, &one, sizeof one);
    (void)w;  // EAGAIN: the counter is non-zero already, the watcher wakes anyway
  }
}

int MemoryServer::watch_notify(const std::string &grant_id, int fd, bool add) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = notices_.find(grant_id);
  if (it == notices_.end() || (add && it->second.dropped))
    return set_error(-ENOENT, "no grant '" + grant_id + "' (never granted, or revoked)");
  auto &w = it->second.watchers;
  w.erase(std::remove(w.begin(), w.end(), fd), w.end());
  if (add) {
    w.push_back(fd);
    // Something wait_notify would say already: the watcher hears it at once.
    if (!it->second.queue.empty() || it->second.lost || it->second.ended) wake_locked(it->second);
  }
  return 0;
}

void MemoryServer::end_notices_locked(const std::string &grant_id, int err) {
  auto it = notices_.find(grant_id);
  if (it != notices_.end() && it->second.ended == 0) it->second.ended = err;
  if (it != notices_.end()) wake_locked(it->second);
  notices_cv_.notify_all();
}

void MemoryServer::on_notice(const std::string &grant_id, const Notice &n) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = notices_.find(grant_id);
  if (it == notices_.end() || it->second.dropped) return;  // revoked: nobody is told any more
  it->second.queue.push_back(n);
  wake_locked(it->second);
}

int MemoryServer::take_attachment(const Grant &g, bool is_unix, bool session, std::shared_ptr<Element> *element) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!grants_.count(g.id)) return -EACCES;  // revoked or expired since it was found
  auto e = elements_.find(g.element);
  if (e == elements_.end()) return -ENOENT;
  if (is_unix && (g.offset != 0 || (g.length != 0 && g.length != e->second->size))) {
    // shm hands the client the element's whole memfd (or whole lent range): a grant on part of
    // an element can be honoured only where the server checks every access (tcp, verbs).
    return -EPERM;
  }
  if (is_unix && session && !e->second->lent) return -EOPNOTSUPP;  // a memfd cannot ride a shared socket's frames
  Held &held = attached_[g.id];
  (is_unix ? held.unix_ : held.tcp)++;
  *element = e->second;
  return 0;
}

void MemoryServer::release_attachment(const std::string &grant_id, bool is_unix, bool lost) {
  std::lock_guard<std::mutex> lk(mu_);
  auto a = attached_.find(grant_id);
  if (a != attached_.end()) {
    (is_unix ? a->second.unix_ : a->second.tcp)--;
    if (a->second.tcp == 0 && a->second.unix_ == 0) attached_.erase(a);
  }
  if (!lost) return;
  auto it = notices_.find(grant_id);
  if (it == notices_.end() || it->second.ended) return;  // closed by revoke/expiry, not by the holder
  it->second.lost++;
  wake_locked(it->second);
}

int MemoryServer::wait_notify(const std::string &grant_id, Notice *out, int timeout_ms) {
  std::unique_lock<std::mutex> lk(mu_);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms < 0 ? 0 : timeout_ms);
  auto first = notices_.find(grant_id);
  if (first == notices_.end() || first->second.dropped)
    return set_error(-ENOENT, "no grant '" + grant_id + "' (never granted, or revoked)");
  first->second.waiters++;
  // The record outlives this wait (map nodes are stable); a revoked one goes with its last waiter.
  Notices &n = first->second;
  auto leave = [&](int rc) {
    if (--n.waiters == 0 && n.dropped) notices_.erase(grant_id);
    return rc;
  };
  while (true) {
    if (!n.queue.empty()) {
      *out = n.queue.front();
      n.queue.pop_front();
      return leave(0);
    }
    if (n.lost > 0) {
      n.lost--;
      return leave(set_error(-ECONNRESET, "a holder of grant '" + grant_id +
                                              "' closed its connection without saying it finished (it died or gave up)"));
    }
    if (n.ended == -EKEYEXPIRED) return leave(set_error(-EKEYEXPIRED, "grant '" + grant_id + "' expired"));
    if (n.ended) return leave(set_error(n.ended, "grant '" + grant_id + "' was revoked or its server stopped"));
    if (timeout_ms < 0) {
      notices_cv_.wait(lk);
    } else if (timeout_ms == 0 || notices_cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
      // (A zero timeout only looks: a timed wait that is already over still sleeps out the
      // kernel's timer slack, some 50 us.)
      // One last look: a notice that raced the deadline is still delivered.
      if (!n.queue.empty() || n.lost > 0 || n.ended) continue;
      return leave(set_error(-ETIMEDOUT, "no word from the holder of grant '" + grant_id + "' within " +
                                             std::to_string(timeout_ms) + " ms"));
    }
  }
}

void MemoryServer::cut_locked_loop(const std::function<bool(const Grant &)> &pred, int reason) {
  std::vector<Conn *> all(conns_.begin(), conns_.end());  // cut() may close (and unlist) one
  for (Conn *c : all) c->cut(pred, reason);
}

void MemoryServer::cut(const std::function<bool(const Grant &)> &pred, int reason) {
  loop_.run_sync([&] { cut_locked_loop(pred, reason); });
}

void MemoryServer::cut_holders(std::function<bool(const Grant &)> pred, int reason, bool sync, bool async) {
  if (sync) cut(pred, reason);
  else if (async) loop_.post([this, pred = std::move(pred), reason] { cut_locked_loop(pred, reason); });
}

std::shared_ptr<Element> MemoryServer::find_element(const std::string &name) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = elements_.find(name);
  return it == elements_.end() ? nullptr : it->second;
}

bool MemoryServer::find_grant(const std::string &id, Grant *out) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = grants_.find(id);
  if (it == grants_.end()) return false;
  *out = it->second;
  return true;
}

size_t MemoryServer::connections() { return nconns_.load(); }

size_t MemoryServer::holders(const std::string &grant_id) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = attached_.find(grant_id);
  return it == attached_.end() ? 0 : size_t(it->second.tcp + it->second.unix_);
}

int MemoryServer::listen_tcp(const std::string &host, uint16_t port, uint16_t *bound) {
  int rc = 0;
  std::string why;
  loop_.run_sync([&] {
    if (tcp_listener_) { rc = -EALREADY; why = "already listening on tcp"; return; }
    struct sockaddr_storage addr;
    if (uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in *>(&addr)) != 0 &&
        uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6 *>(&addr)) != 0) {
      rc = -EINVAL;
      why = "'" + host + "' is not an IPv4 or IPv6 address";
      return;
    }
    auto *l = new uv_tcp_t;
    uv_tcp_init(loop_.loop(), l);
    l->data = this;
    if ((rc = uv_tcp_bind(l, reinterpret_cast<sockaddr *>(&addr), 0)) == 0)
      rc = uv_listen(reinterpret_cast<uv_stream_t *>(l), 128, [](uv_stream_t *ls, int status) {
        if (status < 0) return;
        auto *srv = static_cast<MemoryServer *>(ls->data);
        auto *c = new Conn(srv, false);
        if (uv_accept(ls, c->stream()) == 0) c->start();
        else c->close();
      });
    if (rc < 0) {
      why = "cannot listen on " + host + ":" + std::to_string(port) + ": " + uv_strerror(rc);
      uv_close(reinterpret_cast<uv_handle_t *>(l), [](uv_handle_t *h) { delete reinterpret_cast<uv_tcp_t *>(h); });
      return;
    }
    struct sockaddr_storage name;
    int len = sizeof name;
    uv_tcp_getsockname(l, reinterpret_cast<sockaddr *>(&name), &len);
    tcp_port_ = ntohs(name.ss_family == AF_INET ? reinterpret_cast<sockaddr_in *>(&name)->sin_port
                                                : reinterpret_cast<sockaddr_in6 *>(&name)->sin6_port);
    tcp_host_ = host;
    tcp_listener_ = l;
    start_cm();
  });
  if (rc) return set_error(rc, why);
  if (bound) *bound = tcp_port_;
  return 0;
}

int MemoryServer::listen_unix(const std::string &path) {
  if (path.empty() || path.size() >= sizeof(sockaddr_un::sun_path))
    return set_error(-EINVAL, "unix socket path must be 1.." + std::to_string(sizeof(sockaddr_un::sun_path) - 1) + " bytes");
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return set_error(-EEXIST, "'" + path + "' exists and is not a socket");
    unlink(path.c_str());  // a stale socket from a previous server
  }
  int rc = 0;
  std::string why;
  loop_.run_sync([&] {
    if (unix_listener_) { rc = -EALREADY; why = "already listening on a unix socket"; return; }
    auto *l = new uv_pipe_t;
    uv_pipe_init(loop_.loop(), l, 0);
    l->data = this;
    if ((rc = uv_pipe_bind(l, path.c_str())) == 0) {
      chmod(path.c_str(), 0660);
      rc = uv_listen(reinterpret_cast<uv_stream_t *>(l), 128, [](uv_stream_t *ls, int status) {
        if (status < 0) return;
        auto *srv = static_cast<MemoryServer *>(ls->data);
        auto *c = new Conn(srv, true);
        if (uv_accept(ls, c->stream()) == 0) c->start();
        else c->close();
      });
    }
    if (rc < 0) {
      why = "cannot listen on '" + path + "': " + uv_strerror(rc);
      uv_close(reinterpret_cast<uv_handle_t *>(l), [](uv_handle_t *h) { delete reinterpret_cast<uv_pipe_t *>(h); });
      return;
    }
    unix_listener_ = l;
    unix_path_ = path;
  });
  if (rc) return set_error(rc, why);
  std::lock_guard<std::mutex> lk(mu_);
  if (!cma_table_) {
    constexpr uint32_t kSlots = 4096;
    void *p = mmap(nullptr, size_t(kSlots) * sizeof(CmaSlot), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {  // without one, peers on this host ask (ATTACH) as they do elsewhere
      cma_table_ = static_cast<CmaSlot *>(p);
      cma_slots_ = kSlots;
      for (uint32_t i = kSlots; i-- > 0;) cma_free_.push_back(i);
    }
  }
  return 0;
}

int MemoryServer::enable_verbs(const Params &params) {
  std::string cm = params.get_or("cm", "1");
  if (cm != "0" && cm != "1") return set_error(-EINVAL, "parameter 'cm' must be 0 or 1");
  std::unique_ptr<VerbsServer> v;
  if (int rc = VerbsServer::create(params, &v)) return rc;
  loop_.run_sync([&] {
    verbs_ = std::move(v);
    cm_wanted_ = cm == "1";
    if (!cm_wanted_) cm_status_ = "turned off (cm,0)";
    start_cm();
  });
  return 0;
}

void MemoryServer::start_cm() {
  if (cm_ || !verbs_ || !tcp_listener_ || !cm_wanted_ || stopped_) return;
  int rc = CmListener::create(loop_.loop(), tcp_host_,
                              [this](rdma_cm_id *id, const std::string &ticket) { on_cm_request(id, ticket); }, &cm_);
  if (rc) cm_status_ = last_error();
}

void MemoryServer::on_cm_request(rdma_cm_id *id, const std::string &ticket) {
  auto it = cm_tickets_.find(ticket);
  if (it == cm_tickets_.end()) {
    CmListener::reject(id, "unknown or spent ticket: ask for one on an authenticated control connection");
    return;
  }
  Conn *c = it->second;
  cm_tickets_.erase(it);
  c->on_cm_connect(id);
}

uint16_t MemoryServer::cm_port() {
  uint16_t port = 0;
  loop_.run_sync([&] { port = cm_ ? cm_->port() : 0; });
  return port;
}

std::string MemoryServer::verbs_description() {
  if (!verbs_) return "";
  std::string cm;  // cm_ and cm_status_ belong to the loop thread (set when listening, reset at stop)
  loop_.run_sync([&] { cm = cm_ ? ", rdma_cm port " + std::to_string(cm_->port()) : ", no rdma_cm (" + cm_status_ + ")"; });
  return verbs_->describe() + cm;
}

std::string MemoryServer::client_config(const Grant &g) const {
  std::string s;
  if (tcp_listener_) s += "host," + tcp_host_ + ";port," + std::to_string(tcp_port_) + ";";
  if (unix_listener_) s += "path," + unix_path_ + ";";
  s += "grant," + g.id + ";secret," + g.secret;
  return s;
}

void MemoryServer::stop() {
  loop_.run_sync([&] {
    {
      std::lock_guard<std::mutex> lk(mu_);  // grant() reads it under mu_
      if (stopped_) return;
      stopped_ = true;
    }
    if (tcp_listener_)
      uv_close(reinterpret_cast<uv_handle_t *>(tcp_listener_), [](uv_handle_t *h) { delete reinterpret_cast<uv_tcp_t *>(h); });
    if (unix_listener_)
      uv_close(reinterpret_cast<uv_handle_t *>(unix_listener_), [](uv_handle_t *h) { delete reinterpret_cast<uv_pipe_t *>(h); });
    tcp_listener_ = nullptr;
    unix_listener_ = nullptr;
    std::vector<Conn *> all(conns_.begin(), conns_.end());
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto &[id, n] : notices_) {
        if (!n.ended) n.ended = -ECANCELED;  // the closings below are not losses
        wake_locked(n);
      }
      notices_cv_.notify_all();
    }
    for (Conn *c : all) c->close();
    {
      std::lock_guard<std::mutex> lk(mu_);
      expiry_q_.clear();
      expiry_of_.clear();
      for (auto &[id, g] : grants_)  // the grants stay for the owner to revoke; peers can no longer use them
        if (g.slot >= 0) cma_write_locked(g.slot, nullptr, nullptr);
    }
    if (expiry_timer_)
      uv_close(reinterpret_cast<uv_handle_t *>(expiry_timer_), [](uv_handle_t *h) { delete reinterpret_cast<uv_timer_t *>(h); });
    expiry_timer_ = nullptr;
    cm_.reset();  // after the connections: their endpoints own identifiers on its channel
  });
  if (!unix_path_.empty()) unlink(unix_path_.c_str());
  unix_path_.clear();
  // Let the close callbacks run before the loop (a member) is destroyed.
  loop_.run_sync([] {});
}

}  // namespace libd
