#include "transports/tcp/tcp_conn.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "io/sockio.h"
#include "proto/client_handshake.h"

namespace libd {

using namespace proto;

namespace {
constexpr size_t kDirectMin = 16 * 1024;  // payloads this large are received straight into place
constexpr uint64_t kTickMs = 20;          // deadline check period while the loop has work
// How long the shared client loop stays with a caller that polls after its last look: past it the
// loop's thread takes it back, so a caller that stopped without saying so delays others this much.
// A millisecond outlasts the gap between one operation and the next of a Python caller (a
// scad.connect operation of 1 MiB spends 200 µs in Python between its transfers): with 200 µs
// the lease lapsed in that gap, and the next operation had to wake the loop's thread to park it
// again (two wake-ups an operation, 15-60 µs of each on two cores).
std::atomic<uint32_t> lease_after_look_us{1000};

// When this thread last polled an operation (steady clock, ns; 0: never). A thread that looks
// again within a lease is polling: a single look (a status check) must not park the loop's
// thread, which would then serve nobody until the lease lapsed.
thread_local int64_t last_look_ns = 0;

// Stamps this thread's look; true if it looked before within the lease.
bool look_again(uint32_t lease_us) {
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
  bool polling = now - last_look_ns < int64_t(lease_us) * 1000;
  last_look_ns = now;
  return polling;
}
}  // namespace

// ---- set-up -------------------------------------------------------------------------------

TcpConn::TcpConn(int fd, FailFn on_fail) : fd_(fd), on_fail_(std::move(on_fail)), frames_(this) {}

TcpConn::~TcpConn() { ::close(fd_); }

int TcpConn::open(const sockaddr *addr, socklen_t len, const TcpCredentials &creds, Deadline deadline, FailFn on_fail,
                  std::shared_ptr<TcpConn> *out, GrantBody *grant, bool session) {
  int fd;
  std::string nonce;
  if (int rc = connect_authenticated(addr, len, creds, deadline, &fd, grant, session ? kAuthSession : 0, &nonce))
    return rc;
  std::shared_ptr<TcpConn> conn(new TcpConn(fd, std::move(on_fail)));
  conn->session_ = session;
  conn->nonce_ = std::move(nonce);
  conn->start_watch();
  *out = std::move(conn);
  return 0;
}

void TcpConn::start_watch() {
  IoLoop &loop = IoLoop::shared();
  loop.run_sync([&] {
    poll_ = new uv_poll_t;
    uv_poll_init_socket(loop.loop(), poll_, fd_);
    poll_->data = this;
    timer_ = new uv_timer_t;
    uv_timer_init(loop.loop(), timer_);
    timer_->data = this;
    update_watch();
  });
}

// ---- operations ---------------------------------------------------------------------------

std::shared_ptr<TcpConn::OpState> TcpConn::enqueue_locked(const std::shared_ptr<Op> &op, uint32_t handle) {
  auto st = std::make_shared<OpState>();
  st->op = op;
  st->handle = handle;
  st->segs_left = op->segments().size();
  st->posted = Clock::now();
  unfinished_[handle]++;
  bool is_write = op->kind() == OpKind::Write;
  for (size_t i = 0; i < op->segments().size() && !closed_; i++) {
    const Segment &s = op->segments()[i];
    uint64_t id = with_handle(handle, ++next_id_);
    inflight_[id] = {st, i};
    Header h;
    h.opcode = is_write ? kWrite : kRead;
    h.req_id = id;
    h.addr = s.raddr;
    h.size = s.size;
    char hdr[kHeaderSize];
    encode_header(h, hdr);
    queue_locked(hdr, is_write ? s.buf : nullptr, is_write ? size_t(s.size) : 0, st);
  }
  // A batch goes out in one system call (with what a SendBatch open on this thread adds behind
  // it, when the batch ends). If the kernel could not take everything, the loop sends the rest
  // when the socket is writable again.
  if (!closed_ && !SendBatch::defer(shared_from_this()) && !flush_locked()) want_loop_locked();
  return st;
}

void TcpConn::flush_batched() {
  Lock lk(mu_);
  if (!closed_ && !sendq_.empty() && !flush_locked()) want_loop_locked();
}

bool TcpConn::refused_locked(uint32_t handle, const std::shared_ptr<Op> &op) {
  if (closed_) {
    op->complete(-ENOTCONN, "the connection to the memory element is closed (" + close_why_ + ")");
    return true;
  }
  auto it = ended_.find(handle);
  if (it == ended_.end()) return false;
  op->complete(it->second.first, it->second.second);
  return true;
}

void TcpConn::post(const std::shared_ptr<Op> &op, uint32_t handle) {
  Lock lk(mu_);
  if (refused_locked(handle, op)) return;
  enqueue_locked(op, handle);
  if (reader_ == Reader::None) {
    reader_ = Reader::Loop;
    // A session the loop reads already, whose deadline tick still runs and whose request went out
    // whole, needs nothing of the loop: waking it would cost a thread switch per operation.
    if (!(ticking_ && (watching_ & UV_READABLE) && sendq_.empty())) want_loop_locked();
  }
}

template <class Done>
bool TcpConn::lead_locked(Lock &lk, Done done, Deadline deadline, uint32_t spin_us, const uint32_t *keep_for) {
  reader_ = Reader::Leader;
  auto spin_until = Clock::now() + std::chrono::microseconds(spin_us);
  bool in_time = true, leased = false;
  // Only where the loop's thread watches this socket for answers (a session, or operations left
  // to it) is there a wake-up to spare it; elsewhere the lease would only park it for nothing.
  bool lease = session_ || (watching_ & UV_READABLE);
  while (!done() && !closed_) {
    short events = short(POLLIN | (sendq_.empty() ? 0 : POLLOUT));
    auto now = Clock::now();
    int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at() - now).count();
    if (left <= 0) {
      in_time = false;
      break;
    }
    bool spinning = now < spin_until;
    lk.unlock();  // the loop's callbacks (progress below) take mu_
    if (spinning && lease) {
      // The answer is this thread's to read: the process's client loop, which may be watching
      // this socket too, is leased here meanwhile, so its thread stays parked and is not woken
      // by the answer only to find a leader reading it (a thread switch per answer on a busy
      // host). Given back before this thread sleeps; else it lapses as a poller's does.
      IoLoop::shared().progress(lease_after_look_us.load(std::memory_order_relaxed));
      leased = true;
    } else if (leased) {
      IoLoop::shared().release();
      leased = false;
    }
    struct pollfd p = {fd_, events, 0};
    // While the spin lasts, only look; then sleep until the socket moves.
    int r = ::poll(&p, 1, spinning ? 0 : int(std::min<int64_t>(left, 1000)));
    // A look that found nothing gives the core to whatever else is ready to run on it first: on a
    // host with fewer cores than busy threads, that may be the very server this caller waits for
    // (one on this host, its thread queued behind this one), which a poller that never yields
    // would hold off until the spin ran out. On an idle core the yield returns at once.
    if (r == 0 && spinning) sched_yield();
    lk.lock();
    if (r < 0 && errno != EINTR) {
      fail_locked(-errno, std::string("poll: ") + strerror(errno), true);
      break;
    }
    if (r > 0 && (p.revents & POLLOUT)) flush_locked();
    if (r > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR))) read_locked();
  }
  if (reader_ == Reader::Leader) {
    reader_ = idle_locked() ? Reader::None : Reader::Loop;  // hand the rest to the loop
    // A session's loop reads while nobody else does (the owner may end a grant at any time):
    // it stopped while this thread led.
    bool rewatch = session_ && !(watching_ & UV_READABLE);
    if (reader_ == Reader::Loop || !sendq_.empty() || rewatch) want_loop_locked();
    // Other threads' operations are the loop's now, and their waiters may sleep without a look
    // that would end the lease: the loop's thread takes over at once. Only this caller's own,
    // which it reads next, keep the lease (if it does not, the lease lapses within a lease).
    bool only_mine = keep_for && (unfinished_.empty() || (unfinished_.size() == 1 && unfinished_.count(*keep_for)));
    if (leased && !only_mine && (reader_ == Reader::Loop || !sendq_.empty())) {
      lk.unlock();
      IoLoop::shared().release();
      lk.lock();
    }
  }
  cv_.notify_all();  // an attacher waiting for someone to read may lead now
  return in_time;
}

