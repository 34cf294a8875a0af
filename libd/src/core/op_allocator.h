// Where operations are allocated: a small per-thread cache of blocks in front of the heap.
//
// Every read or write allocates one block (the operation and its reference counts, through
// std::allocate_shared) and frees it when done. With 32 operations in flight glibc's own
// per-thread cache (7 blocks a size) overflows, and each allocation and free then takes its
// general path: a few hundred instructions an operation, which shows at 64 bytes under emulation.
// A block freed on another thread goes to that thread's cache. Sanitizer builds use the heap
// directly, so that a use after free is still caught.
#pragma once
#include <cstddef>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define LIBD_BLOCK_CACHE 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LIBD_BLOCK_CACHE 0
#endif
#endif
#ifndef LIBD_BLOCK_CACHE
#define LIBD_BLOCK_CACHE 1
#endif

namespace libd {

class BlockCache {
 public:
  static void *get(size_t size) {
#if LIBD_BLOCK_CACHE
    if (Cache *c = cache(); c && c->count > 0 && c->size == size) return c->blocks[--c->count];
#endif
    return ::operator new(size);
  }
  static void put(void *p, size_t size) {
#if LIBD_BLOCK_CACHE
    if (Cache *c = cache()) {
      if (c->count == 0) c->size = size;
      if (c->size == size && c->count < kBlocks) {
        c->blocks[c->count++] = p;
        return;
      }
    }
#endif
    ::operator delete(p);
  }

 private:
  static constexpr int kBlocks = 64;
  struct Cache {
    void *blocks[kBlocks];
    size_t size = 0;
    int count = 0;
    ~Cache() {
      while (count > 0) ::operator delete(blocks[--count]);
      current = nullptr;
      gone = true;  // a block freed later in this thread's exit goes to the heap
    }
  };
  // The thread's cache; null once it is destroyed (a block freed later in the thread's exit goes
  // to the heap). Not the initial-exec TLS model, though it would save the __tls_get_addr call:
  // the library is also loaded with dlopen (the Python module), where static TLS may be full (it
  // was). TLS descriptors (-mtls-dialect=gnu2) measured no better under emulation.
  static Cache *cache() {
    if (__builtin_expect(current != nullptr, 1)) return current;
    if (gone) return nullptr;
    thread_local Cache owner;  // destroyed at thread exit
    current = &owner;
    return current;
  }
  static inline thread_local Cache *current = nullptr;
  static inline thread_local bool gone = false;
};

// For std::allocate_shared: every block through BlockCache.
template <class T>
struct OpAllocator {
  using value_type = T;
  OpAllocator() = default;
  template <class U>
  OpAllocator(const OpAllocator<U> &) {}
  T *allocate(size_t n) { return static_cast<T *>(BlockCache::get(n * sizeof(T))); }
  void deallocate(T *p, size_t n) { BlockCache::put(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const OpAllocator<U> &) const { return true; }
};

}  // namespace libd
