// The verbs handshake record, version 1: what each end of a reliable connection tells the other.
// 64 bytes, little-endian, encoded field by field — never a host struct or a pointer:
//
//   off size field
//    0   2   magic       0x5652 ("RV" on the wire)
//    2   1   version     1
//    3   1   flags       bit 0: the key is a type-2 memory window bound to this queue pair
//    4   4   qpn         queue pair number (24 bits)
//    8   4   psn         first packet sequence number (24 bits)
//   12   1   mtu         path MTU, IBV_MTU_* (1..5 = 256..4096 bytes)
//   13   1   port        the sender's port (informational)
//   14   2   lid         InfiniBand LID (0 on RoCE)
//   16  16   gid         the sender's GID (RoCE / routed IB)
//   32   8   addr        server: remote virtual address of the granted range (client: 0)
//   40   8   length      server: bytes the key covers (client: 0)
//   48   4   rkey        server: the key for RDMA READ/WRITE (client: 0)
//   52   4   rights      server: LIBD_RIGHT_* the key allows (client: 0)
//   56   4   rd_atomic   outstanding RDMA READs this end accepts as responder
//   60   4   reserved    0
//
// The client sends its record in VERBS_CONNECT on the memory element's authenticated control
// connection; the server answers VERBS_ACCEPT with its own (see proto/frame.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace libd::ibv {

constexpr size_t kRecordSize = 64;
constexpr uint16_t kRecordMagic = 0x5652;
constexpr uint8_t kRecordVersion = 1;
constexpr uint8_t kRecordFlagMemoryWindow = 1;

struct Record {
  uint8_t flags = 0;
  uint32_t qpn = 0;
  uint32_t psn = 0;
  uint8_t mtu = 0;
  uint8_t port = 0;
  uint16_t lid = 0;
  uint8_t gid[16] = {};
  uint64_t addr = 0;
  uint64_t length = 0;
  uint32_t rkey = 0;
  uint32_t rights = 0;
  uint32_t rd_atomic = 0;
};

std::string encode_record(const Record &r);
// 0, or -EPROTO with *why (size, magic, version, a field out of range).
int decode_record(const char *p, size_t n, Record *out, std::string *why);

}  // namespace libd::ibv