void TcpConn::run(const std::shared_ptr<Op> &op, uint32_t handle, uint32_t spin_us) {
  Lock lk(mu_);
  if (refused_locked(handle, op)) return;
  // A transfer of any size is led: handing a large one to the loop's thread costs that thread's
  // wake-up, and its sleeps while the socket drains, on top of the copy (measured against the
  // loop over 64 KiB: 256 KiB writes 83-132 µs -> 51, 1 MiB 259-329 -> 186-221, 4 and 16 MiB
  // writes and reads 10-20% faster; only 1 MiB reads slower, 201-215 -> 256-271).
  if (reader_ != Reader::None || !sendq_.empty()) {
    // Someone else is driving the socket: the loop completes us. This caller sleeps until then
    // without a look of its own, so a lease on the loop (a poller's or a leader's, which takes it
    // again at its next look) is ended: else it would wait it out.
    lk.unlock();
    post(op, handle);
    IoLoop::shared().release();  // (nothing, when there is no lease)
    return;
  }
  auto st = enqueue_locked(op, handle);
  if (!lead_locked(lk, [&] { return st->finished; }, op->deadline(), spin_us)) expire_locked(st);
}

void TcpConn::cancel(Op *op) {
  Lock lk(mu_);
  std::shared_ptr<OpState> st;
  for (auto &[id, p] : inflight_)
    if (p.st->op.get() == op) { st = p.st; break; }
  if (!st)
    for (auto &c : sendq_)
      if (c.st && c.st->op.get() == op) { st = c.st; break; }
  if (!st || st->finished) return;
  st->detached = true;
  op_error(st, -ECANCELED, "cancelled");
  if (st->queued_sends > 0) {
    // Its bytes are queued and part may be on the wire: the stream needs them whole. Wait until
    // they are sent (the deadline closes the connection if the peer never takes them), by the
    // loop's thread: a poller's lease, which would park it meanwhile, ends.
    want_loop_locked();
    IoLoop::shared().release();
    cv_.wait(lk, [&] { return st->queued_sends == 0 || closed_; });
  }
  maybe_finish_locked(st);
}

