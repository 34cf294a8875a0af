#include "transports/tcp/tcp_conn.h"

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace libd {

using namespace proto;

namespace {
constexpr size_t kDirectMin = 16 * 1024;
constexpr uint64_t kTickMs = 20;
}  // namespace

void ConnectResult::finish(int r, std::string w, GrantBody g) {
  std::lock_guard<std::mutex> lk(mu);
  if (done) return;
  done = true;
  rc = r;
  why = std::move(w);
  grant = g;
  cv.notify_all();
}

TcpConn::TcpConn(IoLoop *loop, TcpCredentials creds, int64_t timeout_ms, std::shared_ptr<ConnectResult> result,
                 FailFn on_fail)
    : reader_(this), creds_(std::move(creds)), timeout_ms_(timeout_ms), result_(std::move(result)),
      on_fail_(std::move(on_fail)) {}

std::shared_ptr<TcpConn> TcpConn::start(IoLoop *loop, const sockaddr *addr, TcpCredentials creds, int64_t timeout_ms,
                                        std::shared_ptr<ConnectResult> result, FailFn on_fail) {
  std::shared_ptr<TcpConn> keep(new TcpConn(loop, std::move(creds), timeout_ms, std::move(result), std::move(on_fail)));
  TcpConn *c = keep.get();
  c->self_ = keep;
  uv_tcp_init(loop->loop(), &c->tcp_);
  uv_timer_init(loop->loop(), &c->timer_);
  c->tcp_.data = c;
  c->timer_.data = c;
  c->creq_.data = c;
  c->connect_deadline_ = Deadline::after_ms(timeout_ms).at();
  uv_tcp_nodelay(&c->tcp_, 1);
  uv_tcp_keepalive(&c->tcp_, 1, 10);
  uv_timer_start(&c->timer_, [](uv_timer_t *t) { static_cast<TcpConn *>(t->data)->on_tick(); }, kTickMs, kTickMs);
  int rc = uv_tcp_connect(&c->creq_, &c->tcp_, addr, [](uv_connect_t *req, int status) {
    auto *c = static_cast<TcpConn *>(req->data);
    if (c->phase_ == Phase::Closed) return;
    if (status < 0) {
      c->fail(status, std::string("cannot connect to the memory element: ") + uv_strerror(status));
      return;
    }
    c->phase_ = Phase::AwaitChallenge;
    uv_read_start(reinterpret_cast<uv_stream_t *>(&c->tcp_), on_alloc, on_read);
  });
  if (rc < 0) c->fail(rc, std::string("cannot connect to the memory element: ") + uv_strerror(rc));
  return keep;
}

void TcpConn::close(int err, const std::string &why, std::function<void()> done) {
  if (done) {
    if (closes_left_ == 0 && phase_ == Phase::Closed) { done(); return; }  // already fully closed
    closed_ = std::move(done);
  }
  if (phase_ == Phase::Closed) return;
  phase_ = Phase::Closed;
  result_->finish(err, why);
  // Fail what is in flight; operations whose writes are still queued finish in their write
  // callback, which uv_close runs with UV_ECANCELED.
  std::unordered_map<uint64_t, Pending> all;
  all.swap(inflight_);
  for (auto &[id, p] : all) set_error(p.st, err, why);
  for (auto &[id, p] : all) maybe_finish(p.st);
  closes_left_ = 2;
  auto on_closed = [](uv_handle_t *h) {
    auto *c = static_cast<TcpConn *>(h->data);
    if (--c->closes_left_ == 0) {
      auto keep = std::move(c->self_);  // may be the last reference
      auto done = std::move(c->closed_);
      if (done) done();
    }
  };
  uv_close(reinterpret_cast<uv_handle_t *>(&timer_), on_closed);
  uv_close(reinterpret_cast<uv_handle_t *>(&tcp_), on_closed);
}

void TcpConn::fail(int err, const std::string &why) {
  if (phase_ == Phase::Closed) return;
  bool was_ready = phase_ == Phase::Ready;
  // The transport learns first, so a caller woken by its failed operation already sees ERROR.
  if (was_ready && on_fail_) on_fail_(err, why);
  close(err, why);
}

void TcpConn::set_error(const std::shared_ptr<OpState> &st, int err, std::string why) {
  if (st->error == 0) {
    st->error = err;
    st->why = std::move(why);
  }
}

void TcpConn::maybe_finish(const std::shared_ptr<OpState> &st) {
  if (st->finished) return;
  if (st->writes_left > 0) return;  // libuv may still read the caller's buffer
  if (st->error == 0 && st->segs_left > 0) return;
  st->finished = true;
  if (st->error) {
    // Forget the other segments: their answers, if any come, are dropped.
    for (auto it = inflight_.begin(); it != inflight_.end();)
      it = it->second.st == st ? inflight_.erase(it) : std::next(it);
    if (current_id_ && reader_.in_payload() && !inflight_.count(current_id_)) reader_.discard_current();
  }
  if (st->drained) {
    auto d = std::move(st->drained);
    d();
    return;  // detached: the canceller completes the operation
  }
  st->op->complete(st->error, st->why);
}

void TcpConn::submit(const std::shared_ptr<Op> &op) {
  if (phase_ != Phase::Ready) {
    op->complete(-ENOTCONN, "the connection to the memory element is closed");
    return;
  }
  auto st = std::make_shared<OpState>();
  st->op = op;
  st->segs_left = op->segments().size();
  bool is_write = op->kind() == OpKind::Write;
  // The canceller needs the state; it runs on the loop through IoLoop::run_sync.
  for (size_t i = 0; i < op->segments().size(); i++) {
    const Segment &s = op->segments()[i];
    uint64_t id = ++next_id_;
    inflight_[id] = {st, i};
    auto *w = new WriteReq();
    w->conn = this;
    w->st = st;
    Header h;
    h.opcode = is_write ? kWrite : kRead;
    h.req_id = id;
    h.addr = s.raddr;
    h.size = s.size;
    encode_header(h, w->hdr);
    uv_buf_t bufs[2] = {uv_buf_init(w->hdr, kHeaderSize), uv_buf_t{}};
    unsigned n = 1;
    if (is_write) {
      bufs[1].base = s.buf;
      bufs[1].len = size_t(s.size);
      n = 2;
    }
    st->writes_left++;
    send(w, bufs, n);
    if (phase_ == Phase::Closed) return;
  }
}

void TcpConn::send(WriteReq *w, uv_buf_t *bufs, unsigned n) {
  w->req.data = w;
  int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t *>(&tcp_), bufs, n, [](uv_write_t *req, int status) {
    auto *w = static_cast<WriteReq *>(req->data);
    TcpConn *c = w->conn;
    auto st = std::move(w->st);
    delete w;
    if (st) {
      st->writes_left--;
      if (status < 0) c->set_error(st, status == UV_ECANCELED ? -ECONNABORTED : status,
                                   std::string("send failed: ") + uv_strerror(status));
      c->maybe_finish(st);
    }
    if (status < 0 && status != UV_ECANCELED)
      c->fail(-ECONNRESET, std::string("lost the connection to the memory element: ") + uv_strerror(status));
  });
  if (rc < 0) {
    auto st = std::move(w->st);
    delete w;
    if (st) {
      st->writes_left--;
      set_error(st, rc, std::string("send failed: ") + uv_strerror(rc));
    }
    fail(-ECONNRESET, std::string("lost the connection to the memory element: ") + uv_strerror(rc));
    if (st) maybe_finish(st);
  }
}

