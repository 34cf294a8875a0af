#include "core/op.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>

namespace libd {

namespace {
// Where waiters that do not poll sleep: a few lots shared by all operations, chosen by address,
// rather than a mutex and a condition variable in each (which every operation would construct
// and destroy, though most are never slept on). A wake-up on a shared lot may wake another
// operation's waiter too; it looks at its own status and sleeps again.
struct Lot {
  std::mutex mu;
  std::condition_variable cv;
};
constexpr size_t kLots = 64;
Lot &lot_of(const Op *op) {
  static Lot lots[kLots];
  return lots[(reinterpret_cast<uintptr_t>(op) / alignof(std::max_align_t)) % kLots];
}
}  // namespace

Op::Op(OpKind kind, Segments segs, Deadline deadline, std::shared_ptr<Stats> stats)
    : kind_(kind), segs_(std::move(segs)), deadline_(deadline), stats_(std::move(stats)),
      sampled_(stats_ && stats_->start_op()), start_ns_(sampled_ ? now_ns() : 0) {
  for (const auto &s : segs_) bytes_ += s.size;
}

// Lock-free unless someone sleeps: the completer publishes the status, then looks for sleepers;
// a sleeper registers, then looks at the status. Both sequentially consistent, so at least one
// of them sees the other (no lost wake-up).
bool Op::complete(int status, std::string why) {
  if (completing_.exchange(true, std::memory_order_acq_rel)) return false;  // a cancel raced a completion: the first one wins
  why_ = std::move(why);  // published by the status store below
  // Accounting before the operation is seen done: a waiter that wakes finds the counters (and
  // the transport's in-flight count, which they give) already up to date.
  if (stats_) stats_->record(kind_, bytes_, sampled_ ? now_ns() - start_ns_ : -1, status == 0);
  status_.store(status, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    Lot &lot = lot_of(this);
    std::lock_guard<std::mutex> lk(lot.mu);  // a sleeper between its check and its wait holds it
    lot.cv.notify_all();
  }
  if (watch_fd_.load(std::memory_order_seq_cst) >= 0) signal_watch();
  return true;
}

// The status is published before the watcher's fd is read, and watch() stores the fd before it
// reads the status: one of the two sees the other (a second write is harmless).
void Op::signal_watch() {
  watch_writers_.fetch_add(1, std::memory_order_seq_cst);
  int fd = watch_fd_.load(std::memory_order_seq_cst);
  if (fd >= 0) {
    uint64_t one = 1;
    ssize_t n = ::write(fd, &one, sizeof one);
    (void)n;  // EAGAIN: the counter is already non-zero, the watcher wakes anyway
  }
  watch_writers_.fetch_sub(1, std::memory_order_seq_cst);
}

void Op::watch(int fd) {
  if (fd < 0) {
    watch_fd_.store(-1, std::memory_order_seq_cst);
    while (watch_writers_.load(std::memory_order_seq_cst) > 0) std::this_thread::yield();
    return;
  }
  watch_fd_.store(fd, std::memory_order_seq_cst);
  if (done()) {
    signal_watch();
    return;
  }
  // The caller will sleep until the fd is written: whoever completes the operation must watch.
  if (driver_looks_first_ || driver_polls_)
    if (auto d = driver_.lock()) d->polling_stopped();
}

int Op::wait_until(Clock::time_point until) {
  int s = status();
  if (s != -EINPROGRESS) return s;
  if (std::shared_ptr<OpDriver> d = driver_polls_ ? driver_.lock() : nullptr) {
    // The clock is read every so many rounds, not every round: progress is cheap, clocks may not be.
    for (unsigned round = 0; (s = status()) == -EINPROGRESS; round++) {
      if (round % kRoundsPerClockRead == 0 && until != Clock::time_point::max() && Clock::now() >= until)
        return -ETIMEDOUT;
      d->progress(this);
    }
    return s;
  }
  if (driver_looks_first_) {
    if (std::shared_ptr<OpDriver> d = driver_.lock()) {
      if (spin_us_ == 0) {
        d->progress(this);
      } else {
        // A caller that trades a core for latency (the transport's busy_poll_us): it polls, as
        // libd_op_poll in a loop would, so that the completion needs no thread woken, then sleeps.
        // At least one look, whatever the timeout (a wait of 0 takes what has come).
        auto spin_end = std::min(until, Clock::now() + std::chrono::microseconds(spin_us_));
        for (unsigned round = 0; status() == -EINPROGRESS; round++) {
          if (round > 0 && (round == 1 || round % kRoundsPerClockRead == 0) && Clock::now() >= spin_end) break;
          // Between looks the core goes to anything else ready to run on it (the server this
          // operation waits for may be one, on this host): a poller that never yields holds it
          // off until the spin runs out. On an idle core the yield returns at once.
          if (round > 0) sched_yield();
          d->poll_progress(this);
        }
        if ((s = status()) != -EINPROGRESS) {
          d->wait_polled(this);
          return s;
        }
      }
      if ((s = status()) != -EINPROGRESS) return s;
      d->polling_stopped();  // this thread sleeps now: whoever completes the operation must watch
    }
    if ((s = status()) != -EINPROGRESS) return s;
  }
  // A wait that is over already only looks (a timed wait past its deadline still sleeps out the
  // kernel's timer slack).
  if (until != Clock::time_point::max() && Clock::now() >= until) return -ETIMEDOUT;
  Lot &lot = lot_of(this);
  std::unique_lock<std::mutex> lk(lot.mu);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  bool done = lot.cv.wait_until(lk, until, [&] { return status_.load(std::memory_order_seq_cst) != -EINPROGRESS; });
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  return done ? status() : -ETIMEDOUT;
}

int Op::cancel() {
  if (done()) return status();
  // Detaches from the engine; the engine will not touch our buffers after.
  if (auto d = driver_.lock()) d->cancel(this);
  if (!complete(-ECANCELED)) wait_until(Clock::time_point::max());  // a completion is landing now
  return status();
}

std::string Op::message() {
  return done() ? why_ : std::string();  // written once, before the status
}

}  // namespace libd