TcpConn::Lock TcpConn::lock_on_loop() {
  Lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) {
    loop_waiting_.fetch_add(1, std::memory_order_relaxed);
    lk.lock();
    loop_waiting_.fetch_sub(1, std::memory_order_relaxed);
  }
  return lk;
}

void TcpConn::progress(Op *) {
  // The loop's thread waits for the lock (it took an answer as this caller began to poll): it is
  // left to it. Taken look after look instead, the lock would wake that thread each time this
  // caller let go of it, only for the thread to lose it again to the next look.
  if (loop_waiting_.load(std::memory_order_relaxed) > 0) return;
  Lock lk(mu_, std::try_to_lock);
  if (!lk.owns_lock() || closed_ || reader_ == Reader::Leader) return;  // someone else is at it
  if (!sendq_.empty()) flush_locked();
  read_locked();
  // (The loop, which was reading, notices on its next wake-up that nothing is due any more.)
}

void TcpConn::poll_progress(Op *waiting) {
  looked(waiting);
  progress(waiting);
}

void TcpConn::looked(Op *) {
  // Called for every look, at an operation finished or not. A finished one counts too: the loop's
  // thread, awake, may have taken its answer before this poller's look, and would take the next
  // ones as well, woken for each, while the poller only found its operations finished. A look
  // within a lease runs the loop, so that a caller polling only finished operations (a reaper)
  // serves the process's other operations instead of holding them up. No lock held here: the
  // loop's callbacks take mu_.
  uint32_t lease_us = lease_after_look_us.load(std::memory_order_relaxed);
  if (look_again(lease_us)) IoLoop::shared().progress(lease_us);
}

void TcpConn::polling_stopped() { IoLoop::shared().release(); }

void TcpConn::wait_polled(Op *) {
  bool sleeper = false;
  {
    Lock lk(mu_);
    for (auto &[id, p] : inflight_)
      if (!p.st->finished && p.st->op->waited_for_asleep()) { sleeper = true; break; }
  }
  if (sleeper) IoLoop::shared().release();
}

void TcpConn::set_poll_lease_us(uint32_t us) { lease_after_look_us.store(us, std::memory_order_relaxed); }

uint32_t TcpConn::poll_lease_us() { return lease_after_look_us.load(std::memory_order_relaxed); }

int TcpConn::notify(uint64_t value, int status, uint32_t handle, bool detach) {
  Lock lk(mu_);
  if (closed_) return set_error(-ENOTCONN, "the connection to the memory element is closed (" + close_why_ + ")");
  auto ended = ended_.find(handle);
  if (ended != ended_.end()) return set_error(ended->second.first, ended->second.second);
  // A state with no operation and nothing to wait for: it only keeps the chunk's accounting
  // (detached: nobody completes it).
  auto st = std::make_shared<OpState>();
  st->detached = true;
  char hdr[kHeaderSize];
  encode_notify(value, status, hdr, handle);
  queue_locked(hdr, nullptr, 0, st);
  if (detach && session_) detach_behind_locked(handle, st);
  if (!SendBatch::defer(shared_from_this()) && !flush_locked()) want_loop_locked();
  if (closed_) return set_error(close_err_, "the connection to the memory element is closed (" + close_why_ + ")");
  return 0;
}

int TcpConn::let_go(uint32_t handle) {
  Lock lk(mu_);
  if (closed_) return set_error(-ENOTCONN, "the connection to the memory element is closed (" + close_why_ + ")");
  if (!session_ || ended_.count(handle)) return 0;  // nothing attached any more
  auto st = std::make_shared<OpState>();
  detach_behind_locked(handle, st);
  if (!SendBatch::defer(shared_from_this()) && !flush_locked()) want_loop_locked();
  return 0;
}

