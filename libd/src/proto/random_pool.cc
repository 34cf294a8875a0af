#include "proto/random_pool.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

namespace libd::proto {
namespace {

constexpr size_t kPage = 4096;

// Laid out in the page itself, so that the fork's wipe resets all of it: a zeroed pool is an
// empty one with an unlocked lock.
struct Pool {
  pthread_mutex_t mu;
  uint32_t left;  // the unread bytes: the last `left` of `bytes`
  unsigned char bytes[kPage - sizeof(pthread_mutex_t) - sizeof(uint32_t) - 8];
};
static_assert(sizeof(Pool) <= kPage, "the pool is one page");

bool zero_is_an_unlocked_mutex() {
  // glibc's PTHREAD_MUTEX_INITIALIZER is all zero bytes; anywhere it is not, no pool.
  pthread_mutex_t initial = PTHREAD_MUTEX_INITIALIZER;
  static const unsigned char zeros[sizeof(pthread_mutex_t)] = {};
  return std::memcmp(&initial, zeros, sizeof initial) == 0;
}

Pool *make_pool() {
  if (!zero_is_an_unlocked_mutex()) return nullptr;
  void *page = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return nullptr;
  if (madvise(page, kPage, MADV_WIPEONFORK) != 0) {  // (Linux 4.14 and later)
    munmap(page, kPage);
    return nullptr;
  }
  (void)madvise(page, kPage, MADV_DONTDUMP);  // what is in it becomes secrets: out of core dumps too
  return static_cast<Pool *>(page);  // zero-filled: empty, unlocked
}

Pool *pool() {
  static Pool *const p = make_pool();
  return p;
}

bool refill_locked(Pool *p) {
  size_t got = 0;
  while (got < sizeof p->bytes) {
    ssize_t r = getrandom(p->bytes + got, sizeof p->bytes - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      std::memset(p->bytes, 0, got);
      p->left = 0;
      return false;
    }
    got += size_t(r);
  }
  p->left = uint32_t(sizeof p->bytes);
  return true;
}

}  // namespace

bool take_pooled_random(void *out, size_t n) {
  if (n > kRandomPoolSlice) return false;
  Pool *p = pool();
  if (!p) return false;
  pthread_mutex_lock(&p->mu);
  if (p->left < n && !refill_locked(p)) {
    pthread_mutex_unlock(&p->mu);
    return false;
  }
  unsigned char *slice = p->bytes + (p->left - n);
  std::memcpy(out, slice, n);
  explicit_bzero(slice, n);  // handed out once: nothing in memory says what it was
  p->left -= uint32_t(n);
  pthread_mutex_unlock(&p->mu);
  return true;
}

}  // namespace libd::proto
