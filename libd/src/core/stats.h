// Per-transport counters: lock-free, updated on every completed operation.
#pragma once
#include <atomic>
#include <cstdint>

#include "libd.h"

namespace libd {

enum class OpKind { Read, Write };

class Stats {
 public:
  // An operation starts (counted in flight until it is recorded). Returns whether it is timed:
  // one in kLatencySampleEvery, and every one until one has been timed successfully. Timing every
  // one costs two clock reads per operation (microseconds each on an emulated HPET).
  static constexpr uint64_t kLatencySampleEvery = 64;
  bool start_op() {
    return started_.fetch_add(1, std::memory_order_relaxed) % kLatencySampleEvery == 0 ||
           !timed_any_.load(std::memory_order_relaxed);
  }
  // Takes back a start_op() whose operation never ran (the direct path declined it).
  void unstart_op() { started_.fetch_sub(1, std::memory_order_relaxed); }
  // An operation ends; latency_ns < 0: not sampled (counted, not timed).
  void record(OpKind kind, uint64_t bytes, int64_t latency_ns, bool ok);
  // Started and not yet recorded. Exact when no operation can start meanwhile (the transport's
  // exclusive I/O lock); otherwise an upper bound.
  uint64_t in_flight() const;
  void snapshot(libd_stats *out) const;
  // Time spent in operations, in nanoseconds: the timed ones' sum scaled to every operation that
  // succeeded (exact while every one is timed, an estimate from the sample after that).
  uint64_t busy_ns() const;

 private:
  std::atomic<uint64_t> read_ops_{0}, write_ops_{0}, read_bytes_{0}, write_bytes_{0}, errors_{0};
  std::atomic<uint64_t> hist_[LIBD_HIST_BUCKETS] = {};
  std::atomic<uint64_t> started_{0};
  std::atomic<bool> timed_any_{false};
  std::atomic<uint64_t> timed_ops_{0}, timed_ns_{0};
};

}  // namespace libd
