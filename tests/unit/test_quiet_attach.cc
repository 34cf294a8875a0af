// A quiet ATTACH (proto/frame.h, kAttachQuiet): the server answers a refusal only. A peer on the
// owner's host that checked the grant in the owner's table needs no ATTACH_OK, and one it did not
// ask for would cost the session's reader a wake-up per operation.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "harness.h"
#include "io/sockio.h"
#include "proto/client_handshake.h"
#include "proto/frame.h"

using namespace libd;
using namespace libd::proto;

namespace {

struct Session {
  MemoryServer server;
  std::vector<char> mem = std::vector<char>(4096);
  int fd = -1;
  std::string nonce;

  Session() {
    EXPECT_EQ(0, server.add_lent_element("buf", mem.data(), mem.size())) << libd_last_error();
    uint16_t port = 0;
    EXPECT_EQ(0, server.listen_tcp("127.0.0.1", 0, &port)) << libd_last_error();
    Grant first = grant();
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    GrantBody body;
    EXPECT_EQ(0, connect_authenticated(reinterpret_cast<sockaddr *>(&addr), sizeof addr,
                                       {first.id, first.secret, "peer"}, Deadline::after_ms(3000), &fd, &body,
                                       kAuthSession, &nonce))
        << libd_last_error();
  }
  ~Session() {
    if (fd >= 0) ::close(fd);
  }

  Grant grant() {
    Grant g;
    g.element = "buf";
    g.client = "*";
    g.rights = 3;
    EXPECT_EQ(0, server.grant(&g)) << libd_last_error();
    return g;
  }

  void send(const std::string &frame) { ASSERT_EQ(0, send_all(fd, frame.data(), frame.size(), Deadline::after_ms(3000))); }

  void ping(uint64_t req_id) {
    Header h;
    h.opcode = kPing;
    h.req_id = req_id;
    char hdr[kHeaderSize];
    encode_header(h, hdr);
    send(std::string(hdr, kHeaderSize));
  }

  // The next frame's header (its body is read and dropped).
  Header next() {
    char hdr[kHeaderSize];
    Header h;
    std::string why;
    EXPECT_EQ(0, recv_exact(fd, hdr, kHeaderSize, Deadline::after_ms(3000)));
    EXPECT_EQ(0, decode_header(hdr, &h, &why)) << why;
    std::string body(size_t(payload_length(h)), '\0');
    if (!body.empty()) {
      EXPECT_EQ(0, recv_exact(fd, body.data(), body.size(), Deadline::after_ms(3000)));
    }
    return h;
  }
};

}  // namespace

TEST(QuietAttach, AnAdmittedGrantIsNotAnswered) {
  Session s;
  Grant g = s.grant();
  s.send(encode_attach(1, {g.id, g.secret, "peer"}, s.nonce, true));
  s.ping(77);
  Header h = s.next();
  EXPECT_EQ(kPong, h.opcode) << "the first answer after a quiet ATTACH that succeeded is the ping's";
  EXPECT_EQ(77u, h.req_id);
  EXPECT_EQ(1u, s.server.holders(g.id)) << "the grant is attached all the same";
}

TEST(QuietAttach, ARefusalIsAnswered) {
  Session s;
  Grant g = s.grant();
  s.send(encode_attach(1, {g.id, std::string(g.secret.size(), '0'), "peer"}, s.nonce, true));
  s.ping(78);
  Header h = s.next();
  EXPECT_EQ(kAttachOk, h.opcode);
  EXPECT_EQ(1u, h.addr);
  EXPECT_EQ(-EACCES, h.status);
  EXPECT_EQ(0u, h.size) << "a refusal carries no grant";
  EXPECT_EQ(kPong, s.next().opcode) << "the session goes on";
  EXPECT_EQ(0u, s.server.holders(g.id));
}

TEST(QuietAttach, AnOrdinaryAttachIsStillAnswered) {
  Session s;
  Grant g = s.grant();
  s.send(encode_attach(1, {g.id, g.secret, "peer"}, s.nonce));
  Header h = s.next();
  EXPECT_EQ(kAttachOk, h.opcode);
  EXPECT_EQ(0, h.status);
  EXPECT_GT(h.size, 0u);
}
