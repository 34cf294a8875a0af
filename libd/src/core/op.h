// An operation in flight: one read or write, or a batch of them, with a completion that any
// number of threads can wait for. Transports complete it exactly once.
#pragma once
#include <atomic>
#include <cerrno>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/stats.h"
#include "libd.h"

namespace libd {

class Op;

// The engine running an operation, as the operation sees it: how to withdraw it and, for an
// engine that polls, how a waiter drives progress. The operation holds it weakly (it may outlive
// its engine) and without an allocation per operation, unlike a std::function with a capture.
class OpDriver {
 public:
  virtual ~OpDriver() = default;
  // Detaches `op`; returns only when the engine no longer touches its buffers.
  virtual void cancel(Op *op) = 0;
  // One round of caller-driven progress for `waiting` (a waiter's operation; may be null); must
  // not block. Only called if the driver said it polls, or that waiters look first.
  virtual void progress(Op *waiting) { (void)waiting; }
  // The same for a caller that polls (libd_op_poll, in a loop): an engine whose events a helper
  // thread also watches may keep that thread away while the polling lasts, so that what the
  // caller waits for is taken on the caller's thread and no thread is woken for it.
  virtual void poll_progress(Op *waiting) { progress(waiting); }
  // The polling caller stops (it is about to sleep until the operation's watch fd is written):
  // the helper thread watches again.
  virtual void polling_stopped() {}
  // A caller polled `op` and found it finished already: a look all the same (the helper thread
  // may have taken the answer before the caller's first look; the caller polls nonetheless).
  virtual void looked(Op *op) { (void)op; }
  // A wait that polled (the transport's busy_poll_us) saw `op` finish and returns: the engine
  // gives its helper thread back what that thread must do for others (operations still running),
  // and may otherwise keep it away until the caller's next wait or poll.
  virtual void wait_polled(Op *op) { (void)op; }
};

struct Segment {
  uint64_t size;
  uint64_t raddr;
  char *buf;
};

// An operation's segments. Most operations have one, kept inline: a plain read or write
// allocates no list (at 64 bytes over Soft-RoCE, each allocation on the path shows).
class Segments {
 public:
  Segments() = default;
  Segments(const Segment &one) : one_(one), n_(1) {}
  Segments(std::vector<Segment> many) : many_(std::move(many)), n_(many_.size()) {}
  Segments(std::initializer_list<Segment> list) : n_(list.size()) {
    if (n_ == 1) one_ = *list.begin();
    else many_.assign(list);
  }
  // A moved-from list is empty (the default move would keep n_ over an emptied vector).
  Segments(Segments &&o) noexcept : one_(o.one_), many_(std::move(o.many_)), n_(o.n_) { o.n_ = 0, o.many_.clear(); }
  Segments &operator=(Segments &&o) noexcept {
    one_ = o.one_, many_ = std::move(o.many_), n_ = o.n_;
    o.n_ = 0, o.many_.clear();
    return *this;
  }
  Segments(const Segments &) = default;
  Segments &operator=(const Segments &) = default;
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  const Segment *begin() const { return many_.empty() ? &one_ : many_.data(); }
  const Segment *end() const { return begin() + n_; }
  const Segment &operator[](size_t i) const { return begin()[i]; }

 private:
  Segment one_{};
  std::vector<Segment> many_;
  size_t n_ = 0;
};

}  // namespace libd

// The C handle. It lives inside its operation (no allocation of its own) and holds the reference
// that libd_op_free drops.
struct libd_op {
  std::shared_ptr<libd::Op> op;
};

namespace libd {

class Op {
 public:
  static constexpr unsigned kRoundsPerClockRead = 64;  // caller-driven progress loops
  Op(OpKind kind, Segments segs, Deadline deadline, std::shared_ptr<Stats> stats);

  OpKind kind() const { return kind_; }
  const Segments &segments() const { return segs_; }
  uint64_t bytes() const { return bytes_; }
  Deadline deadline() const { return deadline_; }

