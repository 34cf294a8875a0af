// Little-endian integers, one byte at a time: how every Scad wire format is encoded (never a
// struct cast, so host layout and alignment never reach the wire).
#pragma once
#include <cstdint>

namespace libd::proto {

inline void put_le(char *p, uint64_t v, int n) {
  for (int i = 0; i < n; i++) p[i] = char(v >> (8 * i));
}

inline uint64_t get_le(const char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++) v |= uint64_t(uint8_t(p[i])) << (8 * i);
  return v;
}

}  // namespace libd::proto
