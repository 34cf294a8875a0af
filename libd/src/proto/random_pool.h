#pragma once
// The kernel's random bytes, fetched a page at a time and handed out a slice at a time.
//
// Every grant takes 40 fresh bytes (its id and secret) and every connection a nonce: a getrandom
// system call each was a fifth of what making a grant costs. The pool is one page, wiped by the
// kernel in a forked child (MADV_WIPEONFORK): a child never hands out bytes its parent has, or
// will, and the lock, kept in that page, is a fresh one there even if a thread of the parent held
// it at the fork. A slice is erased from the page as it is handed out.

#include <cstddef>

namespace libd::proto {

// Fills out[0, n) with random bytes from the pool, refilled from getrandom(2) when it runs low.
// false (out untouched) where there is no pool: n above kRandomPoolSlice, a kernel without
// MADV_WIPEONFORK, or getrandom failing; the caller then asks the kernel itself.
constexpr size_t kRandomPoolSlice = 256;
bool take_pooled_random(void *out, size_t n);

}  // namespace libd::proto