void TcpConn::detach_behind_locked(uint32_t handle, const std::shared_ptr<OpState> &st) {
  // Unlike detach(), the handle's operations go on: their answers come before the server reads
  // the DETACH, and complete them as any answer does. An ATTACH not answered yet keeps its record:
  // a refusal fails the requests that followed it with the refusal itself, and verdict() still
  // reads it (forget_attach() lets go of it when the transport ends unsettled).
  users_.erase(handle);
  queue_detach_locked(handle, st);
}

void TcpConn::forget_attach(uint32_t handle) {
  Lock lk(mu_);
  auto pending = attaches_.find(handle);
  if (pending == attaches_.end() || !pending->second.async) return;
  if (!pending->second.done) attaching_--;  // its answer, when it comes, finds nobody
  attaches_.erase(pending);
}

uint32_t TcpConn::queue_attach_locked(const TcpCredentials &creds, bool flush) {
  uint32_t h = next_handle_++;
  attaches_[h].sent = Clock::now();
  attaching_++;
  std::string frame = encode_attach(h, creds, nonce_);
  auto st = std::make_shared<OpState>();
  st->detached = true;  // nothing to complete: it keeps the chunk's accounting
  Chunk c;
  std::memcpy(c.hdr, frame.data(), kHeaderSize);
  c.owned = frame.substr(kHeaderSize);
  c.len = c.owned.size();
  c.st = st;
  sendq_.push_back(std::move(c));
  sendq_.back().data = sendq_.back().owned.data();
  st->queued_sends++;
  if (flush && !flush_locked()) want_loop_locked();
  return h;
}

bool TcpConn::handles_left_locked() {
  if (next_handle_ < UINT32_MAX) return true;
  spent_flag_.store(true, std::memory_order_release);
  return false;
}

int TcpConn::attach_async(const TcpCredentials &creds, FailFn on_fail, uint32_t *handle) {
  Lock lk(mu_);
  if (closed_) return set_error(-ENOTCONN, "the connection to the memory element is closed (" + close_why_ + ")");
  if (!handles_left_locked()) return set_error(-ENOTCONN, "the shared connection has used all its handles");
  // Not sent yet: the operation that follows goes out with it in one system call (and the server
  // answers both in one). verdict() sends it if nothing did.
  uint32_t h = queue_attach_locked(creds, false);
  attaches_[h].async = true;
  users_[h] = std::move(on_fail);
  // Who reads the answer: the operation that follows hands it to the loop (or leads), as verdict() does.
  *handle = h;
  return 0;
}

int TcpConn::verdict(uint32_t h, Deadline deadline, GrantBody *grant, uint32_t spin_us) {
  Lock lk(mu_);
  auto it = attaches_.find(h);
  if (it == attaches_.end() || !it->second.async) return 0;  // settled before
  Attaching &a = it->second;
  // Whatever is queued still (the ATTACH itself, if nothing sent it) goes out: with this thread's
  // turns below, or, if another caller leads (it may be asleep in poll() for its answer alone),
  // the loop's.
  if (!sendq_.empty() && !flush_locked() && reader_ == Reader::Leader) want_loop_locked();
  bool in_time = true;
  while (!a.done && !closed_ && in_time) {
    // Read the answer here rather than wait for the loop to hand it over (one thread woken, not
    // two); the loop, if it was reading, takes over again after.
    if (reader_ != Reader::Leader) {
      // A caller that polls reads the attachment's transfers next (read_on, or its looks).
      in_time = lead_locked(lk, [&] { return a.done; }, deadline, spin_us, spin_us > 0 ? &h : nullptr);
      continue;
    }
    in_time = !(cv_.wait_until(lk, deadline.at()) == std::cv_status::timeout && !a.done && !closed_);
  }
  if (!in_time) {
    abandon_attach_locked(h, a.sent);
    return set_error(-ETIMEDOUT, "no answer to ATTACH from the memory element within the deadline");
  }
  Attaching got = std::move(a);
  attaches_.erase(h);
  if (!got.done) return set_error(close_err_ ? close_err_ : -ENOTCONN, "the connection to the memory element closed (" + close_why_ + ")");
  if (got.status != 0) return set_error(got.status, refusal_reason(got.status));
  std::string why;
  if (decode_grant(got.body.data(), got.body.size(), grant, &why)) {
    fail_locked(-EPROTO, "protocol error from the memory element: " + why, true);
    return set_error(-EPROTO, why);
  }
  return 0;
}

void TcpConn::read_on(uint32_t h, Deadline deadline, uint32_t spin_us) {
  Lock lk(mu_);
  if (spin_us == 0 || closed_ || reader_ == Reader::Leader || !handle_busy_locked(h)) return;
  // lead_locked spins at least as long as this: it never sleeps in poll() here.
  auto until = Clock::now() + std::chrono::microseconds(spin_us);
  lead_locked(lk, [&] { return !handle_busy_locked(h) || Clock::now() >= until; }, deadline, spin_us);
}

