// The memory server's side of a shared connection, driven frame by frame as a peer that does
// not follow the rules would: what it may not do ends its connection only, and a peer that
// detaches while its READ answers are still queued cannot make the owner's withdraw return while
// the server still sends from the lent memory. Also the quiet ATTACH (kAttachQuiet): the server
// answers a refusal only, since a peer on the owner's host that checked the grant in the owner's
// table needs no ATTACH_OK, and one it did not ask for would cost the session's reader a wake-up
// per operation.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "io/sockio.h"
#include "proto/client_handshake.h"
#include "proto/frame.h"

using namespace libd;
using namespace libd::proto;

namespace {

std::string frame(Opcode op, uint64_t req_id, uint64_t addr, uint64_t size = 0) {
  Header h;
  h.opcode = op;
  h.req_id = req_id;
  h.addr = addr;
  h.size = size;
  char hdr[kHeaderSize];
  encode_header(h, hdr);
  return std::string(hdr, kHeaderSize);
}

// A memory server lending `mem`, and a raw session to it opened with one grant (handle 0).
struct Peer {
  std::vector<char> mem;  // outlives the server, which may still be sending from it
  MemoryServer server;
  Grant first;
  int fd = -1;
  std::string nonce;
  uint16_t port = 0;

  explicit Peer(size_t size, bool session = true) : mem(size, 'A') {
    signal(SIGPIPE, SIG_IGN);  // writing to a connection the server closed is what some tests do
    EXPECT_EQ(0, server.add_lent_element("buf", mem.data(), mem.size())) << libd_last_error();
    EXPECT_EQ(0, server.listen_tcp("127.0.0.1", 0, &port)) << libd_last_error();
    first = grant();
    fd = open(first, session ? kAuthSession : 0);
  }
  ~Peer() {
    if (fd >= 0) ::close(fd);
  }

  int open(const Grant &g, uint64_t flags) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    GrantBody body;
    int s = -1;
    EXPECT_EQ(0, connect_authenticated(reinterpret_cast<sockaddr *>(&addr), sizeof addr, {g.id, g.secret, "peer"},
                                       Deadline::after_ms(3000), &s, &body, flags, &nonce))
        << libd_last_error();
    return s;
  }

  Grant grant() {
    Grant g;
    g.element = "buf";
    g.client = "*";
    g.rights = 3;
    EXPECT_EQ(0, server.grant(&g)) << libd_last_error();
    return g;
  }

  void send(const std::string &bytes) { ASSERT_EQ(0, send_all(fd, bytes.data(), bytes.size(), Deadline::after_ms(3000))); }

  // The next frame's header; its body goes to *body when asked for, else is dropped.
  Header next(std::string *body = nullptr) {
    char hdr[kHeaderSize];
    Header h;
    std::string why;
    EXPECT_EQ(0, recv_exact(fd, hdr, kHeaderSize, Deadline::after_ms(5000)));
    EXPECT_EQ(0, decode_header(hdr, &h, &why)) << why;
    std::string b(size_t(payload_length(h)), '\0');
    if (!b.empty()) {
      EXPECT_EQ(0, recv_exact(fd, b.data(), b.size(), Deadline::after_ms(5000)));
    }
    if (body) *body = std::move(b);
    return h;
  }

  void ping(uint64_t id) { send(frame(kPing, id, 0)); }

  // The server answers a PING on a connection it still serves.
  bool answers_ping(uint64_t id) {
    ping(id);
    for (;;) {
      Header h = next();
      if (h.opcode == kPong) return h.req_id == id;
    }
  }

  // True once the server has closed the connection (everything it still sent is read and dropped).
  bool closed_by_server() { return drain(nullptr, nullptr); }

  // Reads until the server closes the connection (true) or nothing comes for 5 s (false);
  // counts the bytes and those equal to `mark`.
  bool drain(size_t *got, size_t *marked, char mark = 0) {
    char buf[65536];
    for (;;) {
      struct pollfd pfd = {fd, POLLIN, 0};
      if (poll(&pfd, 1, 5000) != 1) return false;
      ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n == 0) return true;
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        return errno == ECONNRESET;
      }
      if (got) *got += size_t(n);
      if (marked)
        for (ssize_t i = 0; i < n; i++) *marked += buf[i] == mark;
    }
  }
};

}  // namespace

