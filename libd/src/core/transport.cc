#include "core/transport.h"

#include "core/server_base.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/op_allocator.h"

namespace libd {

static std::string quote(const std::string &s) { return "'" + s + "'"; }

// Owners terminate a transport before destroying it: hooks are virtual, so they cannot run here.
Transport::~Transport() = default;

int Transport::setup(TransportSetup s) {
  name_ = std::move(s.name);
  impl_ = s.impl;
  params_ = std::move(s.params);
  aid_ = std::move(s.aid);
  uint64_t t;
  if (int rc = params_.get_u64("timeout_ms", 10000, &t)) return rc;
  if (t == 0 || t > 3600 * 1000)
    return set_error(-EINVAL, "parameter 'timeout_ms' must be between 1 and 3600000");
  timeout_ms_ = int64_t(t);
  std::string faults = params_.get_or("faults", "0");
  if (faults != "0" && faults != "1") return set_error(-EINVAL, "parameter 'faults' must be 0 or 1");
  if ((faults == "1" || faults_always_) && this->kind() == LIBD_KIND_RDMA)
    faults_ = std::make_unique<FaultInjector>(FaultInjector::Hooks{
        [this](const std::shared_ptr<Op> &op) { post_late(op); },
        [this](int err, const std::string &why) { fail(err, why); }});
  if (configured()) return init();
  return 0;
}

int Transport::unsupported(const char *what) {
  return set_error(-EOPNOTSUPP, std::string("transport ") + quote(name_) + " (" +
                                    (impl_ ? impl_->name : "?") + ") does not support " + what);
}

void Transport::transition_locked(int to) {
  state_ = to;
  state_now_.store(to, std::memory_order_release);
  seq_++;
  cv_.notify_all();
}

int Transport::state() {
  std::lock_guard<std::mutex> lk(mu_);
  return state_;
}

int Transport::wait_state(unsigned mask, int timeout_ms) {
  auto deadline = Deadline::after_ms(timeout_ms < 0 ? timeout_ms_ : timeout_ms);
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_until(lk, deadline.at(), [&] { return (unsigned(state_) & mask) != 0; }))
    return set_error(-ETIMEDOUT, "transport " + quote(name_) + " stayed " + libd_state_name(state_));
  return state_;
}

int Transport::wait_change(uint64_t *seq, int timeout_ms) {
  auto deadline = Deadline::after_ms(timeout_ms < 0 ? timeout_ms_ : timeout_ms);
  std::unique_lock<std::mutex> lk(mu_);
  if (!cv_.wait_until(lk, deadline.at(), [&] { return seq_ != *seq; }))
    return set_error(-ETIMEDOUT, "transport " + quote(name_) + " did not change state");
  *seq = seq_;
  return state_;
}

int Transport::init() {
  std::unique_lock<std::mutex> lk(mu_);
  if (state_ == LIBD_STATE_TERMINATED) return set_error(-ESHUTDOWN, "transport " + quote(name_) + " is terminated");
  if (state_ != LIBD_STATE_INIT) return 0;
  int rc = do_init();
  if (rc) {
    std::string why = last_error();
    return set_error(rc, "transport " + quote(name_) + ": " + why);
  }
  transition_locked(LIBD_STATE_INITD);
  return 0;
}

int Transport::configure(const Params &extra) {
  std::unique_lock<std::mutex> lk(mu_);
  if (state_ == LIBD_STATE_TERMINATED) return set_error(-ESHUTDOWN, "transport " + quote(name_) + " is terminated");
  cv_.wait(lk, [&] { return !busy_; });
  Params saved = params_;
  params_.merge(extra);
  uint64_t t;
  if (int rc = params_.get_u64("timeout_ms", uint64_t(timeout_ms_), &t)) { params_ = saved; return rc; }
  if (int rc = do_init()) {
    std::string why = last_error();
    params_ = saved;
    return set_error(rc, "transport " + quote(name_) + ": bad configuration: " + why);
  }
  timeout_ms_ = int64_t(t);
  if (state_ == LIBD_STATE_READY || state_ == LIBD_STATE_ERROR) {
    // A new address: drop the old connection, reconnect lazily on the next operation. Out of
    // READY first, so that no operation reaches the engine being dropped (they wait for busy_).
    transition_locked(LIBD_STATE_INITD);
    busy_ = true;
    lk.unlock();
    {
      std::unique_lock<IoGate> io(io_mu_);
      disconnect_io();
    }
    lk.lock();
    busy_ = false;
  }
  error_code_ = 0;
  error_msg_.clear();
  transition_locked(LIBD_STATE_INITD);
  return 0;
}