int TcpConn::attach(const TcpCredentials &creds, Deadline deadline, FailFn on_fail, uint32_t *handle, GrantBody *grant) {
  Lock lk(mu_);
  if (closed_) return set_error(-ENOTCONN, "the connection to the memory element is closed (" + close_why_ + ")");
  if (!handles_left_locked()) return set_error(-ENOTCONN, "the shared connection has used all its handles");
  uint32_t h = queue_attach_locked(creds, true);
  Attaching &a = attaches_[h];  // unordered_map nodes stay put: the reference outlives rehashing
  // The answer comes on the stream: read it here if nobody else is reading, else wait for the
  // reader (the loop or another caller leading) to hand it over.
  bool in_time = true;
  while (!a.done && !closed_ && in_time) {
    // Read here unless another caller does: the loop's thread, if it was reading, may be parked
    // by a poller's lease, which would hold the answer up until it lapsed.
    if (reader_ != Reader::Leader) {
      in_time = lead_locked(lk, [&] { return a.done; }, deadline);
      continue;
    }
    in_time = !(cv_.wait_until(lk, deadline.at()) == std::cv_status::timeout && !a.done && !closed_);
  }
  if (!in_time) {
    abandon_attach_locked(h, a.sent);
    if (!idle_locked() && reader_ == Reader::None) {
      reader_ = Reader::Loop;
      want_loop_locked();
    }
    return set_error(-ETIMEDOUT, "no answer to ATTACH from the memory element within the deadline");
  }
  attaching_--;
  Attaching got = std::move(a);
  attaches_.erase(h);
  if (got.done && got.status == -EMFILE) spent_flag_.store(true, std::memory_order_release);  // full: a new session
  if (!idle_locked() && reader_ == Reader::None) {
    reader_ = Reader::Loop;
    want_loop_locked();
  }
  if (!got.done) return set_error(close_err_ ? close_err_ : -ENOTCONN, "the connection to the memory element closed (" + close_why_ + ")");
  if (got.status != 0) return set_error(got.status, refusal_reason(got.status));
  std::string why;
  if (decode_grant(got.body.data(), got.body.size(), grant, &why)) {
    fail_locked(-EPROTO, "protocol error from the memory element: " + why, true);
    return set_error(-EPROTO, why);
  }
  users_[h] = std::move(on_fail);
  *handle = h;
  return 0;
}

void TcpConn::add_user(uint32_t handle, FailFn on_fail) {
  Lock lk(mu_);
  users_[handle] = std::move(on_fail);
}

void TcpConn::set_on_dead(std::function<void()> fn) {
  Lock lk(mu_);
  on_dead_ = std::move(fn);
  if (closed_ && on_dead_) IoLoop::shared().post(on_dead_);
}

void TcpConn::detach(uint32_t handle) {
  Lock lk(mu_);
  users_.erase(handle);
  auto pending = attaches_.find(handle);
  if (pending != attaches_.end() && pending->second.async) {
    if (!pending->second.done) attaching_--;  // its answer, when it comes, finds nobody
    attaches_.erase(pending);
  }
  bool ended = ended_.erase(handle) > 0;
  // Its operations end here; bytes already queued for the stream are sent whole first (the
  // stream needs them, and they point into the caller's buffers).
  std::vector<std::shared_ptr<OpState>> mine;
  for (auto &[id, p] : inflight_)
    if (p.st->handle == handle && !p.st->finished) mine.push_back(p.st);
  for (auto &c : sendq_)
    if (c.st && c.st->op && c.st->handle == handle && !c.st->finished) mine.push_back(c.st);
  for (auto &st : mine) op_error(st, -ECONNABORTED, "the transport was closed");
  for (auto &st : mine) {
    if (st->queued_sends > 0) {
      want_loop_locked();
      IoLoop::shared().release();  // the loop's thread sends them: not parked by a poller's lease
      cv_.wait(lk, [&] { return st->queued_sends == 0 || closed_; });
    }
    maybe_finish_locked(st);
  }
  if (closed_ || ended) return;  // the server ended it already, or there is no server
  queue_detach_locked(handle, std::make_shared<OpState>());
  if (!flush_locked()) want_loop_locked();
}

void TcpConn::queue_detach_locked(uint32_t handle, const std::shared_ptr<OpState> &st) {
  st->detached = true;  // nothing to complete: it keeps the chunk's accounting
  Header d;
  d.opcode = kDetach;
  d.addr = handle;
  char hdr[kHeaderSize];
  encode_header(d, hdr);
  queue_locked(hdr, nullptr, 0, st);
}

