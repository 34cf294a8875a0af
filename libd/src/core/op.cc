#include "core/op.h"

namespace libd {

Op::Op(OpKind kind, Segments segs, Deadline deadline, std::shared_ptr<Stats> stats)
    : kind_(kind), segs_(std::move(segs)), deadline_(deadline), stats_(std::move(stats)),
      sampled_(stats_ && stats_->sample_latency()), start_ns_(sampled_ ? now_ns() : 0) {
  for (const auto &s : segs_) bytes_ += s.size;
}

// Lock-free unless someone sleeps on the condition variable: the completer publishes the status,
// then looks for sleepers; a sleeper registers, then looks at the status. Both sequentially
// consistent, so at least one of them sees the other (no lost wake-up).
bool Op::complete(int status, std::string why) {
  if (completing_.exchange(true, std::memory_order_acq_rel)) return false;  // a cancel raced a completion: the first one wins
  why_ = std::move(why);  // published by the status store below
  // Accounting before the operation is seen done: a waiter that wakes finds the counters and the
  // transport's in-flight count already up to date (it may re-register at once, read stats, ...).
  if (stats_) stats_->record(kind_, bytes_, sampled_ ? now_ns() - start_ns_ : -1, status == 0);
  if (on_done_) on_done_();
  status_.store(status, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lk(mu_);  // a sleeper between its check and its wait holds mu_
    cv_.notify_all();
  }
  return true;
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
  std::unique_lock<std::mutex> lk(mu_);
  sleepers_.fetch_add(1, std::memory_order_seq_cst);
  bool done = cv_.wait_until(lk, until, [&] { return status_.load(std::memory_order_seq_cst) != -EINPROGRESS; });
  sleepers_.fetch_sub(1, std::memory_order_relaxed);
  return done ? status() : -ETIMEDOUT;
}

void Op::set_canceller(std::function<void(Op *)> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  canceller_ = std::move(fn);
}

int Op::cancel() {
  std::function<void(Op *)> fn;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (status() != -EINPROGRESS) return status();
    fn = canceller_;
  }
  // Detaches from the engine; the engine will not touch our buffers after.
  if (auto d = driver_.lock()) d->cancel(this);
  else if (fn) fn(this);
  if (!complete(-ECANCELED)) wait_until(Clock::time_point::max());  // a completion is landing now
  return status();
}

}  // namespace libd

namespace libd {
std::string Op::message() {
  return done() ? why_ : std::string();  // written once, before the status
}
}  // namespace libd