int Transport::error_locked() {
  return set_error(error_code_ ? error_code_ : -EIO,
                   "transport " + quote(name_) + " is in ERROR (" + error_msg_ + "); call recover()");
}

// Runs do_connect without holding mu_; exactly one thread at a time (busy_).
int Transport::connect_locked(std::unique_lock<std::mutex> &lk, Deadline deadline, bool recovering, bool lazy) {
  busy_ = true;
  lk.unlock();
  int rc;
  std::string why;
  {
    std::unique_lock<IoGate> io(io_mu_);
    if (recovering) disconnect_io();
    rc = faults_ ? faults_->on_connect() : 0;
    if (rc == 0) rc = lazy ? do_connect_lazy(deadline) : do_connect(deadline);
    if (rc) {
      why = last_error();
      disconnect_io();
    }
  }
  lk.lock();
  busy_ = false;
  if (state_ == LIBD_STATE_TERMINATED) {  // terminated while we connected
    lk.unlock();
    { std::unique_lock<IoGate> io(io_mu_); disconnect_io(); }
    lk.lock();
    cv_.notify_all();
    return set_error(-ESHUTDOWN, "transport " + quote(name_) + " was terminated while connecting");
  }
  if (rc) {
    error_code_ = rc;
    error_msg_ = why;
    transition_locked(LIBD_STATE_ERROR);
    return set_error(rc, "transport " + quote(name_) + ": connect failed: " + why);
  }
  error_code_ = 0;
  error_msg_.clear();
  transition_locked(LIBD_STATE_READY);
  return 0;
}

int Transport::settle(Deadline deadline) {
  int rc;
  std::string why;
  {
    std::unique_lock<IoGate> io(io_mu_);  // the grant it sets is read by operations without mu_
    rc = do_settle(deadline);
    if (rc) why = last_error();
  }
  if (rc) {
    fail(rc, why);
    return set_error(rc, "transport " + quote(name_) + ": " + why);
  }
  // Outside the exclusive lock: operations, recover and terminate need not wait for it.
  std::shared_lock<IoGate> io(io_mu_);
  do_settled(io, deadline);
  return 0;
}

int Transport::connect() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !busy_; });
  switch (state_) {
    case LIBD_STATE_READY:
      lk.unlock();
      return settle(op_deadline());  // an operation's connect may have left the verdict open
    case LIBD_STATE_INIT:
      return set_error(-EINVAL, "transport " + quote(name_) + " is not configured yet (state INIT)");
    case LIBD_STATE_INITD: return connect_locked(lk, op_deadline(), false);
    case LIBD_STATE_ERROR: return error_locked();
    default: return set_error(-ESHUTDOWN, "transport " + quote(name_) + " is terminated");
  }
}

int Transport::recover() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !busy_; });
  switch (state_) {
    case LIBD_STATE_READY: return 0;
    case LIBD_STATE_INIT:
      return set_error(-EINVAL, "transport " + quote(name_) + " is not configured yet (state INIT)");
    case LIBD_STATE_INITD: return connect_locked(lk, op_deadline(), false);
    case LIBD_STATE_ERROR: return connect_locked(lk, op_deadline(), true);
    default: return set_error(-ESHUTDOWN, "transport " + quote(name_) + " is terminated");
  }
}

int Transport::terminate() {
  std::unique_lock<std::mutex> lk(mu_);
  if (state_ == LIBD_STATE_TERMINATED) return 0;
  cv_.wait(lk, [&] { return !busy_; });
  if (state_ == LIBD_STATE_TERMINATED) return 0;
  busy_ = true;
  transition_locked(LIBD_STATE_TERMINATED);  // new operations are refused from here on
  lk.unlock();
  if (faults_) faults_->stop();  // its thread hands nothing to the engine any more
  {
    std::unique_lock<IoGate> io(io_mu_);
    disconnect_io();
    do_terminate();
    free_owned_buffer();
  }
  lk.lock();
  busy_ = false;
  cv_.notify_all();
  return 0;
}

void Transport::fail(int err, const std::string &why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (state_ != LIBD_STATE_READY) return;
  error_code_ = err;
  error_msg_ = why;
  transition_locked(LIBD_STATE_ERROR);
}