void TcpConn::cut_handle_locked(uint32_t handle, int reason) {
  // DETACHED (the owner ended the grant: -ECANCELED, -EKEYEXPIRED) or a refused ATTACH that
  // requests followed (-EACCES and the other refusals: the requests fail with it).
  bool refused = reason != -ECANCELED && reason != -EKEYEXPIRED && reason != 0;
  int err = refused ? reason : -ECONNRESET;
  std::string why = reason == -ETIMEDOUT ? "no answer to ATTACH from the memory element within the deadline"
                    : refused ? refusal_reason(reason)
                    : reason == -EKEYEXPIRED ? "the memory's owner let this grant expire"
                                             : "the memory's owner ended this grant (revoked, or the memory withdrawn)";
  ended_[handle] = {err, why};
  std::vector<std::shared_ptr<OpState>> mine;
  for (auto &[id, p] : inflight_)
    if (p.st->handle == handle) mine.push_back(p.st);
  for (auto &c : sendq_)
    if (c.st && c.st->op && c.st->handle == handle) mine.push_back(c.st);
  for (auto &st : mine) op_error(st, err, why);
  for (auto &st : mine) maybe_finish_locked(st);
  auto it = users_.find(handle);
  if (it == users_.end()) return;
  FailFn fn = std::move(it->second);
  users_.erase(it);
  if (fn) fn(err, why);  // the transport learns before its waiters wake (as fail_locked)
}

void TcpConn::close(int err, const std::string &why) {
  Lock lk(mu_);
  fail_locked(err, why, false);
}

// ---- engine (all under mu_) -----------------------------------------------------------------

void TcpConn::queue_locked(const char *hdr, const char *data, size_t len, const std::shared_ptr<OpState> &st) {
  Chunk c;
  std::memcpy(c.hdr, hdr, kHeaderSize);
  c.data = data;
  c.len = len;
  c.st = st;
  sendq_.push_back(std::move(c));
  st->queued_sends++;
}

bool TcpConn::flush_locked() {
  while (!sendq_.empty() && !closed_) {
    // Everything queued goes out in one system call, up to the iovec limit.
    struct iovec iov[64];
    int n = 0;
    for (auto &c : sendq_) {
      if (n > 62) break;
      if (c.hdr_off < kHeaderSize) iov[n++] = {c.hdr + c.hdr_off, kHeaderSize - c.hdr_off};
      if (c.off < c.len) iov[n++] = {const_cast<char *>(c.data) + c.off, c.len - c.off};
    }
    struct msghdr msg = {};
    msg.msg_iov = iov;
    msg.msg_iovlen = size_t(n);
    ssize_t r = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) return false;
      fail_locked(-ECONNRESET, std::string("lost the connection to the memory element: ") + strerror(errno), true);
      return true;
    }
    size_t sent = size_t(r);
    while (!sendq_.empty()) {
      Chunk &c = sendq_.front();
      size_t h = std::min(sent, kHeaderSize - c.hdr_off);
      c.hdr_off += h;
      sent -= h;
      size_t d = std::min(sent, c.len - c.off);
      c.off += d;
      sent -= d;
      if (c.hdr_off < kHeaderSize || c.off < c.len) break;  // the kernel took part of this one
      auto st = std::move(c.st);
      sendq_.pop_front();
      if (--st->queued_sends == 0) {
        cv_.notify_all();
        maybe_finish_locked(st);
      }
    }
  }
  return sendq_.empty();
}

void TcpConn::read_locked() {
  while (!closed_) {
    char *target;
    size_t len;
    bool direct = frames_.direct_target(kDirectMin, &target, &len);
    if (!direct) {
      target = staging_;
      len = kStagingSize;
    }
    ssize_t n = recv(fd_, target, len, MSG_DONTWAIT);
    if (n > 0) last_rx_ = Clock::now();
    if (n == 0) {
      fail_locked(-ECONNRESET, "the memory element closed the connection", true);
      return;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) fail_locked(-ECONNRESET, std::string("lost the connection to the memory element: ") + strerror(errno), true);
      return;
    }
    std::string why;
    int rc = direct ? frames_.advance_direct(size_t(n), &why) : frames_.feed(target, size_t(n), &why);
    if (rc) {
      fail_locked(-EPROTO, "protocol error from the memory element: " + why, true);
      return;
    }
    if (size_t(n) < len) return;  // drained what the kernel had
  }
}

void TcpConn::op_error(const std::shared_ptr<OpState> &st, int err, std::string why) {
  if (st->error == 0) {
    st->error = err;
    st->why = std::move(why);
  }
}

