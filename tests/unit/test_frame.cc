#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <random>

#include "proto/auth.h"
#include "proto/frame.h"

using namespace libd::proto;

TEST(Frame, HeaderRoundTripIsLittleEndianFieldByField) {
  Header h;
  h.opcode = kWrite;
  h.status = -34;
  h.req_id = 0x0102030405060708ull;
  h.addr = 4096;
  h.size = 65536;
  char buf[kHeaderSize];
  encode_header(h, buf);
  EXPECT_EQ(0x44, uint8_t(buf[0]));
  EXPECT_EQ(0x53, uint8_t(buf[1]));
  EXPECT_EQ(0x08, uint8_t(buf[8]));  // req_id least significant byte first
  Header back;
  std::string why;
  ASSERT_EQ(0, decode_header(buf, &back, &why)) << why;
  EXPECT_EQ(h.opcode, back.opcode);
  EXPECT_EQ(h.status, back.status);
  EXPECT_EQ(h.req_id, back.req_id);
  EXPECT_EQ(h.addr, back.addr);
  EXPECT_EQ(h.size, back.size);
}

TEST(Frame, DecoderRejectsGarbage) {
  Header h;
  h.opcode = kRead;
  char buf[kHeaderSize];
  std::string why;
  Header out;
  encode_header(h, buf);
  buf[0] = 'X';
  EXPECT_EQ(-EPROTO, decode_header(buf, &out, &why));
  EXPECT_NE(std::string::npos, why.find("magic"));
  encode_header(h, buf);
  buf[2] = 9;
  EXPECT_EQ(-EPROTO, decode_header(buf, &out, &why));
  EXPECT_NE(std::string::npos, why.find("version 9"));
  h.opcode = 77;
  encode_header(h, buf);
  EXPECT_EQ(-EPROTO, decode_header(buf, &out, &why));
  h.opcode = kAuth;
  h.size = 1 << 20;  // control bodies are small
  encode_header(h, buf);
  EXPECT_EQ(-EPROTO, decode_header(buf, &out, &why));
  h.opcode = kRead;
  h.size = 100;
  h.addr = UINT64_MAX - 10;  // wraps
  encode_header(h, buf);
  EXPECT_EQ(-EPROTO, decode_header(buf, &out, &why));
}

namespace {
struct Collect : FrameReader::Handler {
  std::vector<Header> frames;
  std::vector<std::string> payloads;
  std::string cur;
  int on_header(const Header &h, char **dest) override {
    cur.assign(size_t(payload_length(h)), '\0');
    *dest = cur.data();
    return 0;
  }
  int on_frame(const Header &h) override {
    frames.push_back(h);
    payloads.push_back(cur);
    return 0;
  }
};
}  // namespace

// A stream of frames cut at every possible place reassembles to the same frames.
TEST(Frame, ReaderReassemblesAnySplit) {
  std::string stream;
  for (int i = 0; i < 5; i++) {
    Header h;
    h.opcode = i % 2 ? kWrite : kRead;
    h.req_id = uint64_t(i);
    h.size = h.opcode == kWrite ? uint64_t(i * 7 + 1) : 64;
    char buf[kHeaderSize];
    encode_header(h, buf);
    stream.append(buf, kHeaderSize);
    if (h.opcode == kWrite) stream.append(size_t(h.size), char('a' + i));
  }
  for (size_t cut = 1; cut < stream.size(); cut++) {
    Collect c;
    FrameReader r(&c);
    std::string why;
    ASSERT_EQ(0, r.feed(stream.data(), cut, &why)) << why;
    ASSERT_EQ(0, r.feed(stream.data() + cut, stream.size() - cut, &why)) << why;
    ASSERT_EQ(5u, c.frames.size());
    EXPECT_EQ(std::string(8, 'b'), c.payloads[1]);
    EXPECT_EQ(std::string(22, 'd'), c.payloads[3]);
  }
}

TEST(Auth, BodiesRoundTripAndTruncationsFail) {
  AuthBody a{"g123", "client-1", std::string(kMacSize, 'm')};
  std::string enc = encode_auth(a);
  AuthBody back;
  std::string why;
  ASSERT_EQ(0, decode_auth(enc.data(), enc.size(), &back, &why));
  EXPECT_EQ("g123", back.grant_id);
  EXPECT_EQ("client-1", back.client_id);
  for (size_t n = 0; n < enc.size(); n++) EXPECT_EQ(-EPROTO, decode_auth(enc.data(), n, &back, &why)) << n;
  GrantBody g{1 << 20, 4096, 8192, 1}, gb;
  std::string genc = encode_grant(g);
  ASSERT_EQ(0, decode_grant(genc.data(), genc.size(), &gb, &why));
  EXPECT_EQ(8192u, gb.length);
  GrantBody impossible{100, 50, 60, 3};
  genc = encode_grant(impossible);
  EXPECT_EQ(-EPROTO, decode_grant(genc.data(), genc.size(), &gb, &why));
}