  // Called by the transport once; later calls are ignored (a cancel may race a completion).
  // Returns true if this call completed the operation.
  bool complete(int status, std::string why = {});
  // Why it failed, as the engine saw it ("" while running, if it succeeded, or if the engine gave
  // no reason).
  std::string message();
  int status() const { return status_.load(std::memory_order_acquire); }
  bool done() const { return status() != -EINPROGRESS; }
  // status(), after one round of caller-driven progress if the engine polls or has waiters look
  // first (libd_op_poll).
  int poll() {
    if (!(driver_polls_ || driver_looks_first_)) return status();
    bool finished = done();
    // A caller that watches an fd sleeps between its looks: it polls no loop.
    bool watched = watch_fd_.load(std::memory_order_relaxed) >= 0;
    if (finished && watched) return status();
    if (auto d = driver_.lock()) {
      if (finished)
        d->looked(this);
      else if (watched)
        d->progress(this);
      else
        d->poll_progress(this);
    }
    return status();
  }
  // Waits until done or until `until`; returns the status or -ETIMEDOUT for the wait itself.
  int wait_until(Clock::time_point until);

  int cancel();
  // Whether someone waits for it without polling: asleep in a wait, or watching an fd.
  bool waited_for_asleep() const {
    return sleepers_.load(std::memory_order_seq_cst) > 0 || watch_fd_.load(std::memory_order_seq_cst) >= 0;
  }
  // Has libd write to `fd` (an eventfd: 8 bytes, 1) once the operation has completed, at once if
  // it already has; fd < 0 stops that, and returns only when no write to the old fd can come any
  // more (so the caller may close it). For callers that wait in an event loop, not a thread.
  void watch(int fd);
  // The engine's side: cancel() goes to driver->cancel; if `polls`, waiters call
  // driver->progress() in a loop instead of sleeping until someone else completes the operation.
  // Set before the operation is handed to anyone else.
  // `look_first`: a waiter that does not poll runs one round of progress before it sleeps (the
  // completion may be waiting in a queue that only an event would otherwise make anyone read);
  // with `spin_us`, it polls (as libd_op_poll in a loop) for that long before it sleeps.
  void set_driver(std::weak_ptr<OpDriver> driver, bool polls, bool look_first = false, uint32_t spin_us = 0) {
    driver_ = std::move(driver);
    driver_polls_ = polls;
    driver_looks_first_ = look_first;
    spin_us_ = spin_us;
  }
  // The driver's own record of this operation, kept here so that progress(this) finds it
  // without a lookup. Written and read only by the driver, under its own lock.
  void set_driver_state(void *state) { driver_state_ = state; }
  // The engine it was last handed to (a wrapper that handed it on forwards a cancel there).
  std::shared_ptr<OpDriver> driver() const { return driver_.lock(); }
  void *driver_state() const { return driver_state_; }
  // The C handle for `self` (this operation), which it takes over.
  static libd_op *to_handle(std::shared_ptr<Op> self) {
    libd_op *h = &self->handle_;
    h->op = std::move(self);
    return h;
  }

 private:
  OpKind kind_;
  Segments segs_;
  uint64_t bytes_ = 0;
  Deadline deadline_;
  std::shared_ptr<Stats> stats_;
  bool sampled_;  // its latency goes into the histogram (Stats::start_op)
  int64_t start_ns_;
  std::atomic<int> status_{-EINPROGRESS};
  std::atomic<bool> completing_{false};  // complete() runs once
  std::atomic<int> sleepers_{0};         // waiters asleep (on a shared lot: lot_of in op.cc)
  std::atomic<int> watch_fd_{-1};        // watch(): written once done
  std::atomic<int> watch_writers_{0};    // complete() writing to watch_fd_ right now
  void signal_watch();
  std::weak_ptr<OpDriver> driver_;
  bool driver_polls_ = false;
  bool driver_looks_first_ = false;
  uint32_t spin_us_ = 0;  // a waiter that looks first polls this long before it sleeps
  void *driver_state_ = nullptr;
  std::string why_;
  libd_op handle_;
};

}  // namespace libd