void TcpConn::detach(Op *op, std::function<void()> drained) {
  std::shared_ptr<OpState> st;
  for (auto &[id, p] : inflight_)
    if (p.st->op.get() == op) { st = p.st; break; }
  if (!st || st->finished) { drained(); return; }
  set_error(st, -ECANCELED, "cancelled");
  st->drained = std::move(drained);
  maybe_finish(st);  // drains now, or when its queued writes are done
}

int TcpConn::on_header(const Header &h, char **dest) {
  switch (phase_) {
    case Phase::AwaitChallenge:
      if (h.opcode != kChallenge || h.size != kNonceSize) return -EPROTO;
      ctl_.assign(kNonceSize, '\0');
      *dest = ctl_.data();
      return 0;
    case Phase::AwaitAuthOk:
      if (h.opcode != kAuthOk) return -EPROTO;
      ctl_.assign(size_t(payload_length(h)), '\0');
      *dest = ctl_.data();
      return 0;
    case Phase::Ready:
      break;
    default:
      return -EPROTO;
  }
  if (h.opcode == kGoodbye || h.opcode == kPong) return 0;
  if (h.opcode != kReadResp && h.opcode != kWriteResp) return -EPROTO;
  current_id_ = h.req_id;
  auto it = inflight_.find(h.req_id);
  if (it == inflight_.end()) return 0;  // a cancelled request: its payload is dropped
  const Segment &s = it->second.st->op->segments()[it->second.seg];
  bool is_read = it->second.st->op->kind() == OpKind::Read;
  if ((h.opcode == kReadResp) != is_read || h.size != s.size) return -EPROTO;
  if (h.opcode == kReadResp && h.status == 0) *dest = s.buf;
  return 0;
}