TEST(Auth, MacDependsOnEveryInput) {
  std::string nonce(kNonceSize, 'n');
  std::string m = compute_mac("secret-secret-secret-secret-0000", nonce, "g1", "c1");
  EXPECT_EQ(kMacSize, m.size());
  EXPECT_FALSE(macs_equal(m, compute_mac("secret-secret-secret-secret-0001", nonce, "g1", "c1")));
  EXPECT_FALSE(macs_equal(m, compute_mac("secret-secret-secret-secret-0000", std::string(kNonceSize, 'o'), "g1", "c1")));
  EXPECT_FALSE(macs_equal(m, compute_mac("secret-secret-secret-secret-0000", nonce, "g2", "c1")));
  EXPECT_FALSE(macs_equal(m, compute_mac("secret-secret-secret-secret-0000", nonce, "g1", "c2")));
  EXPECT_TRUE(macs_equal(m, compute_mac("secret-secret-secret-secret-0000", nonce, "g1", "c1")));
  // The same as OpenSSL's own HMAC-SHA256, for keys shorter and longer than a block.
  for (std::string key : {std::string("k"), std::string(64, 'x'), std::string(200, 'y')}) {
    std::string msg = "scad-auth-v1" + nonce;
    for (std::string field : {"g1", "c1"}) msg += std::string{char(field.size()), '\0'} + field;  // 2-byte LE length
    unsigned char ref[32];
    unsigned int len = 0;
    HMAC(EVP_sha256(), key.data(), int(key.size()), reinterpret_cast<const unsigned char *>(msg.data()), msg.size(),
         ref, &len);
    EXPECT_EQ(std::string(reinterpret_cast<char *>(ref), len), compute_mac(key, nonce, "g1", "c1")) << key.size();
  }
  std::string bytes;
  EXPECT_TRUE(from_hex(to_hex("\x01\xab"), &bytes));
  EXPECT_EQ("\x01\xab", bytes);
  EXPECT_FALSE(from_hex("zz", &bytes));
}

TEST(Frame, NotifyCarriesAValueAndAStatusAndNoBody) {
  Header h;
  h.opcode = kNotify;
  h.addr = 0xfedcba9876543210ull;
  h.status = -ECANCELED;
  char buf[kHeaderSize];
  encode_header(h, buf);
  Header back;
  std::string why;
  ASSERT_EQ(0, decode_header(buf, &back, &why)) << why;
  EXPECT_EQ(kNotify, back.opcode);
  EXPECT_EQ(h.addr, back.addr);
  EXPECT_EQ(-ECANCELED, back.status);
  EXPECT_EQ(0u, payload_length(back));
  EXPECT_STREQ("NOTIFY", opcode_name(kNotify));
  h.opcode = kDetached + 1;  // the last opcode is still the end of the table
  encode_header(h, buf);
  EXPECT_EQ(-EPROTO, decode_header(buf, &back, &why));
}

TEST(Frame, SessionFramesNameTheirAttachment) {
  // A request names its attachment in the top half of req_id; a NOTIFY too.
  uint64_t id = with_handle(7, 0x1234567890ull);
  EXPECT_EQ(7u, handle_of(id));
  EXPECT_EQ(0x34567890u, uint32_t(id));
  char buf[kHeaderSize];
  encode_notify(42, 0, buf, 9);
  Header back;
  std::string why;
  ASSERT_EQ(0, decode_header(buf, &back, &why)) << why;
  EXPECT_EQ(9u, handle_of(back.req_id));
  EXPECT_EQ(42u, back.addr);
  // ATTACH carries a body like AUTH; ATTACH_OK one like AUTH_OK when it grants; DETACH and
  // DETACHED none.
  Header h;
  h.opcode = kAttach;
  h.addr = 3;
  h.size = 100;
  EXPECT_EQ(100u, payload_length(h));
  h.size = kMaxControlPayload + 1;
  encode_header(h, buf);
  EXPECT_EQ(-EPROTO, decode_header(buf, &back, &why));
  h.opcode = kAttachOk;
  h.size = kGrantBodyCmaSize;
  EXPECT_EQ(uint64_t(kGrantBodyCmaSize), payload_length(h));
  h.status = -EACCES;
  EXPECT_EQ(0u, payload_length(h));
  for (uint8_t op : {uint8_t(kDetach), uint8_t(kDetached)}) {
    h.opcode = op;
    h.status = op == kDetached ? -EKEYEXPIRED : 0;
    h.size = 0;
    encode_header(h, buf);
    ASSERT_EQ(0, decode_header(buf, &back, &why)) << why;
    EXPECT_EQ(0u, payload_length(back));
  }
  EXPECT_STREQ("ATTACH", opcode_name(kAttach));
  EXPECT_STREQ("DETACHED", opcode_name(kDetached));
}

