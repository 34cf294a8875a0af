#include "proto/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "proto/le.h"
#include "proto/random_pool.h"

namespace libd::proto {
namespace {

void put(std::string *s, uint64_t v, int n) {
  char b[8];
  put_le(b, v, n);
  s->append(b, size_t(n));
}
uint64_t get(const char *p, int n) { return get_le(p, n); }

// HMAC-SHA256 (RFC 2104) over a digest fetched once. OpenSSL 3's one-shot HMAC() looks the
// algorithm up on every call, which cost more than the hashing itself: a grant, an attachment and
// its check each compute one.
const EVP_MD *sha256() {
  static const EVP_MD *md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

struct MdCtx {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  ~MdCtx() { EVP_MD_CTX_free(ctx); }
};

// Empty if OpenSSL fails (out of memory, no SHA-256 provider): an empty MAC never matches
// (macs_equal), so a failure refuses rather than admits. Key material is wiped before returning.
std::string hmac_sha256(const std::string &key, const std::string &msg) {
  thread_local MdCtx c;
  const EVP_MD *md = sha256();
  if (!md || !c.ctx) return std::string();
  unsigned char k[64] = {0}, pad[64], inner[EVP_MAX_MD_SIZE], out[EVP_MAX_MD_SIZE];
  unsigned int n = 0, m = 0;
  bool ok = true;
  if (key.size() > sizeof k) {
    ok = EVP_DigestInit_ex(c.ctx, md, nullptr) == 1 && EVP_DigestUpdate(c.ctx, key.data(), key.size()) == 1 &&
         EVP_DigestFinal_ex(c.ctx, k, &n) == 1;
  } else {
    std::memcpy(k, key.data(), key.size());
  }
  for (size_t i = 0; i < sizeof pad; i++) pad[i] = k[i] ^ 0x36;
  ok = ok && EVP_DigestInit_ex(c.ctx, md, nullptr) == 1 && EVP_DigestUpdate(c.ctx, pad, sizeof pad) == 1 &&
       EVP_DigestUpdate(c.ctx, msg.data(), msg.size()) == 1 && EVP_DigestFinal_ex(c.ctx, inner, &n) == 1;
  for (size_t i = 0; i < sizeof pad; i++) pad[i] = k[i] ^ 0x5c;
  ok = ok && EVP_DigestInit_ex(c.ctx, md, nullptr) == 1 && EVP_DigestUpdate(c.ctx, pad, sizeof pad) == 1 &&
       EVP_DigestUpdate(c.ctx, inner, n) == 1 && EVP_DigestFinal_ex(c.ctx, out, &m) == 1;
  std::string mac = ok ? std::string(reinterpret_cast<char *>(out), m) : std::string();
  OPENSSL_cleanse(k, sizeof k);
  OPENSSL_cleanse(pad, sizeof pad);
  OPENSSL_cleanse(inner, sizeof inner);
  return mac;
}

}  // namespace

std::string encode_auth(const AuthBody &a) {
  std::string s;
  put(&s, a.grant_id.size(), 2);
  s += a.grant_id;
  put(&s, a.client_id.size(), 2);
  s += a.client_id;
  s += a.mac;
  return s;
}

int decode_auth(const char *p, size_t n, AuthBody *out, std::string *why) {
  size_t i = 0;
  std::string fields[2];
  for (auto &f : fields) {
    if (n - i < 2) { *why = "AUTH body truncated"; return -EPROTO; }
    size_t len = size_t(get(p + i, 2));
    i += 2;
    if (len == 0 || len > 256 || n - i < len) { *why = "AUTH body: bad field length"; return -EPROTO; }
    f.assign(p + i, len);
    i += len;
  }
  if (n - i != kMacSize) { *why = "AUTH body: bad mac length"; return -EPROTO; }
  out->grant_id = fields[0];
  out->client_id = fields[1];
  out->mac.assign(p + i, kMacSize);
  return 0;
}

std::string encode_grant(const GrantBody &g) {
  std::string s;
  put(&s, g.element_size, 8);
  put(&s, g.offset, 8);
  put(&s, g.length, 8);
  put(&s, g.rights, 4);
  if (g.cma_pid) {
    put(&s, g.cma_pid, 4);
    put(&s, g.cma_base, 8);
    if (g.cma_table || g.cma_ranges) {
      put(&s, g.cma_table, 8);
      put(&s, g.cma_slots, 4);
    }
    if (g.cma_ranges) put(&s, g.cma_ranges, 4);
  }
  return s;
}

int decode_grant(const char *p, size_t n, GrantBody *out, std::string *why) {
  if (n != kGrantBodySize && n != kGrantBodyCmaSize && n != kGrantBodyCmaTableSize && n != kGrantBodyCmaRangesSize) {
    *why = "AUTH_OK body of wrong size";
    return -EPROTO;
  }
  out->element_size = get(p, 8);
  out->offset = get(p + 8, 8);
  out->length = get(p + 16, 8);
  out->rights = uint32_t(get(p + 24, 4));
  bool cma = n >= kGrantBodyCmaSize;
  out->cma_pid = cma ? uint32_t(get(p + 28, 4)) : 0;
  out->cma_base = cma ? get(p + 32, 8) : 0;
  bool table = n >= kGrantBodyCmaTableSize;
  out->cma_table = table ? get(p + 40, 8) : 0;
  out->cma_slots = table ? uint32_t(get(p + 48, 4)) : 0;
  out->cma_ranges = n == kGrantBodyCmaRangesSize ? uint32_t(get(p + 52, 4)) : 0;
  if (cma && (out->cma_pid == 0 || out->cma_base > UINT64_MAX - out->element_size)) {
    *why = "AUTH_OK describes an impossible cross-memory grant";
    return -EPROTO;
  }
  if (n == kGrantBodyCmaRangesSize &&
      (out->cma_ranges == 0 || out->cma_ranges > kMaxLentRanges ||
       out->cma_base > UINT64_MAX - uint64_t(out->cma_ranges) * sizeof(CmaRange) || out->offset != 0 ||
       out->length != out->element_size)) {
    *why = "AUTH_OK describes an impossible table of lent ranges";
    return -EPROTO;
  }
  // Without a grant table (a plain connection's answer about ranges) both of its fields are 0.
  bool no_table = n == kGrantBodyCmaRangesSize && out->cma_table == 0 && out->cma_slots == 0;
  if (table && !no_table &&
      (out->cma_table == 0 || out->cma_slots == 0 || out->cma_slots > kCmaMaxSlots ||
       out->cma_table > UINT64_MAX - uint64_t(out->cma_slots) * sizeof(CmaSlot))) {
    *why = "AUTH_OK describes an impossible grant table";
    return -EPROTO;
  }
  if (out->offset > out->element_size || out->length > out->element_size - out->offset || out->rights > 3) {
    *why = "AUTH_OK describes an impossible grant";
    return -EPROTO;
  }
  return 0;
}

std::string compute_mac(const std::string &secret, const std::string &nonce, const std::string &grant_id,
                        const std::string &client_id) {
  std::string msg = "scad-auth-v1";
  msg += nonce;
  put(&msg, grant_id.size(), 2);
  msg += grant_id;
  put(&msg, client_id.size(), 2);
  msg += client_id;
  return hmac_sha256(secret, msg);
}

std::string cma_tag(const std::string &secret, const std::string &grant_id, const std::string &client,
                    bool ranges) {
  std::string msg = ranges ? "scad-cma-ranges-v1" : "scad-cma-slot-v1";
  put(&msg, grant_id.size(), 2);
  msg += grant_id;
  put(&msg, client.size(), 2);
  msg += client;
  return hmac_sha256(secret, msg).substr(0, 16);
}

int64_t cma_slot_of(const std::string &grant_id) {
  auto us = grant_id.rfind('_');
  if (us == std::string::npos || us + 1 >= grant_id.size() || grant_id.size() - us > 6) return -1;
  int64_t v = 0;
  for (size_t i = us + 1; i < grant_id.size(); i++) {
    if (grant_id[i] < '0' || grant_id[i] > '9') return -1;
    v = v * 10 + (grant_id[i] - '0');
  }
  return v < int64_t(kCmaMaxSlots) ? v : -1;
}

bool macs_equal(const std::string &a, const std::string &b) {
  return !a.empty() && a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string random_bytes(size_t n) {
  std::string s(n, '\0');
  if (take_pooled_random(s.data(), n)) return s;
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(&s[got], n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      // getrandom(2) is in every kernel we support; random_device reads the same CSPRNG.
      std::random_device rd;
      for (; got < n; got++) s[got] = char(rd());
      break;
    }
    got += size_t(r);
  }
  return s;
}

std::string to_hex(const std::string &bytes) {
  static const char hex[] = "0123456789abcdef";
  // Sized once: a grant's id and secret are written out for every buffer lent.
  std::string s(bytes.size() * 2, '\0');
  for (size_t i = 0; i < bytes.size(); i++) {
    unsigned char c = static_cast<unsigned char>(bytes[i]);
    s[2 * i] = hex[c >> 4];
    s[2 * i + 1] = hex[c & 15];
  }
  return s;
}

bool from_hex(const std::string &hex, std::string *bytes) {
  if (hex.size() % 2) return false;
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (size_t i = 0; i < hex.size(); i += 2) {
    int hi = val(hex[i]), lo = val(hex[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out += char(hi * 16 + lo);
  }
  *bytes = std::move(out);
  return true;
}

}  // namespace libd::proto
