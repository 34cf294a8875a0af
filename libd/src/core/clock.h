// Monotonic time and deadlines. Every wait in libd is bounded by a Deadline.
#pragma once
#include <time.h>

#include <chrono>
#include <cstdint>

namespace libd {

using Clock = std::chrono::steady_clock;

// Deadlines are milliseconds apart: they read CLOCK_MONOTONIC_COARSE (same epoch as steady_clock,
// up to one tick behind), which the vDSO answers without touching the clock hardware. A precise
// read costs microseconds where the only clocksource is an emulated HPET (a TCG guest), and every
// operation sets a deadline.
inline Clock::time_point coarse_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

class Deadline {
 public:
  static Deadline after_ms(int64_t ms) { return Deadline(coarse_now() + std::chrono::milliseconds(ms)); }
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at() const { return at_; }
  bool expired() const { return coarse_now() >= at_; }
  int64_t remaining_ms() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - coarse_now()).count();
    return left > 0 ? left : 0;
  }

 private:
  Clock::time_point at_;
};

}  // namespace libd