TEST(Auth, CrossMemoryGrantBodyRoundTrips) {
  GrantBody g{1 << 20, 0, 1 << 20, 3}, back;
  g.cma_pid = 4242;
  g.cma_base = 0x7f0000001000ull;
  std::string enc = encode_grant(g), why;
  ASSERT_EQ(kGrantBodyCmaSize, enc.size());
  ASSERT_EQ(0, decode_grant(enc.data(), enc.size(), &back, &why)) << why;
  EXPECT_EQ(4242u, back.cma_pid);
  EXPECT_EQ(g.cma_base, back.cma_base);
  for (size_t n = kGrantBodySize + 1; n < enc.size(); n++) EXPECT_EQ(-EPROTO, decode_grant(enc.data(), n, &back, &why)) << n;
  g.cma_base = UINT64_MAX - 10;  // the element would wrap the address space
  enc = encode_grant(g);
  EXPECT_EQ(-EPROTO, decode_grant(enc.data(), enc.size(), &back, &why));
  g.cma_base = 0x7f0000001000ull;
  g.cma_table = 0x7f0000800000ull;  // a unix session's AUTH_OK: the owner's grant table too
  g.cma_slots = 4096;
  enc = encode_grant(g);
  ASSERT_EQ(kGrantBodyCmaTableSize, enc.size());
  ASSERT_EQ(0, decode_grant(enc.data(), enc.size(), &back, &why)) << why;
  EXPECT_EQ(g.cma_table, back.cma_table);
  EXPECT_EQ(4096u, back.cma_slots);
  g.cma_slots = kCmaMaxSlots + 1;
  enc = encode_grant(g);
  EXPECT_EQ(-EPROTO, decode_grant(enc.data(), enc.size(), &back, &why));
  // A list lent as one element: its table's address and how many ranges, with or without a
  // grant table; every impossible variant is refused.
  GrantBody list{3 << 20, 0, 3 << 20, 1};
  list.cma_pid = 4242;
  list.cma_base = 0x7f0000002000ull;
  list.cma_ranges = 3;
  enc = encode_grant(list);
  ASSERT_EQ(kGrantBodyCmaRangesSize, enc.size());
  ASSERT_EQ(0, decode_grant(enc.data(), enc.size(), &back, &why)) << why;
  EXPECT_EQ(3u, back.cma_ranges);
  EXPECT_EQ(0u, back.cma_table);
  list.cma_table = 0x7f0000800000ull;
  list.cma_slots = 16;
  enc = encode_grant(list);
  ASSERT_EQ(0, decode_grant(enc.data(), enc.size(), &back, &why)) << why;
  EXPECT_EQ(16u, back.cma_slots);
  auto refused = [&](GrantBody b) {
    std::string e = encode_grant(b), w;
    GrantBody out;
    return e.size() == kGrantBodyCmaRangesSize && decode_grant(e.data(), e.size(), &out, &w) == -EPROTO;
  };
  GrantBody bad = list;
  bad.cma_ranges = kMaxLentRanges + 1;
  EXPECT_TRUE(refused(bad)) << "more ranges than a list may have";
  bad = list;
  bad.cma_base = UINT64_MAX - 16;  // the table would wrap the address space
  EXPECT_TRUE(refused(bad));
  bad = list;
  bad.offset = 4096;  // a list's grant is whole
  bad.length = (3 << 20) - 4096;
  EXPECT_TRUE(refused(bad));
  bad = list;
  bad.cma_table = 0;  // slots without a table
  EXPECT_TRUE(refused(bad));
  // A body that claims ranges but counts none is refused at its size.
  std::string zero = encode_grant(list);
  zero[52] = zero[53] = zero[54] = zero[55] = 0;
  EXPECT_EQ(-EPROTO, decode_grant(zero.data(), zero.size(), &back, &why));
  // A slot of a list is tagged under its own label: a holder that knows nothing of lists matches
  // nothing there and asks the server.
  EXPECT_NE(cma_tag("secret-secret-secret-secret-0000", "g1_3", "*"),
            cma_tag("secret-secret-secret-secret-0000", "g1_3", "*", true));
  EXPECT_EQ(7, cma_slot_of("g0123456789abcdef_7"));
  EXPECT_EQ(-1, cma_slot_of("g0123456789abcdef"));
  EXPECT_EQ(-1, cma_slot_of("my_grant"));
  EXPECT_EQ(-1, cma_slot_of("g_99999999"));
  std::string t = cma_tag("secret-secret-secret-secret-0000", "g1_3", "*");
  EXPECT_EQ(16u, t.size());
  EXPECT_NE(t, cma_tag("secret-secret-secret-secret-0000", "g1_3", "action-1"));
  EXPECT_NE(t, cma_tag("secret-secret-secret-secret-0001", "g1_3", "*"));
  GrantBody plain{4096, 0, 4096, 1};
  enc = encode_grant(plain);
  ASSERT_EQ(kGrantBodySize, enc.size());
  ASSERT_EQ(0, decode_grant(enc.data(), enc.size(), &back, &why));
  EXPECT_EQ(0u, back.cma_pid);
}
