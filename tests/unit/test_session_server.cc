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
#include <chrono>
#include <string>
#include <thread>
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

  // A new grant, attached to the session as `handle`.
  Grant attach_new(uint32_t handle) {
    Grant g = grant();
    send(encode_attach(handle, {g.id, g.secret, "peer"}, nonce));
    Header h = next();
    EXPECT_EQ(kAttachOk, h.opcode);
    EXPECT_EQ(0, h.status);
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
  Grant g = p.attach_new(1);
  ASSERT_FALSE(::testing::Test::HasFailure());
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
  char hdr[kHeaderSize];
  ASSERT_EQ(0, recv_exact(p.fd, hdr, kHeaderSize, Deadline::after_ms(5000)));  // the READ is being answered
  (void)p.server.cm_port();  // runs on the server's loop: once it returns, that read is handled whole
  Notice n;
  EXPECT_EQ(-ETIMEDOUT, p.server.wait_notify(p.first.id, &n, 0)) << "told while the answer was still queued";
  EXPECT_EQ(1u, p.server.holders(p.first.id)) << "detached while its READ answer was still queued";
  ASSERT_EQ(0, p.server.remove_element("buf"));
  std::memset(p.mem.data(), 'Z', p.mem.size());  // the owner reuses its memory
  size_t got = 0, foreign = 0;
  EXPECT_TRUE(p.drain(&got, &foreign, 'Z')) << "the connection that still sent the memory was not closed";
  EXPECT_EQ(0u, foreign) << "bytes sent from the memory after its owner withdrew it";
  EXPECT_LT(got, size) << "the whole answer went out: the test did not queue it";
}

// A word the peer sent right behind its READ, before the answer came, reaches the owner once
// the answer has been sent: the owner may reuse the memory as soon as it hears.
TEST(SessionServer, AWordBehindQueuedReadAnswersReachesTheOwnerOnceTheyAreSent) {
  const size_t size = 64u << 20;
  Peer p(size);
  std::string notify(kHeaderSize, '\0');
  encode_notify(9, 0, notify.data(), 0);
  p.send(frame(kRead, with_handle(0, 1), 0, size) + notify);
  char hdr[kHeaderSize];
  ASSERT_EQ(0, recv_exact(p.fd, hdr, kHeaderSize, Deadline::after_ms(5000)));  // the READ is being answered
  (void)p.server.cm_port();  // runs on the server's loop: once it returns, that read is handled whole
  Notice n;
  EXPECT_EQ(-ETIMEDOUT, p.server.wait_notify(p.first.id, &n, 0)) << "told while the answer was still queued";
  std::vector<char> body(size);
  ASSERT_EQ(0, recv_exact(p.fd, body.data(), size, Deadline::after_ms(20000)));
  ASSERT_EQ(0, p.server.wait_notify(p.first.id, &n, 5000)) << libd_last_error();
  EXPECT_EQ(9u, n.value);
  EXPECT_EQ(0, n.status);
}

