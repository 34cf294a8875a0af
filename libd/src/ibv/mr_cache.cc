#include "ibv/mr_cache.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace libd::ibv {

Mr::~Mr() {
  if (mr) ibv_dereg_mr(mr);
}

int MrCache::acquire(void *addr, size_t len, int access, std::shared_ptr<Mr> *out) {
  uintptr_t lo = uintptr_t(addr), hi = lo + len;
  std::lock_guard<std::mutex> lk(mu_);
  // Candidates start at or before lo; entries whose holders are gone are pruned on the way.
  for (auto it = by_start_.begin(); it != by_start_.end() && it->first <= lo;) {
    std::shared_ptr<Mr> m = it->second.lock();
    if (!m) {
      it = by_start_.erase(it);
      continue;
    }
    if (m->start + m->len >= hi && (m->access & access) == access) {
      hits_++;
      *out = std::move(m);
      return 0;
    }
    ++it;
  }
  ibv_mr *mr = ibv_reg_mr(pd_, addr, len, access);
  if (!mr) {
    int err = errno ? errno : ENOMEM;
    std::string hint = err == ENOMEM || err == EPERM || err == EFAULT
                           ? " (is the locked-memory limit, ulimit -l, large enough?)"
                           : "";
    return set_error(-err, "verbs: cannot register " + std::to_string(len) + " bytes: " + strerror(err) + hint);
  }
  misses_++;
  auto m = std::make_shared<Mr>();
  m->mr = mr;
  m->start = lo;
  m->len = len;
  m->access = access;
  by_start_.emplace(lo, m);
  *out = std::move(m);
  return 0;
}

MrCache::Counters MrCache::counters() {
  std::lock_guard<std::mutex> lk(mu_);
  Counters c;
  c.hits = hits_;
  c.misses = misses_;
  for (auto &[start, w] : by_start_)
    if (!w.expired()) c.live++;
  return c;
}

}  // namespace libd::ibv
