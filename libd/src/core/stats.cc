#include "core/stats.h"

#include <cstring>

namespace libd {

void Stats::record(OpKind kind, uint64_t bytes, int64_t latency_ns, bool ok) {
  constexpr auto relaxed = std::memory_order_relaxed;
  if (!ok) { errors_.fetch_add(1, relaxed); return; }
  if (kind == OpKind::Read) {
    read_ops_.fetch_add(1, relaxed);
    read_bytes_.fetch_add(bytes, relaxed);
  } else {
    write_ops_.fetch_add(1, relaxed);
    write_bytes_.fetch_add(bytes, relaxed);
  }
  if (latency_ns < 0) return;
  uint64_t ns = latency_ns > 0 ? uint64_t(latency_ns) : 1;
  timed_ops_.fetch_add(1, relaxed);
  timed_ns_.fetch_add(ns, relaxed);
  int bucket = 63 - __builtin_clzll(ns);
  if (bucket >= LIBD_HIST_BUCKETS) bucket = LIBD_HIST_BUCKETS - 1;
  hist_[bucket].fetch_add(1, relaxed);
  timed_any_.store(true, relaxed);
}

uint64_t Stats::busy_ns() const {
  uint64_t timed = timed_ops_.load(), ns = timed_ns_.load();
  if (timed == 0) return 0;
  uint64_t ops = read_ops_.load() + write_ops_.load();
  return uint64_t(double(ns) * double(ops > timed ? ops : timed) / double(timed));
}

uint64_t Stats::in_flight() const {
  // Ended first, then started: a start in between can only make the figure larger.
  uint64_t ended = read_ops_.load() + write_ops_.load() + errors_.load();
  uint64_t started = started_.load();
  return started > ended ? started - ended : 0;
}

void Stats::snapshot(libd_stats *out) const {
  std::memset(out, 0, sizeof *out);
  out->read_ops = read_ops_.load();
  out->write_ops = write_ops_.load();
  out->read_bytes = read_bytes_.load();
  out->write_bytes = write_bytes_.load();
  out->errors = errors_.load();
  for (int i = 0; i < LIBD_HIST_BUCKETS; i++) out->latency_ns_hist[i] = hist_[i].load();
}

}  // namespace libd

extern "C" uint64_t libd_stats_percentile_ns(const libd_stats *s, double p) {
  if (!s) return 0;
  uint64_t total = 0;
  for (int i = 0; i < LIBD_HIST_BUCKETS; i++) total += s->latency_ns_hist[i];
  if (total == 0) return 0;
  if (p < 0) p = 0;
  if (p > 1) p = 1;
  uint64_t rank = uint64_t(p * double(total - 1)) + 1, seen = 0;
  for (int i = 0; i < LIBD_HIST_BUCKETS; i++) {
    seen += s->latency_ns_hist[i];
    if (seen >= rank) return (1ull << i) + (1ull << i) / 2;
  }
  return 0;
}