std::string Transport::error_message() {
  std::lock_guard<std::mutex> lk(mu_);
  return error_msg_;
}

void Transport::set_message(std::string msg) {
  std::lock_guard<std::mutex> lk(mu_);
  message_ = std::move(msg);
  seq_++;
  cv_.notify_all();
}

int Transport::message(std::string *out) {
  std::lock_guard<std::mutex> lk(mu_);
  if (message_.empty()) return set_error(-ENODATA, "transport " + quote(name_) + " has no message yet");
  *out = message_;
  return 0;
}

int Transport::set(const std::string &key, const std::string &value) {
  if (faults_ && FaultInjector::is_knob(key)) return faults_->set(key, value);
  return set_error(-EOPNOTSUPP, "transport " + quote(name_) + " (" + impl_->name +
                                    ") has no control knob " + quote(key));
}

void Transport::set_remote(uint64_t base, uint64_t length, unsigned rights) {
  std::lock_guard<std::mutex> lk(mu_);
  remote_base_ = base;
  remote_len_ = length;
  remote_rights_ = rights;
}

int Transport::remote(uint64_t *size, unsigned *rights) {
  if (int rc = ensure_ready(op_deadline())) return rc;
  if (int rc = settle(op_deadline())) return rc;
  std::lock_guard<std::mutex> lk(mu_);
  if (size) *size = remote_base_ + remote_len_;
  if (rights) *rights = remote_rights_;
  return 0;
}

// ---- local buffer ----

void Transport::free_owned_buffer() {
  if (lowned_ && lbuf_) munmap(lbuf_, lsize_);
  lbuf_ = nullptr;
  lsize_ = 0;
  lowned_ = false;
  lranges_.clear();
}

int Transport::reg(size_t size, void **buf) {
  if (!buf) return set_error(-EINVAL, "reg: buf must point to a pointer (NULL to allocate)");
  if (size == 0) return set_error(-EINVAL, "reg: size must be > 0");
  if (kind() != LIBD_KIND_RDMA) return unsupported("reg");
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ == LIBD_STATE_TERMINATED) return set_error(-ESHUTDOWN, "transport " + quote(name_) + " is terminated");
  }
  std::unique_lock<IoGate> io(io_mu_);
  if (stats_->in_flight() > 0)
    return set_error(-EBUSY, "reg: transport " + quote(name_) + " has operations in flight");
  if (*buf && *buf == lbuf_ && size == lsize_ && lranges_.empty()) return 0;  // the same registration again: free
  char *mem = static_cast<char *>(*buf);
  bool owned = false;
  if (!mem) {
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return set_error(-ENOMEM, "reg: cannot allocate " + std::to_string(size) + " bytes: " + strerror(errno));
    mem = static_cast<char *>(p);
    owned = true;
  }
  if (int rc = do_register(mem, size)) {
    if (owned) munmap(mem, size);
    return rc;
  }
  free_owned_buffer();
  lbuf_ = mem;
  lsize_ = size;
  lowned_ = owned;
  *buf = mem;
  return 0;
}

int Transport::reg_ranges(const libd_range *ranges, int n) {
  if (kind() != LIBD_KIND_RDMA) return unsupported("reg_ranges");
  std::vector<libd_range> list(ranges, ranges + n);
  for (int i = 0; i < n; i++)
    if (!list[size_t(i)].base || list[size_t(i)].size == 0 ||
        uintptr_t(list[size_t(i)].base) > UINTPTR_MAX - list[size_t(i)].size)
      return set_error(-EINVAL, "reg_ranges: range " + std::to_string(i) + " needs an address and a size > 0");
  std::sort(list.begin(), list.end(), [](const libd_range &a, const libd_range &b) { return a.base < b.base; });
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_ == LIBD_STATE_TERMINATED) return set_error(-ESHUTDOWN, "transport " + quote(name_) + " is terminated");
  }
  std::unique_lock<IoGate> io(io_mu_);
  if (stats_->in_flight() > 0)
    return set_error(-EBUSY, "reg_ranges: transport " + quote(name_) + " has operations in flight");
  if (n == 1) {
    if (int rc = do_register(static_cast<char *>(list[0].base), list[0].size)) return rc;
  } else if (int rc = do_register_ranges(list)) {
    return rc;
  }
  free_owned_buffer();
  lbuf_ = static_cast<char *>(list[0].base);
  lsize_ = list[0].size;
  if (n > 1) lranges_ = std::move(list);
  return 0;
}