// A word of success after a request of the holder's that the server refused is that refusal:
// a holder that sends its word right behind its requests learns of the refusal only after.
TEST(SessionServer, AWordAfterARefusedRequestIsThatRefusal) {
  Peer p(4096);
  std::string notify(kHeaderSize, '\0');
  encode_notify(5, 0, notify.data(), 0);
  p.send(frame(kRead, with_handle(0, 1), 8192, 16) + notify);  // past the grant's end
  Header h = p.next();
  EXPECT_EQ(kReadResp, h.opcode);
  EXPECT_EQ(-ERANGE, h.status);
  Notice n;
  ASSERT_EQ(0, p.server.wait_notify(p.first.id, &n, 5000)) << libd_last_error();
  EXPECT_EQ(5u, n.value);
  EXPECT_EQ(-ERANGE, n.status);
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

// ---- the owner ending a grant a session holds -----------------------------------------------

// Reads frames until the answers to requests 2 (READ) and 3 (WRITE) of handle 1 and its DETACHED
// have all come, in whatever order the loop sends them: the status of each.
struct EndedHandle {
  int read = 1, write = 1, detached = 1;
};
EndedHandle answers_after_the_end(Peer &p) {
  EndedHandle e;
  while (e.read == 1 || e.write == 1 || e.detached == 1) {
    Header h = p.next();
    if (h.opcode == kReadResp && h.req_id == with_handle(1, 2)) e.read = h.status;
    else if (h.opcode == kWriteResp && h.req_id == with_handle(1, 3)) e.write = h.status;
    else if (h.opcode == kDetached && h.addr == 1) e.detached = h.status;
    else {
      ADD_FAILURE() << "unexpected " << opcode_name(h.opcode);
      break;
    }
  }
  return e;
}

// Nothing of the memory is on the move for the session (its last READ answer was sent): the
// owner's revoke returns without waiting for the server's loop, and from then on a request on
// the grant is refused, as on a handle already cut off; the holder is told (DETACHED) when the
// loop gets to it, and the session and its other grant go on.
TEST(SessionServer, EndingAnIdleGrantNeedsNoLoopAndRefusesItsRequestsAtOnce) {
  Peer p(4096);
  Grant g = p.attach_new(1);
  ASSERT_FALSE(::testing::Test::HasFailure());
  p.send(frame(kRead, with_handle(1, 1), 0, 16));
  Header first = p.next();
  ASSERT_EQ(kReadResp, first.opcode);
  ASSERT_EQ(0, first.status);
  ASSERT_TRUE(p.answers_ping(9));  // handled after the answer was handed to the kernel
  uint64_t waits = p.server.loop_waits();
  ASSERT_EQ(0, p.server.revoke(g.id)) << libd_last_error();
  EXPECT_EQ(waits, p.server.loop_waits()) << "the revoke waited for the loop with nothing of the memory in flight";
  std::memset(p.mem.data(), 'Z', p.mem.size());  // the owner's memory again, at once
  p.send(frame(kRead, with_handle(1, 2), 0, 16) + frame(kWrite, with_handle(1, 3), 0, 16) + std::string(16, 'W'));
  EndedHandle e = answers_after_the_end(p);
  EXPECT_EQ(-ECONNRESET, e.read);
  EXPECT_EQ(-ECONNRESET, e.write);
  EXPECT_EQ(-ECANCELED, e.detached);
  EXPECT_EQ(std::string(p.mem.size(), 'Z'), std::string(p.mem.data(), p.mem.size())) << "written after the revoke";
  EXPECT_EQ(0u, p.server.holders(g.id));
  std::string body;
  p.send(frame(kRead, with_handle(0, 4), 0, 16));
  Header h = p.next(&body);
  EXPECT_EQ(0, h.status) << "the session's other grant was cut off too";
  EXPECT_EQ(std::string(16, 'Z'), body);
}

// A READ answer from the memory is still queued (the peer reads nothing): the revoke waits for
// the loop, which closes the connection still sending it; after the revoke returns, nothing the
// peer receives comes from the memory.
TEST(SessionServer, EndingAGrantWhoseMemoryIsBeingSentWaitsForTheLoop) {
  const size_t size = 64u << 20;
  Peer p(size);
  Grant g = p.attach_new(1);
  ASSERT_FALSE(::testing::Test::HasFailure());
  p.send(frame(kRead, with_handle(1, 1), 0, size));
  char hdr[kHeaderSize];
  ASSERT_EQ(0, recv_exact(p.fd, hdr, kHeaderSize, Deadline::after_ms(5000)));  // the READ is being answered
  uint64_t waits = p.server.loop_waits();
  ASSERT_EQ(0, p.server.revoke(g.id)) << libd_last_error();
  EXPECT_EQ(waits + 1, p.server.loop_waits()) << "the revoke did not wait for the loop sending its memory";
  std::memset(p.mem.data(), 'Z', p.mem.size());
  size_t got = 0, foreign = 0;
  EXPECT_TRUE(p.drain(&got, &foreign, 'Z')) << "the connection that still sent the memory was not closed";
  EXPECT_EQ(0u, foreign) << "bytes sent from the memory after its owner revoked the grant";
  EXPECT_LT(got, size) << "the whole answer went out: the test did not queue it";
}

// A WRITE's payload is arriving into the memory: the revoke waits for the loop, which drops the
// rest of the payload; the memory does not change after the revoke returns.
TEST(SessionServer, EndingAGrantWhoseMemoryIsBeingWrittenWaitsForTheLoop) {
  const size_t size = 4u << 20;
  Peer p(size);
  Grant g = p.attach_new(1);
  ASSERT_FALSE(::testing::Test::HasFailure());
  p.send(frame(kWrite, with_handle(1, 3), 0, size) + std::string(size / 2, 'W'));
  // Part of the payload is in: the server is in the middle of the WRITE.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (__atomic_load_n(&p.mem[0], __ATOMIC_ACQUIRE) != 'W' && std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
  ASSERT_EQ('W', __atomic_load_n(&p.mem[0], __ATOMIC_ACQUIRE)) << "the payload never reached the memory";
  uint64_t waits = p.server.loop_waits();
  ASSERT_EQ(0, p.server.revoke(g.id)) << libd_last_error();
  EXPECT_EQ(waits + 1, p.server.loop_waits()) << "the revoke did not wait for the loop writing into its memory";
  std::string after(p.mem.data(), p.mem.size());
  p.send(std::string(size - size / 2, 'X'));
  EndedHandle e;
  for (;;) {  // the WRITE's answer and the DETACHED, in either order
    Header h = p.next();
    if (h.opcode == kWriteResp) e.write = h.status;
    else if (h.opcode == kDetached) e.detached = h.status;
    else ADD_FAILURE() << "unexpected " << opcode_name(h.opcode);
    if ((e.write != 1 && e.detached != 1) || ::testing::Test::HasFailure()) break;
  }
  EXPECT_EQ(-ECONNRESET, e.write);
  EXPECT_EQ(-ECANCELED, e.detached);
  EXPECT_TRUE(after == std::string(p.mem.data(), p.mem.size())) << "written after the revoke";
  EXPECT_EQ(std::string::npos, after.find('X'));
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
