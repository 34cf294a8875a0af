// Per-transport counters: lock-free, updated on every completed operation.
#pragma once
#include <atomic>
#include <cstdint>

#include "libd.h"

namespace libd {

enum class OpKind { Read, Write };

class Stats {
 public:
  void record(OpKind kind, uint64_t bytes, int64_t latency_ns, bool ok);
  void snapshot(libd_stats *out) const;

 private:
  std::atomic<uint64_t> read_ops_{0}, write_ops_{0}, read_bytes_{0}, write_bytes_{0}, errors_{0};
  std::atomic<uint64_t> hist_[LIBD_HIST_BUCKETS] = {};
};

}  // namespace libd