int Transport::check_local(const Segments &segs) {
  if (!lbuf_)
    return set_error(-ENOBUFS, "transport " + quote(name_) + ": no local buffer registered; call reg() first");
  for (const auto &s : segs) {
    if (!within_local(s))
      return set_error(-ERANGE, "transport " + quote(name_) + ": local range of " + std::to_string(s.size) +
                                    " bytes at buffer offset " + std::to_string(int64_t(s.buf - lbuf_)) +
                                    (lranges_.empty() ? " is outside the registered buffer of " + std::to_string(lsize_) + " bytes"
                                                      : " is not inside one of the " + std::to_string(lranges_.size()) + " registered buffers"));
  }
  return 0;
}

// ---- operations ----

int Transport::ensure_ready(Deadline deadline, bool lazy) {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    switch (state_) {
      case LIBD_STATE_READY: return 0;
      case LIBD_STATE_TERMINATED:
        return set_error(-ESHUTDOWN, "transport " + quote(name_) + " is terminated");
      case LIBD_STATE_ERROR:
        if (busy_) break;  // a recover is running: wait for its outcome
        return error_locked();
      case LIBD_STATE_INITD:
        if (busy_) break;
        if (int rc = connect_locked(lk, deadline, false, lazy)) return rc;
        continue;
      case LIBD_STATE_INIT: break;
    }
    if (!cv_.wait_until(lk, deadline.at(), [&] { return !busy_ && state_ != LIBD_STATE_INIT; })) {
      if (state_ == LIBD_STATE_INIT)
        return set_error(-ETIMEDOUT, "transport " + quote(name_) + " was not configured within " +
                                         std::to_string(timeout_ms_) + " ms");
      return set_error(-ETIMEDOUT, "transport " + quote(name_) + " did not become READY within " +
                                       std::to_string(timeout_ms_) + " ms");
    }
  }
}

// check_local and check_remote in one pass, for the operation path: true if both would pass.
bool Transport::fits(OpKind kind, const Segments &segs) const {
  if (!lbuf_ || !grant_allows(kind)) return false;
  for (const auto &s : segs)
    if (!within_local(s) || !within_grant(s)) return false;
  return true;
}

bool Transport::within_local(const Segment &s) const {
  uintptr_t lo = uintptr_t(lbuf_), hi = lo + lsize_, p = uintptr_t(s.buf);
  auto holds = [&](uintptr_t lo, uintptr_t hi) { return p >= lo && p <= hi && s.size <= hi - p; };
  if (lranges_.empty()) return holds(lo, hi);
  // The last buffer that starts at or before the segment; buffers may overlap (the same memory
  // registered twice, or one inside another), so an earlier one may hold it when that one does not.
  auto it = std::upper_bound(lranges_.begin(), lranges_.end(), p,
                             [](uintptr_t v, const libd_range &r) { return v < uintptr_t(r.base); });
  while (it != lranges_.begin()) {
    --it;
    if (holds(uintptr_t(it->base), uintptr_t(it->base) + it->size)) return true;
  }
  return false;
}

bool Transport::grant_allows(OpKind kind) const {
  return remote_rights_ & (kind == OpKind::Read ? LIBD_RIGHT_READ : LIBD_RIGHT_WRITE);
}

bool Transport::within_grant(const Segment &s) const {
  uint64_t lo = remote_base_, hi = remote_base_ + remote_len_;
  return s.raddr >= lo && s.raddr <= hi && s.size <= hi - s.raddr;
}

int Transport::check_remote(OpKind kind, const Segments &segs) {
  if (!grant_allows(kind))
    return set_error(-EACCES, "transport " + quote(name_) + ": the grant does not allow " +
                                  (kind == OpKind::Read ? "reads" : "writes"));
  for (const auto &s : segs)
    if (!within_grant(s))
      return set_error(-ERANGE, "transport " + quote(name_) + ": remote range [" + std::to_string(s.raddr) +
                                    ", +" + std::to_string(s.size) + ") is outside the granted [" +
                                    std::to_string(remote_base_) + ", " + std::to_string(remote_base_ + remote_len_) + ")");
  return 0;
}

std::shared_ptr<Op> Transport::new_op(OpKind kind, Segments segs, Deadline deadline) {
  // Counted in flight by stats_.
  return std::allocate_shared<Op>(OpAllocator<Op>(), kind, std::move(segs), deadline, stats_);
}

