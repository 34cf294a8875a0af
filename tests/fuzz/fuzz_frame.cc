// libFuzzer target: the tcp frame decoder as the server and the client run it — a byte stream
// cut into frames, with payloads routed to buffers — plus the AUTH / ATTACH and AUTH_OK /
// ATTACH_OK body decoders and the verbs handshake record (VERBS_CONNECT / VERBS_ACCEPT bodies),
// the rdma_cm ticket (VERBS_CM_TICKET) and the rdma_cm request's private data.
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "proto/auth.h"
#include "proto/frame.h"
#include "ibv/cm.h"
#include "ibv/record.h"

using namespace libd::proto;

namespace {
// A record that decodes encodes back to the very same bytes: one meaning per byte string.
void check_record(const char *p, size_t n) {
  libd::ibv::Record r;
  std::string why;
  if (libd::ibv::decode_record(p, n, &r, &why) == 0 && libd::ibv::encode_record(r) != std::string(p, n)) abort();
}

struct Sink : FrameReader::Handler {
  std::string buf;
  int frames = 0;
  int on_header(const Header &h, char **dest) override {
    uint64_t n = payload_length(h);
    if (n > (1u << 20)) return -EPROTO;  // a real peer refuses what it cannot place
    buf.assign(size_t(n), '\0');
    *dest = buf.data();
    return 0;
  }
  int on_frame(const Header &h) override {
    frames++;
    if (h.opcode == kAuth || h.opcode == kAttach) {
      AuthBody a;
      std::string why;
      decode_auth(buf.data(), buf.size(), &a, &why);
    } else if (h.opcode == kAuthOk || h.opcode == kAttachOk) {
      GrantBody g;
      std::string why;
      decode_grant(buf.data(), buf.size(), &g, &why);
    } else if (h.opcode == kVerbsConnect || h.opcode == kVerbsAccept) {
      check_record(buf.data(), buf.size());
    } else if (h.opcode == kVerbsCmTicket) {
      uint16_t port;
      std::string ticket, why;
      if (libd::ibv::decode_cm_ticket(buf.data(), buf.size(), &port, &ticket, &why) == 0 &&
          libd::ibv::encode_cm_ticket(port, ticket) != buf)
        abort();
    }
    return 0;
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *p = reinterpret_cast<const char *>(data);
  {
    // The rdma_cm REQ's private data, as a memory server's listener reads it.
    std::string ticket, why;
    if (libd::ibv::decode_cm_hello(p, size, &ticket, &why) == 0 &&
        libd::ibv::encode_cm_hello(ticket) != std::string(p, std::min<size_t>(size, libd::ibv::kCmHelloSize)))
      abort();
  }
  // The same stream fed whole and in irregular pieces must give the same frames.
  Sink whole, pieces;
  FrameReader a(&whole), b(&pieces);
  std::string why;
  int ra = a.feed(p, size, &why);
  int rb = 0;
  for (size_t i = 0, step = 1; i < size && rb == 0; i += step, step = step * 3 % 17 + 1)
    rb = b.feed(p + i, std::min(step, size - i), &why);
  if ((ra == 0) != (rb == 0)) abort();
  if (ra == 0 && whole.frames != pieces.frames) abort();
  if (size >= libd::ibv::kRecordSize) check_record(p, libd::ibv::kRecordSize);
  if (size >= kHeaderSize) {
    Header h;
    if (decode_header(p, &h, &why) == 0) {
      char again[kHeaderSize];
      encode_header(h, again);
      Header h2;
      if (decode_header(again, &h2, &why) != 0 || h2.size != h.size || h2.addr != h.addr) abort();
    }
  }
  return 0;
}
