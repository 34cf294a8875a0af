// Monotonic time and deadlines. Every wait in libd is bounded by a Deadline.
#pragma once
#include <chrono>
#include <cstdint>

namespace libd {

using Clock = std::chrono::steady_clock;

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

class Deadline {
 public:
  static Deadline after_ms(int64_t ms) { return Deadline(Clock::now() + std::chrono::milliseconds(ms)); }
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  int64_t remaining_ms() const {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    return left > 0 ? left : 0;
  }

 private:
  Clock::time_point at_;
};

}  // namespace libd