// ---- what a peer may not do ends its own connection ---------------------------------------

TEST(SessionServer, AnAttachBeforeAuthEndsTheConnection) {
  Peer p(4096);
  int raw = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(p.port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(0, connect(raw, reinterpret_cast<sockaddr *>(&addr), sizeof addr));
  std::string attach = encode_attach(1, {p.first.id, p.first.secret, "peer"}, std::string(kNonceSize, '\0'));
  ASSERT_EQ(0, send_all(raw, attach.data(), attach.size(), Deadline::after_ms(3000)));
  int keep = p.fd;
  p.fd = raw;
  EXPECT_TRUE(p.closed_by_server());  // the challenge came, then the end
  p.fd = keep;
  ::close(raw);
  EXPECT_TRUE(p.answers_ping(7)) << "another connection was disturbed";
}

TEST(SessionServer, AttachingHandleZeroOrAHandleInUseEndsTheConnection) {
  for (uint32_t handle : {0u, 1u}) {
    Peer p(4096);
    Grant g = p.grant();
    if (handle == 1) {
      p.send(encode_attach(1, {g.id, g.secret, "peer"}, p.nonce));
      EXPECT_EQ(kAttachOk, p.next().opcode);
    }
    p.send(encode_attach(handle, {g.id, g.secret, "peer"}, p.nonce));
    EXPECT_TRUE(p.closed_by_server()) << "handle " << handle;
    EXPECT_EQ(0u, p.server.holders(g.id)) << "handle " << handle;
    EXPECT_EQ(0u, p.server.holders(p.first.id)) << "handle " << handle;
  }
}

TEST(SessionServer, AttachOrDetachOnAConnectionOfItsOwnEndsIt) {
  Peer p(4096, false);
  p.send(frame(kDetach, 0, 0));
  EXPECT_TRUE(p.closed_by_server());
  EXPECT_EQ(0u, p.server.holders(p.first.id));
}

TEST(SessionServer, DetachingAnUnknownHandleIsHarmless) {
  Peer p(4096);
  p.send(frame(kDetach, 0, 42) + frame(kDetach, 0, uint64_t(1) << 40));
  EXPECT_TRUE(p.answers_ping(3));
  EXPECT_EQ(1u, p.server.holders(p.first.id));
}

TEST(SessionServer, ADetachWithABodyEndsTheConnection) {
  Peer p(4096);
  p.send(frame(kDetach, 0, 0, 8) + std::string(8, 'x'));
  EXPECT_TRUE(p.closed_by_server());
}

TEST(SessionServer, RequestsOnADetachedHandleAreRefused) {
  Peer p(4096);
  Grant g = p.grant();
  p.send(encode_attach(1, {g.id, g.secret, "peer"}, p.nonce));
  ASSERT_EQ(kAttachOk, p.next().opcode);
  p.send(frame(kDetach, 0, 1) + frame(kRead, with_handle(1, 5), 0, 16));
  Header h = p.next();
  EXPECT_EQ(kReadResp, h.opcode);
  EXPECT_EQ(-ECONNRESET, h.status);
  EXPECT_EQ(0u, p.server.holders(g.id));
  EXPECT_EQ(1u, p.server.holders(p.first.id));
}

TEST(SessionServer, ASessionHoldsABoundedNumberOfGrants) {
  Peer p(4096);
  Grant g = p.grant();
  std::string many;
  for (uint32_t h = 1; h < 4096; h++) many += encode_attach(h, {g.id, g.secret, "peer"}, p.nonce, true);
  p.send(many);
  p.send(encode_attach(4096, {g.id, g.secret, "peer"}, p.nonce));
  Header full = p.next();
  EXPECT_EQ(kAttachOk, full.opcode);
  EXPECT_EQ(-EMFILE, full.status);
  EXPECT_EQ(4095u, p.server.holders(g.id));
  p.send(frame(kDetach, 0, 7) + encode_attach(4097, {g.id, g.secret, "peer"}, p.nonce));
  Header again = p.next();
  EXPECT_EQ(kAttachOk, again.opcode);
  EXPECT_EQ(0, again.status);
  EXPECT_EQ(4095u, p.server.holders(g.id));
}

// ---- a DETACH behind queued READ answers ----------------------------------------------------

// The peer asks for more than the sockets can hold, says it finished and detaches in the same
// write, and reads nothing. Until the answer is sent the grant is still held, so the owner's
// withdraw waits for the server to let go of the memory (here: it closes that connection). After
// withdraw returns, the memory is the owner's again: nothing the peer receives may come from it.
TEST(SessionServer, ADetachBehindQueuedReadAnswersKeepsTheGrantHeldUntilTheyAreSent) {
  const size_t size = 64u << 20;
  Peer p(size);
  std::string notify(kHeaderSize, '\0');
  encode_notify(9, 0, notify.data(), 0);
  p.send(frame(kRead, with_handle(0, 1), 0, size) + notify + frame(kDetach, 0, 0));
  Notice n;
  ASSERT_EQ(0, p.server.wait_notify(p.first.id, &n, 5000)) << libd_last_error();  // the whole write was handled
  EXPECT_EQ(9u, n.value);
  EXPECT_EQ(1u, p.server.holders(p.first.id)) << "detached while its READ answer was still queued";
  ASSERT_EQ(0, p.server.remove_element("buf"));
  std::memset(p.mem.data(), 'Z', p.mem.size());  // the owner reuses its memory
  size_t got = 0, foreign = 0;
  EXPECT_TRUE(p.drain(&got, &foreign, 'Z')) << "the connection that still sent the memory was not closed";
  EXPECT_EQ(0u, foreign) << "bytes sent from the memory after its owner withdrew it";
  EXPECT_LT(got, size) << "the whole answer went out: the test did not queue it";
}

TEST(SessionServer, ADetachBehindAnswersThatWereSentLetsGoAtOnce) {
  Peer p(1 << 20);
  std::string notify(kHeaderSize, '\0');
  encode_notify(1, 0, notify.data(), 0);
  p.send(frame(kRead, with_handle(0, 1), 0, 4096));
  std::string body;
  Header h = p.next(&body);
  ASSERT_EQ(kReadResp, h.opcode);
  EXPECT_EQ(std::string(4096, 'A'), body);
  p.send(notify + frame(kDetach, 0, 0));
  Notice n;
  ASSERT_EQ(0, p.server.wait_notify(p.first.id, &n, 5000)) << libd_last_error();
  EXPECT_EQ(0u, p.server.holders(p.first.id));
  EXPECT_TRUE(p.answers_ping(4));  // the session goes on
}

// ---- a quiet ATTACH ------------------------------------------------------------------------

TEST(QuietAttach, AnAdmittedGrantIsNotAnswered) {
  Peer p(4096);
  Grant g = p.grant();
  p.send(encode_attach(1, {g.id, g.secret, "peer"}, p.nonce, true));
  p.ping(77);
  Header h = p.next();
  EXPECT_EQ(kPong, h.opcode) << "the first answer after a quiet ATTACH that succeeded is the ping's";
  EXPECT_EQ(77u, h.req_id);
  EXPECT_EQ(1u, p.server.holders(g.id)) << "the grant is attached all the same";
}

TEST(QuietAttach, ARefusalIsAnswered) {
  Peer p(4096);
  Grant g = p.grant();
  p.send(encode_attach(1, {g.id, std::string(g.secret.size(), '0'), "peer"}, p.nonce, true));
  p.ping(78);
  Header h = p.next();
  EXPECT_EQ(kAttachOk, h.opcode);
  EXPECT_EQ(1u, h.addr);
  EXPECT_EQ(-EACCES, h.status);
  EXPECT_EQ(0u, h.size) << "a refusal carries no grant";
  EXPECT_EQ(kPong, p.next().opcode) << "the session goes on";
  EXPECT_EQ(0u, p.server.holders(g.id));
}

TEST(QuietAttach, AnOrdinaryAttachIsStillAnswered) {
  Peer p(4096);
  Grant g = p.grant();
  p.send(encode_attach(1, {g.id, g.secret, "peer"}, p.nonce));
  Header h = p.next();
  EXPECT_EQ(kAttachOk, h.opcode);
  EXPECT_EQ(0, h.status);
  EXPECT_GT(h.size, 0u);
}