void TcpConn::maybe_finish_locked(const std::shared_ptr<OpState> &st) {
  if (st->finished || st->queued_sends > 0) return;  // queued bytes still point into its buffer
  if (st->error == 0 && st->segs_left > 0) return;
  st->finished = true;
  if (st->op) {
    auto left = unfinished_.find(st->handle);
    if (left != unfinished_.end() && --left->second == 0) unfinished_.erase(left);
  }
  if (st->error) {
    // Forget its other segments: answers that still come are dropped.
    for (auto it = inflight_.begin(); it != inflight_.end();)
      it = it->second.st == st ? inflight_.erase(it) : std::next(it);
    if (current_id_ && frames_.in_payload() && !inflight_.count(current_id_)) frames_.discard_current();
  }
  if (st->detached) return;  // the canceller completes it
  st->op->complete(st->error, st->why);
}

void TcpConn::fail_locked(int err, const std::string &why, bool notify) {
  if (closed_) return;
  closed_ = true;
  closed_flag_.store(true, std::memory_order_release);
  close_err_ = err;
  close_why_ = why;
  ::shutdown(fd_, SHUT_RDWR);  // wakes a leader blocked in poll()
  // The transport learns first, so a caller woken by its failed operation already sees ERROR.
  if (notify && on_fail_) on_fail_(err, why);
  if (notify)
    for (auto &[h, fn] : users_)
      if (fn) fn(err, why);
  users_.clear();
  if (on_dead_) IoLoop::shared().post(on_dead_);
  std::vector<std::shared_ptr<OpState>> all;
  for (auto &[id, p] : inflight_) all.push_back(p.st);
  for (auto &c : sendq_) {
    c.st->queued_sends--;
    all.push_back(c.st);
  }
  inflight_.clear();
  sendq_.clear();
  for (auto &st : all) op_error(st, err, why);
  for (auto &st : all) maybe_finish_locked(st);
  cv_.notify_all();
  want_loop_locked();  // the loop closes its handles
}

void TcpConn::check_deadlines_locked() {
  auto now = Clock::now();
  std::vector<std::shared_ptr<OpState>> late;
  for (auto &[id, p] : inflight_)
    if (now >= p.st->op->deadline().at() && std::find(late.begin(), late.end(), p.st) == late.end()) late.push_back(p.st);
  for (auto &st : late) {
    if (closed_) return;
    expire_locked(st);
  }
}

void TcpConn::expire_locked(const std::shared_ptr<OpState> &st) {
  if (closed_ || st->finished) return;
  const char *why = "no answer from the memory element within the deadline";
  if (st->queued_sends > 0 || silent_since_locked(st->posted)) {
    fail_locked(-ETIMEDOUT, why, true);
    return;
  }
  op_error(st, -ETIMEDOUT, why);
  maybe_finish_locked(st);  // its answers, if they still come, are dropped
}

void TcpConn::abandon_attach_locked(uint32_t h, Clock::time_point sent) {
  const char *why = "no answer to ATTACH from the memory element within the deadline";
  auto it = attaches_.find(h);
  bool async = false;
  if (it != attaches_.end()) {
    async = it->second.async;
    if (!it->second.done) attaching_--;
    attaches_.erase(it);
  }
  if (closed_) return;
  if (silent_since_locked(sent)) {
    fail_locked(-ETIMEDOUT, why, true);
    return;
  }
  // Requests that followed an attach_async fail, and its transport hears of it.
  if (async) cut_handle_locked(h, -ETIMEDOUT);
  users_.erase(h);
  // The server takes frames in order: the DETACH lets go of whatever the ATTACH opened (it
  // ignores a handle it refused), and the late ATTACH_OK finds no attachment here (dropped).
  ended_[h] = {-ETIMEDOUT, why};
  queue_detach_locked(h, std::make_shared<OpState>());
  if (!flush_locked()) want_loop_locked();
}

int TcpConn::on_header(const Header &h, char **dest) {
  if (h.opcode == kPong) return 0;
  if (h.opcode == kAttachOk) {
    if (!session_ || h.addr == 0 || h.addr >= next_handle_) return -EPROTO;
    auto it = attaches_.find(uint32_t(h.addr));
    if (it == attaches_.end()) return 0;  // the answer to an attachment let go of before it came
    if (it->second.done) return -EPROTO;
    it->second.body.assign(size_t(payload_length(h)), '\0');
    *dest = it->second.body.data();
    return 0;
  }
  if (h.opcode == kDetached) return session_ && h.addr <= UINT32_MAX && h.size == 0 ? 0 : -EPROTO;
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
  if (h.opcode == kPong) return 0;
  if (h.opcode == kAttachOk) {
    auto it = attaches_.find(uint32_t(h.addr));
    if (it == attaches_.end()) return 0;
    Attaching &a = it->second;
    a.done = true;
    a.status = h.status;
    if (h.status == -EMFILE) spent_flag_.store(true, std::memory_order_release);  // full: the next opens a new one
    if (a.async) {
      attaching_--;
      // Requests that followed a refused ATTACH fail with the refusal itself (the server, for
      // which the handle never existed, answers them -ECONNRESET just after).
      if (h.status != 0) cut_handle_locked(uint32_t(h.addr), h.status);
    }
    cv_.notify_all();
    return 0;
  }
  if (h.opcode == kDetached) {
    cut_handle_locked(uint32_t(h.addr), h.status);
    return 0;
  }
  current_id_ = 0;
  auto it = inflight_.find(h.req_id);
  if (it == inflight_.end()) return 0;
  auto st = it->second.st;
  inflight_.erase(it);
  st->segs_left--;
  if (h.status != 0)
    op_error(st, h.status, std::string("the memory element refused the ") +
                                (h.opcode == kReadResp ? "read" : "write") + ": " +
                                (h.status == -EINVAL ? "it crosses from one of the grant's lent ranges into the next "
                                                       "(give each range its own entry)"
                                                     : libd_strerror(h.status)));
  maybe_finish_locked(st);
  return 0;
}

