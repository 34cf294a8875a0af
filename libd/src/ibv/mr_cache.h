// Range-aware registration cache. A request for [addr, addr+len) with some access flags is
// served by any live registration that covers the whole range with at least those flags, so a
// buffer registered by one transport costs nothing to register again on another (Python's
// reg(size, other)), and a larger buffer at a reused address never hits a smaller, stale entry.
//
// Entries live exactly as long as someone holds them: the last release deregisters. Keeping
// unused registrations around would be faster for repeat users, but without memory hooks (UCX
// needs its ucm interposer for this) a buffer freed and mapped again at the same address would
// then hit a registration that pins the old pages — silent corruption. rxe has no ODP either.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace libd::ibv {

struct Mr {
  ibv_mr *mr = nullptr;
  uintptr_t start = 0;
  size_t len = 0;
  int access = 0;
  ~Mr();
  uint32_t lkey() const { return mr->lkey; }
};

class MrCache {
 public:
  explicit MrCache(ibv_pd *pd) : pd_(pd) {}

  // 0, or a negative errno with libd_last_error set (ibv_reg_mr failed: locked-memory limit...).
  int acquire(void *addr, size_t len, int access, std::shared_ptr<Mr> *out);

  struct Counters {
    uint64_t hits = 0, misses = 0;
    size_t live = 0;
  };
  Counters counters();

 private:
  ibv_pd *pd_;
  std::mutex mu_;
  std::multimap<uintptr_t, std::weak_ptr<Mr>> by_start_;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace libd::ibv
