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
};
constexpr size_t kGrantBodySize = 28;
constexpr size_t kGrantBodyCmaSize = 40;  // with cma_pid and cma_base

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