int TcpConn::on_frame(const Header &h) {
  if (phase_ == Phase::AwaitChallenge) {
    AuthBody a{creds_.grant_id, creds_.client_id, compute_mac(creds_.secret, ctl_, creds_.grant_id, creds_.client_id)};
    auto *w = new WriteReq();
    w->conn = this;
    w->body = encode_auth(a);
    Header ah;
    ah.opcode = kAuth;
    ah.size = w->body.size();
    encode_header(ah, w->hdr);
    uv_buf_t bufs[2] = {uv_buf_init(w->hdr, kHeaderSize), uv_buf_init(w->body.data(), unsigned(w->body.size()))};
    phase_ = Phase::AwaitAuthOk;
    send(w, bufs, 2);
    return 0;
  }
  if (phase_ == Phase::AwaitAuthOk) {
    if (h.status != 0) {
      std::string why = h.status == -EACCES
                            ? "the memory element refused the grant (unknown or revoked grant, wrong secret, or another client's grant)"
                            : std::string("the memory element refused the connection: ") + libd_strerror(h.status);
      close(h.status, why);
      return 0;
    }
    std::string why;
    if (decode_grant(ctl_.data(), ctl_.size(), &grant_, &why)) return -EPROTO;
    phase_ = Phase::Ready;
    result_->finish(0, "", grant_);
    return 0;
  }
  if (h.opcode == kGoodbye) {
    fail(-ECONNRESET, "the memory element closed the connection (grant revoked or server stopping)");
    return 0;
  }
  if (h.opcode == kPong) return 0;
  current_id_ = 0;
  auto it = inflight_.find(h.req_id);
  if (it == inflight_.end()) return 0;
  auto st = it->second.st;
  inflight_.erase(it);
  st->segs_left--;
  if (h.status != 0)
    set_error(st, h.status, std::string("the memory element refused the ") +
                                (h.opcode == kReadResp ? "read" : "write") + ": " + libd_strerror(h.status));
  maybe_finish(st);
  return 0;
}

void TcpConn::on_tick() {
  auto now = Clock::now();
  if (phase_ != Phase::Ready) {
    if (now >= connect_deadline_)
      close(-ETIMEDOUT, "no handshake from the memory element within " + std::to_string(timeout_ms_) + " ms");
    return;
  }
  for (auto &[id, p] : inflight_) {
    if (now >= p.st->op->deadline().at()) {
      fail(-ETIMEDOUT, "no answer from the memory element within " + std::to_string(timeout_ms_) + " ms");
      return;
    }
  }
}

void TcpConn::on_alloc(uv_handle_t *h, size_t, uv_buf_t *buf) {
  auto *c = static_cast<TcpConn *>(h->data);
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

void TcpConn::on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  auto *c = static_cast<TcpConn *>(s->data);
  if (c->phase_ == Phase::Closed) return;
  if (n < 0) {
    c->fail(n == UV_EOF ? -ECONNRESET : int(n),
            n == UV_EOF ? "the memory element closed the connection"
                        : std::string("lost the connection to the memory element: ") + uv_strerror(int(n)));
    return;
  }
  if (n == 0) return;
  std::string why;
  int rc = buf->base == c->staging_ ? c->reader_.feed(buf->base, size_t(n), &why)
                                    : c->reader_.advance_direct(size_t(n), &why);
  if (rc && c->phase_ != Phase::Closed) c->fail(-EPROTO, "protocol error from the memory element: " + why);
}

}  // namespace libd
