// The authenticated handshake. The server opens with CHALLENGE (a 32-byte random nonce); the
// client answers AUTH with its grant id, its client (action) id and
//   mac = HMAC-SHA256(secret, "scad-auth-v1" | nonce | grant_id | client_id);
// the server checks the mac in constant time and answers AUTH_OK with the grant it holds. The
// secret never crosses the wire, and a mac is useless for any other connection (fresh nonce).
#pragma once
#include <cstdint>
#include <string>

namespace libd::proto {

constexpr size_t kNonceSize = 32;
constexpr size_t kMacSize = 32;

struct AuthBody {
  std::string grant_id;
  std::string client_id;
  std::string mac;  // kMacSize bytes
};

struct GrantBody {  // AUTH_OK
  uint64_t element_size = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint32_t rights = 0;
  // Only on a unix socket, for memory the owner's caller lent (no memfd to pass): the owner's
  // process and the element's address there, for cross-memory attach (process_vm_readv/writev).
  // The kernel's ptrace rule decides whether the peer may attach; these two numbers open nothing.
  uint32_t cma_pid = 0;
  uint64_t cma_base = 0;
  // Only in a unix session's AUTH_OK, where the owner keeps a grant table (cma_table): where the
  // table is in the owner's process and how many slots it has. A peer checks a slotted grant
  // there itself, by cross-memory attach, instead of asking (see CmaSlot).
  uint64_t cma_table = 0;
  uint32_t cma_slots = 0;
  // Memory lent as several ranges (one element over a list of buffers): how many. cma_base is
  // then the address of their table in the owner's process (CmaRange[cma_ranges]), which the peer
  // reads once, by cross-memory attach, to find each range.
  uint32_t cma_ranges = 0;
};
constexpr size_t kGrantBodySize = 28;
constexpr size_t kGrantBodyCmaSize = 40;        // with cma_pid and cma_base
constexpr size_t kGrantBodyCmaTableSize = 52;   // and cma_table, cma_slots
constexpr size_t kGrantBodyCmaRangesSize = 56;  // and cma_ranges (cma_table, cma_slots then may be 0)

// One range of memory lent as several (GrantBody::cma_ranges): where it is in the owner's process
// and its bytes. The element's offsets run through the ranges in order.
struct CmaRange {
  uint64_t base;
  uint64_t size;
};
static_assert(sizeof(CmaRange) == 16, "the table's layout is what peers read");
constexpr uint32_t kMaxLentRanges = 1024;  // IOV_MAX: one transfer's system call can name them all

// The owner's grant table for peers on its host (lent memory, a unix socket). A grant on a whole
// lent element gets a slot, and its id ends in "_<slot>". A peer that shares a session with the
// owner (it knows the owner's pid and the table's address from AUTH_OK) attaches such a grant
// without a round trip: it reads the slot from the owner's memory and checks the tag, which only
// the grant's secret (and the action it is for) yields; before each transfer it reads the slot's seq again, which moves
// whenever the owner changes the slot (the grant revoked, expired, withdrawn, the slot reused).
// The owner writes a slot as a seqlock: seq odd while it writes, even once it is stable. Nothing
// here opens memory a same-user peer could not reach anyway (cross-memory attach needs ptrace
// leave); it lets libd's checks in the peer follow the owner's grants as they change.
struct CmaSlot {
  uint64_t seq;     // even: stable; bumped twice by every change
  uint64_t base;    // the grant's first byte in the owner's process
  uint64_t length;  // bytes
  uint32_t rights;
  uint32_t live;    // 1 while the grant is valid
  unsigned char tag[16];
  uint32_t ranges;  // memory lent as several ranges: how many, and base is their table (CmaRange)
  int32_t ended;    // once live is 0: why its last grant ended (-EKEYEXPIRED: expired; else 0)
  unsigned char pad[8];
};
static_assert(sizeof(CmaSlot) == 64, "one cache line per slot");
constexpr uint32_t kCmaMaxSlots = 1u << 16;
// The tag of a grant's slot: HMAC-SHA256(secret, "scad-cma-slot-v1" | grant id | client), first 16
// bytes, where client is the grant's ("*", or the one action it is for): a peer finds its grant's
// tag with its own action id or "*", as the server would admit it.
// A slot naming a list's table of ranges (CmaSlot::ranges) is tagged under another label, so that a
// holder that knows nothing of ranges finds no match, asks the server, and is refused cleanly.
std::string cma_tag(const std::string &secret, const std::string &grant_id, const std::string &client,
                    bool ranges = false);
// The slot a grant id names ("..._<slot>"), or -1.
int64_t cma_slot_of(const std::string &grant_id);

std::string encode_auth(const AuthBody &a);
int decode_auth(const char *p, size_t n, AuthBody *out, std::string *why);
std::string encode_grant(const GrantBody &g);
int decode_grant(const char *p, size_t n, GrantBody *out, std::string *why);

std::string compute_mac(const std::string &secret, const std::string &nonce, const std::string &grant_id,
                        const std::string &client_id);
bool macs_equal(const std::string &a, const std::string &b);  // constant time

std::string random_bytes(size_t n);
std::string to_hex(const std::string &bytes);
bool from_hex(const std::string &hex, std::string *bytes);

}  // namespace libd::proto
