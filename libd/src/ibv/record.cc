#include "ibv/record.h"

#include <cerrno>
#include <cstring>

#include "proto/le.h"

namespace libd::ibv {
namespace {
inline void put(char *p, uint64_t v, int n) { proto::put_le(p, v, n); }
inline uint64_t get(const char *p, int n) { return proto::get_le(p, n); }
}  // namespace

std::string encode_record(const Record &r) {
  std::string s(kRecordSize, '\0');
  char *p = s.data();
  put(p, kRecordMagic, 2);
  put(p + 2, kRecordVersion, 1);
  put(p + 3, r.flags, 1);
  put(p + 4, r.qpn, 4);
  put(p + 8, r.psn, 4);
  put(p + 12, r.mtu, 1);
  put(p + 13, r.port, 1);
  put(p + 14, r.lid, 2);
  std::memcpy(p + 16, r.gid, 16);
  put(p + 32, r.addr, 8);
  put(p + 40, r.length, 8);
  put(p + 48, r.rkey, 4);
  put(p + 52, r.rights, 4);
  put(p + 56, r.rd_atomic, 4);
  return s;
}

int decode_record(const char *p, size_t n, Record *out, std::string *why) {
  auto bad = [&](std::string w) {
    *why = "verbs handshake record: " + std::move(w);
    return -EPROTO;
  };
  if (n != kRecordSize) return bad(std::to_string(n) + " bytes, expected " + std::to_string(kRecordSize));
  if (get(p, 2) != kRecordMagic) return bad("bad magic");
  if (get(p + 2, 1) != kRecordVersion)
    return bad("version " + std::to_string(get(p + 2, 1)) + " (this side speaks 1)");
  Record r;
  r.flags = uint8_t(get(p + 3, 1));
  r.qpn = uint32_t(get(p + 4, 4));
  r.psn = uint32_t(get(p + 8, 4));
  r.mtu = uint8_t(get(p + 12, 1));
  r.port = uint8_t(get(p + 13, 1));
  r.lid = uint16_t(get(p + 14, 2));
  std::memcpy(r.gid, p + 16, 16);
  r.addr = get(p + 32, 8);
  r.length = get(p + 40, 8);
  r.rkey = uint32_t(get(p + 48, 4));
  r.rights = uint32_t(get(p + 52, 4));
  r.rd_atomic = uint32_t(get(p + 56, 4));
  if (r.flags & ~kRecordFlagMemoryWindow) return bad("unknown flags");
  if (r.qpn == 0 || r.qpn > 0xFFFFFF) return bad("queue pair number out of range");
  if (r.psn > 0xFFFFFF) return bad("PSN out of range");
  if (r.mtu < 1 || r.mtu > 5) return bad("MTU code " + std::to_string(r.mtu) + " out of range");
  if (r.rights & ~3u) return bad("unknown rights");
  if (r.addr > UINT64_MAX - r.length) return bad("address range wraps around");
  if (r.rd_atomic == 0 || r.rd_atomic > 65536) return bad("rd_atomic out of range");
  if (get(p + 60, 4) != 0) return bad("reserved field is not zero");
  *out = r;
  return 0;
}

}  // namespace libd::ibv
