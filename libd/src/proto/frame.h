// The tcp/shm wire protocol, version 1. Every frame starts with a 32-byte little-endian header,
// encoded and decoded field by field (never a struct cast):
//
//   off size field
//    0   2   magic   0x5344 ("DS" on the wire)
//    2   1   version 1
//    3   1   opcode
//    4   4   status  0 or a negative errno (responses)
//    8   8   req_id  chosen by the client, echoed by the server
//   16   8   addr    offset in the memory element (READ/WRITE)
//   24   8   size    bytes of the operation or of the control payload
//
// A payload follows only where payload_length() says: AUTH/CHALLENGE/AUTH_OK bodies, WRITE data,
// and READ_RESP data when status is 0. Client to server: AUTH, READ, WRITE, PING. Server to
// client: CHALLENGE, AUTH_OK, READ_RESP, WRITE_RESP, PONG. GOODBYE (10) is reserved: no version-1
// peer sends it (a server ends a connection by closing it), and a client refuses it as a protocol error.
// VERBS_CONNECT / VERBS_ACCEPT carry the verbs handshake records (64 bytes each) on the same
// authenticated connection; the verbs client then keeps the connection open, idle, as its
// liveness channel, exactly as shm does. VERBS_CM_REQUEST / VERBS_CM_TICKET instead hand out a
// one-shot ticket the client presents in its rdma_cm connection request (verbs/cm.h).
// NOTIFY tells the memory's owner that the grant holder finished: addr carries the caller's
// 64-bit value, status 0 (done) or the negative errno the holder gave up with. It travels on the
// control connection of every transport (tcp's data connection, shm's unix socket, verbs' idle
// tcp connection), after the holder saw its last transfer complete, so the owner never learns
// "done" before the data is in place. It has no answer: the owner's loop records it per grant.
//
// Shared connections (sessions). A client that sets bit 0 of AUTH's addr asks for a session: the
// connection then carries any number of grants of the same server, each an *attachment* with a
// 32-bit handle the client chooses. The AUTH grant is handle 0; ATTACH (addr = the new handle,
// body as AUTH's, its mac over the connection's own nonce) adds one and is answered by ATTACH_OK
// (addr = the handle; status; when 0 the grant body, as AUTH_OK's), unless bit 0 of its req_id asks
// for quiet (only a refusal is answered: a peer on the owner's host that checked the grant in the
// owner's table needs nothing else). READ, WRITE and NOTIFY name
// their attachment in the top 32 bits of req_id (on a connection that is not a session those bits
// are ignored: old clients count their ids from 1). DETACH (addr = handle, no body, no answer)
// ends an attachment; a holder that detaches without a NOTIFY counts as gone, as a closed
// connection does. When the owner revokes a grant, it expires or its memory is withdrawn, the
// server ends its attachments itself and says so with DETACHED (addr = handle, status why), and
// answers a request on an ended attachment with -ECONNRESET; the connection and its other
// attachments go on. A session on the unix socket reaches lent memory only (cross-memory attach).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace libd::proto {

constexpr uint16_t kMagic = 0x5344;
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderSize = 32;
constexpr uint64_t kMaxControlPayload = 4096;
constexpr uint64_t kMaxDataPayload = 1ull << 40;

enum Opcode : uint8_t {
  kChallenge = 1,
  kAuth = 2,
  kAuthOk = 3,
  kRead = 4,
  kReadResp = 5,
  kWrite = 6,
  kWriteResp = 7,
  kPing = 8,
  kPong = 9,
  kGoodbye = 10,
  kVerbsConnect = 11,  // client -> server after AUTH_OK: the client's verbs record (verbs/record.h)
  kVerbsAccept = 12,   // server -> client: status, and the server's record when 0
  kVerbsCmRequest = 13,  // client -> server after AUTH_OK: asks for an rdma_cm ticket (no body)
  kVerbsCmTicket = 14,   // server -> client: status; when 0 the cm port and ticket (verbs/cm.h)
  kNotify = 15,          // client -> server after AUTH_OK: "done" (no body, no answer), see below
  kAttach = 16,          // client -> server on a session: one more grant (see "Shared connections")
  kAttachOk = 17,        // server -> client: status, and the grant when 0
  kDetach = 18,          // client -> server: the attachment is done with (no body, no answer)
  kDetached = 19,        // server -> client: the owner ended the attachment (status: why)
};

constexpr uint64_t kAuthSession = 1;  // AUTH addr bit: make this connection a session
constexpr uint64_t kAttachQuiet = 1;  // ATTACH req_id bit: answer a refusal only (no ATTACH_OK on success)
// The attachment a session request names (top 32 bits of its req_id), and a req_id for one.
inline uint32_t handle_of(uint64_t req_id) { return uint32_t(req_id >> 32); }
inline uint64_t with_handle(uint32_t handle, uint64_t low) { return (uint64_t(handle) << 32) | (low & 0xffffffffu); }

struct Header {
  uint8_t opcode = 0;
  int32_t status = 0;
  uint64_t req_id = 0;
  uint64_t addr = 0;
  uint64_t size = 0;
};

void encode_header(const Header &h, char out[kHeaderSize]);
// The NOTIFY frame (a header alone): the initiator's "done" carrying `value`, or the negative
// errno it gave up with in `status`.
void encode_notify(uint64_t value, int status, char out[kHeaderSize], uint32_t handle = 0);
// 0, or -EPROTO with *why (bad magic, version, opcode, or a size over the limits).
int decode_header(const char in[kHeaderSize], Header *out, std::string *why);
uint64_t payload_length(const Header &h);
const char *opcode_name(uint8_t op);

// Consumes a byte stream and cuts it into frames. The owner says where each payload goes, so
// large payloads land directly in their final buffer (zero copy when the owner reads into
// direct_target()).
class FrameReader {
 public:
  struct Handler {
    virtual ~Handler() = default;
    // A header arrived. Set *dest to where its payload_length(h) bytes go, or nullptr to drop
    // them. Non-zero aborts the stream (protocol error).
    virtual int on_header(const Header &h, char **dest) = 0;
    // The frame (header and payload) is complete.
    virtual int on_frame(const Header &h) = 0;
  };

  explicit FrameReader(Handler *h) : handler_(h) {}

  // Feeds bytes; 0 or the handler's / the decoder's error. *why says what was wrong.
  int feed(const char *data, size_t n, std::string *why);
  // While a payload of at least `min` bytes is still due into a real destination, where the next
  // bytes should be read to; the caller then reports them with advance_direct().
  bool direct_target(size_t min, char **ptr, size_t *len) const;
  int advance_direct(size_t n, std::string *why);
  // Drops the rest of the current payload instead of writing it (the operation was cancelled).
  void discard_current() { dest_ = nullptr; }
  bool in_payload() const { return in_payload_; }
  const Header &current() const { return cur_; }

 private:
  int finish_payload(std::string *why);

  Handler *handler_;
  char hdr_[kHeaderSize];
  size_t hdr_have_ = 0;
  bool in_payload_ = false;
  Header cur_;
  char *dest_ = nullptr;
  uint64_t left_ = 0;  // payload bytes still due
  uint64_t done_ = 0;  // payload bytes received
};

}  // namespace libd::proto