// ---- the loop side --------------------------------------------------------------------------

void TcpConn::want_loop_locked() {
  if (update_posted_) return;
  update_posted_ = true;
  auto self = shared_from_this();
  IoLoop::shared().post([self] {
    Lock lk = self->lock_on_loop();
    self->update_posted_ = false;
    lk.unlock();
    self->update_watch();
  });
}

void TcpConn::update_watch() {
  Lock lk = lock_on_loop();
  if (!poll_) return;  // handles already closed
  if (closed_) {
    // Each handle keeps the connection alive until its close callback has run.
    for (uv_handle_t *h : {reinterpret_cast<uv_handle_t *>(poll_), reinterpret_cast<uv_handle_t *>(timer_)}) {
      h->data = new std::shared_ptr<TcpConn>(shared_from_this());
      uv_close(h, [](uv_handle_t *hh) {
        delete static_cast<std::shared_ptr<TcpConn> *>(hh->data);
        if (hh->type == UV_POLL) delete reinterpret_cast<uv_poll_t *>(hh);
        else delete reinterpret_cast<uv_timer_t *>(hh);
      });
    }
    poll_ = nullptr;
    timer_ = nullptr;
    return;
  }
  // The loop reads while it completes operations, and on an idle session (the server's DETACHED).
  bool read = reader_ == Reader::Loop || (session_ && reader_ == Reader::None);
  int events = UV_DISCONNECT | (read ? UV_READABLE : 0) | (sendq_.empty() ? 0 : UV_WRITABLE);
  if (events != watching_) {
    watching_ = events;
    uv_poll_start(poll_, events, on_poll);
  }
  // The tick runs while there is work and stops itself at the first tick that finds none, so
  // operations started in a burst find it running (post() then need not wake the loop).
  bool busy = reader_ == Reader::Loop || !sendq_.empty();
  if (busy && !ticking_) {
    ticking_ = true;
    uv_timer_start(timer_, [](uv_timer_t *t) {
      auto *c = static_cast<TcpConn *>(t->data);
      Lock lk = c->lock_on_loop();
      // A poller may have read the last answer itself (progress) while the loop slept.
      if (c->reader_ == Reader::Loop && c->idle_locked()) c->reader_ = Reader::None;
      if (c->reader_ == Reader::Loop || !c->sendq_.empty() || c->closed_) {
        c->check_deadlines_locked();
      } else {
        uv_timer_stop(t);
        c->ticking_ = false;
      }
    }, kTickMs, kTickMs);
  }
}

void TcpConn::on_poll(uv_poll_t *h, int status, int events) {
  auto *c = static_cast<TcpConn *>(h->data);
  {
    Lock lk = c->lock_on_loop();
    if (c->closed_) return;  // an update to close the handles is on its way
    if (status < 0) {
      c->fail_locked(-ECONNRESET, std::string("lost the connection to the memory element: ") + uv_strerror(status), true);
      return;
    }
    if (events & UV_WRITABLE) c->flush_locked();
    if (c->reader_ == Reader::Loop && (events & (UV_READABLE | UV_DISCONNECT))) {
      c->read_locked();
      if (!c->closed_ && c->idle_locked()) c->reader_ = Reader::None;
    } else if (c->reader_ == Reader::None && c->session_ && (events & (UV_READABLE | UV_DISCONNECT))) {
      c->read_locked();  // what the server says on an idle session: DETACHED
    } else if (c->reader_ == Reader::None && (events & UV_DISCONNECT)) {
      char b;
      ssize_t r = recv(c->fd_, &b, 1, MSG_PEEK | MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
        c->fail_locked(-ECONNRESET, "the memory element closed the connection", true);
    }
    if (c->closed_) return;
  }
  c->update_watch();
}

}  // namespace libd