// One shared hold of the I/O lock covers the checks and the post: connect, recover, terminate and
// reg take it exclusively, so the local buffer, the grant and the engine cannot change in
// between. The state is read from its atomic mirror; only a transport that is not READY takes
// the slow path (ensure_ready: lazy connect, or waiting for a configuration or a recover).
int Transport::start(OpKind kind, Segments segs, bool sync, std::shared_ptr<Op> *out) {
  if (this->kind() != LIBD_KIND_RDMA) return unsupported(kind == OpKind::Read ? "read" : "write");
  if (segs.empty()) return set_error(-EINVAL, "no segments");
  Deadline deadline = op_deadline();
  for (;;) {
    std::shared_lock<IoGate> io(io_mu_);
    // The usual case is checked in one pass that builds no message; anything else goes through
    // the checks that say what is wrong (or through ensure_ready).
    if (state_now_.load(std::memory_order_acquire) != LIBD_STATE_READY || !fits(kind, segs)) {
      if (int rc = check_local(segs)) {
        // terminate drops the buffer: "terminated" says more
        if (state_now_.load(std::memory_order_acquire) == LIBD_STATE_TERMINATED)
          return set_error(-ESHUTDOWN, "transport " + quote(name_) + " is terminated");
        return rc;
      }
      if (state_now_.load(std::memory_order_acquire) != LIBD_STATE_READY) {
        io.unlock();
        if (int rc = ensure_ready(deadline, true)) return rc;  // the operation may ride the handshake
        continue;  // READY now, or a moment ago: check everything again under the lock
      }
      // The grant is set by do_connect under the exclusive I/O lock: stable here.
      if (int rc = check_remote(kind, segs)) return rc;
    }
    if (sync && segs.size() == 1 && segs[0].size > 0 && !faults_ && caps().direct) {
      int rc = run_direct(kind, segs[0], io, deadline);
      if (rc != kNotDirect) return rc;  // ran without an operation object: *out stays empty
    }
    auto op = new_op(kind, std::move(segs), deadline);
    if (op->bytes() == 0) {
      op->complete(0);
      *out = std::move(op);
      return 0;
    }
    if (faults_ && faults_->intercept(op)) {  // failed, held for a delay, or dropped
      *out = std::move(op);
      return 0;
    }
    int rc = sync ? do_run(op, io) : do_post(op);
    if (rc) {
      std::string why = last_error();
      op->complete(rc);
      *out = std::move(op);
      return set_error(rc, why);
    }
    *out = std::move(op);
    return 0;
  }
}

int Transport::run_direct(OpKind kind, const Segment &seg, std::shared_lock<IoGate> &io, Deadline deadline) {
  bool timed = stats_->start_op();
  int64_t start_ns = timed ? now_ns() : 0;
  std::string why;
  int rc = do_run_direct(kind, seg, io, deadline, &why);
  if (rc == kNotDirect) {
    stats_->unstart_op();
    return rc;
  }
  stats_->record(kind, seg.size, timed ? now_ns() - start_ns : -1, rc == 0);
  if (rc) return set_error(rc, "transport " + quote(name_) + ": " + (why.empty() ? libd_strerror(rc) : why));
  return 0;
}

int Transport::submit(OpKind kind, Segments segs, std::shared_ptr<Op> *out) {
  std::shared_ptr<Op> op;
  if (int rc = start(kind, std::move(segs), false, &op)) return rc;
  *out = std::move(op);
  return 0;
}

int Transport::run(OpKind kind, Segments segs) {
  std::shared_ptr<Op> op;
  if (int rc = start(kind, std::move(segs), true, &op)) return rc;
  if (!op) return 0;  // it ran on the direct path, and succeeded
  // The engine enforces the deadline; the grace covers its timer's granularity.
  int rc = op->wait_until(op->deadline().at() + std::chrono::milliseconds(500));
  if (rc == -ETIMEDOUT && !op->done()) {
    op->cancel();
    fail(-ETIMEDOUT, "operation did not complete within the deadline");
    return set_error(-ETIMEDOUT, "transport " + quote(name_) + ": operation timed out after " +
                                     std::to_string(timeout_ms_) + " ms");
  }
  rc = op->status();
  if (rc) {
    std::string why = op->message();
    if (why.empty()) why = error_message();
    return set_error(rc, "transport " + quote(name_) + ": " + (why.empty() ? libd_strerror(rc) : why));
  }
  return 0;
}

int Transport::run_nowait(OpKind kind, Segment seg) {
  if (faults_ || !caps().inline_copy || this->kind() != LIBD_KIND_RDMA) return -EAGAIN;
  std::shared_lock<IoGate> io(io_mu_, std::try_to_lock);
  if (!io.owns_lock()) return -EAGAIN;  // a reconnect or a re-registration is under way
  // As start()'s fast path (the grant is stable under the I/O lock); anything to report goes
  // through the blocking form, which says it properly.
  if (state_now_.load(std::memory_order_acquire) != LIBD_STATE_READY || !fits(kind, Segments(seg))) return -EAGAIN;
  auto op = new_op(kind, seg, op_deadline());
  if (int rc = do_post(op)) {
    op->complete(rc);
    return rc;
  }
  int rc = op->status();
  if (rc == -EINPROGRESS) return -EIO;  // an engine that broke its Caps::inline_copy promise
  if (rc) {
    std::string why = op->message();
    return set_error(rc, "transport " + quote(name_) + ": " + (why.empty() ? libd_strerror(rc) : why));
  }
  return 0;
}

template <typename Fn>
int Transport::when_ready(Deadline deadline, Fn &&fn) {
  for (;;) {
    std::shared_lock<IoGate> io(io_mu_);
    if (state_now_.load(std::memory_order_acquire) != LIBD_STATE_READY) {
      io.unlock();
      if (int rc = ensure_ready(deadline)) return rc;
      continue;
    }
    return fn(io);
  }
}

int Transport::notify(uint64_t value, int status, bool last) {
  if (kind() != LIBD_KIND_RDMA) return unsupported("notify");
  if (status > 0 || status < -4095) return set_error(-EINVAL, "notify: status must be 0 or a negative errno");
  Deadline deadline = op_deadline();
  return when_ready(deadline, [&](std::shared_lock<IoGate> &io) { return do_notify(value, status, last, io, deadline); });
}

int Transport::let_go() {
  if (kind() != LIBD_KIND_RDMA) return unsupported("let_go");
  return when_ready(op_deadline(), [&](std::shared_lock<IoGate> &io) { return do_let_go(io); });
}

int Transport::do_map(void **addr, uint64_t *size) {
  (void)addr, (void)size;
  return set_error(-EOPNOTSUPP, "transport " + quote(name_) + " (" + impl_name() +
                                    ") moves the bytes on request and maps nothing: use read/write");
}

int Transport::map(void **addr, uint64_t *size) {
  if (kind() != LIBD_KIND_RDMA) return unsupported("map");
  return when_ready(op_deadline(), [&](std::shared_lock<IoGate> &) { return do_map(addr, size); });
}

unsigned Transport::cap_bits() {
  std::shared_lock<IoGate> io(io_mu_);
  Caps c = caps();
  if (faults_) c.inline_copy = c.direct = false;  // every operation passes the injector
  return (c.inline_copy ? LIBD_CAP_NOWAIT : 0u) | (c.direct ? LIBD_CAP_DIRECT : 0u) |
         (c.notify ? LIBD_CAP_NOTIFY : 0u) | (c.lazy_connect ? LIBD_CAP_LAZY_CONNECT : 0u) |
         (as_server(this) ? LIBD_CAP_SERVER : 0u);
}

void Transport::disconnect_io() {
  if (faults_) faults_->flush(-ECONNRESET, "the connection closed");
  do_disconnect();
}

void Transport::post_late(const std::shared_ptr<Op> &op) {
  std::shared_lock<IoGate> io(io_mu_);
  if (state_now_.load(std::memory_order_acquire) != LIBD_STATE_READY) {
    op->complete(-ECONNRESET, "the transport left READY while the operation was delayed");
    return;
  }
  if (int rc = do_post(op)) op->complete(rc, last_error());
}

void Transport::wait_stopped() {
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return state_ == LIBD_STATE_TERMINATED || state_ == LIBD_STATE_INITD; });
}

bool Transport::terminated() {
  std::lock_guard<std::mutex> lk(mu_);
  return state_ == LIBD_STATE_TERMINATED;
}

int ServerBase::serve_blocking() {
  if (int rc = serve()) {
    // Stopped before this call got to serve (a thread that calls run may start after another
    // has called stop): what it waits for has happened, so it returns as a stop during the run would.
    return rc == -ESHUTDOWN && terminated() ? 0 : rc;
  }
  wait_stopped();
  return 0;
}

}  // namespace libd
