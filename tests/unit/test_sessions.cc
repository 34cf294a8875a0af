// Shared connections (share,1; proto/frame.h "Shared connections"): transports of one process
// that reach the same memory server ride one connection, each with its own grant. What a grant
// opens, and when it stops opening anything, is exactly what it is on a connection of its own.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <string>
#include <vector>

#include "harness.h"

using test::make_action;

namespace {

// A memory server (in this process, as the C++ class) lending `mem`, listening on tcp and on a
// unix socket, and a way to grant it and to make holders of the implementation under test.
struct Owner {
  std::unique_ptr<libd::MemoryServer> server = std::make_unique<libd::MemoryServer>();
  std::vector<test::ActionPtr> actions;

  Owner(std::vector<char> &mem, const std::string &element = "buf") {
    EXPECT_EQ(0, server->add_lent_element(element, mem.data(), mem.size())) << libd_last_error();
    uint16_t port;
    EXPECT_EQ(0, server->listen_tcp("127.0.0.1", 0, &port)) << libd_last_error();
    EXPECT_EQ(0, server->listen_unix(test::unique_socket_path("sessions"))) << libd_last_error();
  }

  libd::Grant grant(const std::string &element = "buf", unsigned rights = 3, uint64_t ttl_ms = 0) {
    libd::Grant g;
    g.element = element;
    g.client = "*";
    g.rights = rights;
    g.ttl_ms = ttl_ms;
    EXPECT_EQ(0, server->grant(&g)) << libd_last_error();
    return g;
  }

  // A shared transport of `impl` holding `g`, in an action of its own.
  libd_transport *holder(const std::string &impl, const libd::Grant &g, const std::string &aid = "holder",
                         const std::string &extra = "", int timeout_ms = 3000) {
    actions.push_back(make_action(aid));
    std::string durl = "t;" + impl + ";share,1;timeout_ms," + std::to_string(timeout_ms) + ";" + extra +
                       server->client_config(g);
    EXPECT_EQ(0, libd_action_add_transport(actions.back().get(), durl.c_str())) << libd_last_error();
    return libd_action_get_transport(actions.back().get(), "t");
  }
};

void wait_not_ready(libd_transport *t) {
  uint64_t seq = 0;
  while (libd_transport_state(t) == LIBD_STATE_READY)
    ASSERT_GE(libd_transport_wait_change(t, &seq, 5000), 0) << "the holder was not cut off";
}

// A session already open (its first holder connected) and a second holder `t` of a fresh grant
// `g`, with `bytes` of its own registered at `buf`: a holder whose requests ride an ATTACH.
struct SecondHolder {
  libd_transport *first = nullptr, *t = nullptr;
  libd::Grant g;
  char *buf = nullptr;
};

SecondHolder second_holder(Owner &o, const std::string &impl, size_t bytes) {
  SecondHolder h;
  h.first = o.holder(impl, o.grant());
  EXPECT_EQ(0, libd_transport_connect(h.first)) << libd_last_error();
  h.g = o.grant();
  h.t = o.holder(impl, h.g);
  EXPECT_EQ(0, libd_trdma_reg(h.t, bytes, reinterpret_cast<void **>(&h.buf))) << libd_last_error();
  return h;
}

class Shared : public ::testing::TestWithParam<std::string> {};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Impl, Shared, ::testing::Values("shm", "tcp"), [](const auto &i) { return i.param; });

TEST_P(Shared, TransportsToOneServerRideOneConnection) {
  std::vector<char> mem(1 << 16);
  test::fill_random(mem.data(), mem.size(), 3);
  Owner o(mem);
  std::vector<libd_transport *> ts;
  for (int i = 0; i < 4; i++) ts.push_back(o.holder(GetParam(), o.grant(), "holder-" + std::to_string(i)));
  for (auto *t : ts) {
    char *buf = nullptr;
    ASSERT_EQ(0, libd_trdma_reg(t, mem.size(), reinterpret_cast<void **>(&buf)));
    ASSERT_EQ(0, libd_trdma_read(t, mem.size(), 0, buf)) << libd_last_error();
    EXPECT_EQ(0, memcmp(buf, mem.data(), mem.size()));
  }
  EXPECT_EQ(1u, o.server->connections());
  // Terminating the transports detaches their grants and leaves the connection for the next.
  for (auto *t : ts) ASSERT_EQ(0, libd_transport_terminate(t));
  auto *next = o.holder(GetParam(), o.grant());
  ASSERT_EQ(0, libd_transport_connect(next)) << libd_last_error();
  EXPECT_EQ(1u, o.server->connections());
}

TEST_P(Shared, RevokingOneGrantCutsOffItsHolderOnly) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto ga = o.grant(), gb = o.grant();
  auto *a = o.holder(GetParam(), ga), *b = o.holder(GetParam(), gb);
  char *abuf = nullptr, *bbuf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(a, 64, reinterpret_cast<void **>(&abuf)));
  ASSERT_EQ(0, libd_trdma_reg(b, 64, reinterpret_cast<void **>(&bbuf)));
  ASSERT_EQ(0, libd_trdma_read(a, 64, 0, abuf)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_read(b, 64, 0, bbuf)) << libd_last_error();
  ASSERT_EQ(0, o.server->revoke(ga.id));
  wait_not_ready(a);
  EXPECT_NE(0, libd_trdma_read(a, 64, 0, abuf));
  EXPECT_NE(std::string::npos, test::transport_error(a).find("ended this grant")) << test::transport_error(a);
  EXPECT_EQ(0, libd_trdma_read(b, 64, 0, bbuf)) << libd_last_error();
  EXPECT_EQ(1u, o.server->connections());
}

TEST_P(Shared, ARevokedOrForeignGrantIsRefusedAndTheConnectionGoesOn) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto live = o.grant(), gone = o.grant();
  auto *first = o.holder(GetParam(), live);
  ASSERT_EQ(0, libd_transport_connect(first)) << libd_last_error();
  ASSERT_EQ(0, o.server->revoke(gone.id));
  EXPECT_EQ(-EACCES, libd_transport_connect(o.holder(GetParam(), gone)));
  libd::Grant forged = o.grant();
  forged.secret = std::string(64, 'a');  // the right id, the wrong secret
  EXPECT_EQ(-EACCES, libd_transport_connect(o.holder(GetParam(), forged)));
  libd::Grant someone;  // another action's grant
  someone.element = "buf";
  someone.client = "someone-else";
  someone.rights = 3;
  ASSERT_EQ(0, o.server->grant(&someone)) << libd_last_error();
  EXPECT_EQ(-EACCES, libd_transport_connect(o.holder(GetParam(), someone, "holder")));
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(first, 64, reinterpret_cast<void **>(&buf)));
  EXPECT_EQ(0, libd_trdma_read(first, 64, 0, buf)) << libd_last_error();
  EXPECT_EQ(1u, o.server->connections());
}

TEST_P(Shared, EachGrantKeepsItsRangeAndDirection) {
  std::vector<char> mem(8192);
  Owner o(mem);
  auto rw = o.grant(), ro = o.grant("buf", LIBD_RIGHT_READ);
  auto *w = o.holder(GetParam(), rw), *r = o.holder(GetParam(), ro);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(r, 64, reinterpret_cast<void **>(&buf)));
  EXPECT_EQ(0, libd_trdma_read(r, 64, 0, buf)) << libd_last_error();
  EXPECT_EQ(-EACCES, libd_trdma_write(r, 64, 0, buf));
  EXPECT_EQ(-ERANGE, libd_trdma_read(r, 64, 8192 - 32, buf));
  char *wbuf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(w, 64, reinterpret_cast<void **>(&wbuf)));
  memcpy(wbuf, "written", 7);
  EXPECT_EQ(0, libd_trdma_write(w, 7, 100, wbuf)) << libd_last_error();
  EXPECT_EQ(0, memcmp(mem.data() + 100, "written", 7));
}

TEST_P(Shared, NotificationsReachTheirOwnGrant) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto ga = o.grant(), gb = o.grant();
  auto *a = o.holder(GetParam(), ga), *b = o.holder(GetParam(), gb);
  ASSERT_EQ(0, libd_trdma_notify(b, 2, 0)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_notify(a, 1, -ECANCELED)) << libd_last_error();
  libd::Notice n;
  ASSERT_EQ(0, o.server->wait_notify(ga.id, &n, 3000)) << libd_last_error();
  EXPECT_EQ(1u, n.value);
  EXPECT_EQ(-ECANCELED, n.status);
  ASSERT_EQ(0, o.server->wait_notify(gb.id, &n, 3000)) << libd_last_error();
  EXPECT_EQ(2u, n.value);
  // Leaving after the word is no loss; leaving without one is, for that grant alone.
  ASSERT_EQ(0, libd_transport_terminate(b));
  EXPECT_EQ(-ETIMEDOUT, o.server->wait_notify(gb.id, &n, 100));
  auto gc = o.grant();
  auto *c = o.holder(GetParam(), gc);
  ASSERT_EQ(0, libd_transport_connect(c)) << libd_last_error();
  ASSERT_EQ(0, libd_transport_terminate(c));
  EXPECT_EQ(-ECONNRESET, o.server->wait_notify(gc.id, &n, 3000));
  EXPECT_EQ(-ETIMEDOUT, o.server->wait_notify(ga.id, &n, 100));
}

TEST_P(Shared, AnExpiredGrantEndsItsHolderAndTheOthersGoOn) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto brief = o.grant("buf", 3, 200), lasting = o.grant("buf", 3, 60000);
  auto *a = o.holder(GetParam(), brief), *b = o.holder(GetParam(), lasting);
  ASSERT_EQ(0, libd_transport_connect(a)) << libd_last_error();
  ASSERT_EQ(0, libd_transport_connect(b)) << libd_last_error();
  libd::Notice n;
  EXPECT_EQ(-EKEYEXPIRED, o.server->wait_notify(brief.id, &n, 5000));
  wait_not_ready(a);
  EXPECT_NE(std::string::npos, test::transport_error(a).find("expire")) << test::transport_error(a);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(b, 64, reinterpret_cast<void **>(&buf)));
  EXPECT_EQ(0, libd_trdma_read(b, 64, 0, buf)) << libd_last_error();
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(b));
}

TEST_P(Shared, WithdrawingMemoryEndsEveryGrantOnIt) {
  std::vector<char> one(4096), two(4096);
  Owner o(one, "one");
  ASSERT_EQ(0, o.server->add_lent_element("two", two.data(), two.size()));
  auto *a = o.holder(GetParam(), o.grant("one")), *b = o.holder(GetParam(), o.grant("two"));
  ASSERT_EQ(0, libd_transport_connect(a)) << libd_last_error();
  ASSERT_EQ(0, libd_transport_connect(b)) << libd_last_error();
  ASSERT_EQ(0, o.server->remove_element("one"));
  wait_not_ready(a);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(b, 64, reinterpret_cast<void **>(&buf)));
  EXPECT_EQ(0, libd_trdma_read(b, 64, 0, buf)) << libd_last_error();
}

TEST(GrantsOfAnElement, AWithdrawalEndsItsOwnGrantsAndNoOthers) {
  std::vector<char> one(4096), two(4096), again(4096);
  Owner o(one, "one");
  ASSERT_EQ(0, o.server->add_lent_element("two", two.data(), two.size()));
  auto first = o.grant("one"), revoked = o.grant("one"), other = o.grant("two");
  ASSERT_EQ(0, o.server->revoke(revoked.id));
  ASSERT_EQ(0, o.server->remove_element("one"));
  // The name again, on other memory: its grants are its own, not the withdrawn element's.
  ASSERT_EQ(0, o.server->add_lent_element("one", again.data(), again.size()));
  auto fresh = o.grant("one");
  ASSERT_EQ(0, o.server->remove_element("two"));
  EXPECT_EQ(-ENOENT, o.server->revoke(first.id)) << "withdrawn with the first 'one'";
  EXPECT_EQ(-ENOENT, o.server->revoke(other.id)) << "withdrawn with 'two'";
  EXPECT_EQ(0, o.server->revoke(fresh.id)) << "the new 'one' lost its grant when 'two' was withdrawn";
}

TEST_P(Shared, AServerThatGoesAwayTakesEveryHolderWithIt) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto *a = o.holder(GetParam(), o.grant()), *b = o.holder(GetParam(), o.grant());
  ASSERT_EQ(0, libd_transport_connect(a)) << libd_last_error();
  ASSERT_EQ(0, libd_transport_connect(b)) << libd_last_error();
  o.server->stop();
  wait_not_ready(a);
  wait_not_ready(b);
}

TEST(SharedShm, ReachesLentMemoryOnly) {
  // A memfd element cannot be handed over on a shared socket's frames: such a grant is refused
  // there (and works on a connection of its own, as ever).
  auto r = test::make_rig("shm", 4096);
  auto a = make_action("client-1");
  std::string durl = "s;shm;share,1;timeout_ms,3000;" + r.config;
  ASSERT_EQ(0, libd_action_add_transport(a.get(), durl.c_str())) << libd_last_error();
  EXPECT_EQ(-EOPNOTSUPP, libd_transport_connect(libd_action_get_transport(a.get(), "s")));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("lent memory only")) << libd_last_error();
  EXPECT_EQ(0, libd_transport_connect(r.t)) << libd_last_error();
}

TEST(SharedTcp, ManyOperationsOfManyGrantsInterleaveOnOneConnection) {
  std::vector<char> mem(1 << 20);
  test::fill_random(mem.data(), mem.size(), 9);
  Owner o(mem);
  std::vector<libd_transport *> ts;
  std::vector<char *> bufs;
  for (int i = 0; i < 8; i++) {
    ts.push_back(o.holder("tcp", o.grant()));
    char *b = nullptr;
    ASSERT_EQ(0, libd_trdma_reg(ts.back(), 128 << 10, reinterpret_cast<void **>(&b)));
    bufs.push_back(b);
  }
  std::vector<libd_op *> ops;
  for (int round = 0; round < 4; round++)
    for (size_t i = 0; i < ts.size(); i++) {
      libd_op *op = nullptr;
      ASSERT_EQ(0, libd_trdma_read_async(ts[i], 32 << 10, (i * 64 + round) << 10, bufs[i] + (round << 15), &op))
          << libd_last_error();
      ops.push_back(op);
    }
  for (auto *op : ops) {
    EXPECT_EQ(0, libd_op_wait(op, 5000));
    libd_op_free(op);
  }
  for (size_t i = 0; i < ts.size(); i++)
    for (int round = 0; round < 4; round++)
      EXPECT_EQ(0, memcmp(bufs[i] + (round << 15), mem.data() + ((i * 64 + round) << 10), 32 << 10)) << i << " " << round;
  EXPECT_EQ(1u, o.server->connections());
}

// A session is shared: one holder's operation that outlives its deadline while the server is
// busy answering it ends alone. The connection, and every other holder on it, goes on.
TEST(SharedTcp, AnOperationPastItsDeadlineEndsAloneWhileTheServerAnswers) {
  const size_t big = size_t(1) << 30;  // far more than loopback tcp moves within the deadline
  std::vector<char> mem(big, 'm');
  Owner o(mem);
  auto *other = o.holder("tcp", o.grant(), "other", "", 60000);
  auto *slow = o.holder("tcp", o.grant(), "slow", "", 150);
  ASSERT_EQ(0, libd_transport_connect(other)) << libd_last_error();
  ASSERT_EQ(0, libd_transport_connect(slow)) << libd_last_error();
  char *dst = nullptr, *small = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(slow, big, reinterpret_cast<void **>(&dst)));
  ASSERT_EQ(0, libd_trdma_reg(other, 4096, reinterpret_cast<void **>(&small)));
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async(slow, big, 0, dst, &op)) << libd_last_error();
  EXPECT_EQ(-ETIMEDOUT, libd_op_wait(op, 30000)) << libd_last_error();
  libd_op_free(op);
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(other));
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(slow));
  mem[100] = 'x';
  EXPECT_EQ(0, libd_trdma_read(other, 4096, 0, small)) << libd_last_error();  // behind the rest of the dropped answer
  EXPECT_EQ('x', small[100]);
  EXPECT_EQ(1u, o.server->connections());
}

// ---- the grant table for peers on the owner's host (proto::CmaSlot) ---------------------------

TEST(SharedShm, GrantsOnWholeLentMemoryHaveSlotsThatFollowThem) {
  std::vector<char> mem(4096);
  Owner o(mem);
  EXPECT_EQ(0u, o.server->cma_slots_used());
  auto a = o.grant(), brief = o.grant("buf", 3, 100);
  EXPECT_GE(a.slot, 0);
  EXPECT_EQ(a.slot, libd::proto::cma_slot_of(a.id)) << a.id;
  EXPECT_EQ(2u, o.server->cma_slots_used());
  libd::Grant part;  // a part of an element is never reached over shm: no slot
  part.element = "buf";
  part.client = "*";
  part.offset = 64;
  part.length = 64;
  part.rights = LIBD_RIGHT_READ;
  ASSERT_EQ(0, o.server->grant(&part));
  EXPECT_EQ(-1, part.slot);
  EXPECT_EQ(-1, libd::proto::cma_slot_of(part.id)) << part.id;
  ASSERT_EQ(0, o.server->revoke(a.id));
  libd::Notice n;
  EXPECT_EQ(-EKEYEXPIRED, o.server->wait_notify(brief.id, &n, 5000));
  EXPECT_EQ(0u, o.server->cma_slots_used()) << "revoked and expired grants free their slots";
}

TEST(SharedShm, AGrantTheTableVouchesForStopsAtOnceWhenRevoked) {
  std::vector<char> mem(4096);
  test::fill_random(mem.data(), mem.size(), 4);
  Owner o(mem);
  auto *first = o.holder("shm", o.grant());  // opens the session (and learns where the table is)
  ASSERT_EQ(0, libd_transport_connect(first)) << libd_last_error();
  auto g = o.grant();
  auto *t = o.holder("shm", g);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 4096, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_read(t, 4096, 0, buf)) << libd_last_error();
  EXPECT_EQ(0, memcmp(buf, mem.data(), 4096));
  ASSERT_EQ(0, o.server->revoke(g.id));
  // No waiting for the word on the socket: the next transfer already finds the slot changed.
  EXPECT_EQ(-ECONNRESET, libd_trdma_read(t, 64, 0, buf));
  // The slot is reused by the next grant; the old holder stays refused, the new one works.
  auto next = o.grant();
  EXPECT_EQ(g.slot, next.slot);
  EXPECT_NE(0, libd_trdma_read(t, 64, 0, buf));
  auto *u = o.holder("shm", next);
  char *ubuf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(u, 64, reinterpret_cast<void **>(&ubuf)));
  EXPECT_EQ(0, libd_trdma_read(u, 64, 0, ubuf)) << libd_last_error();
  // A record of the revoked grant is refused (the table does not vouch; the server says no).
  EXPECT_EQ(-EACCES, libd_transport_connect(o.holder("shm", g)));
}

// The grant that opened the session (AUTH) has a slot too: a revoke stops it at its next
// transfer, not when the loop has read the server's DETACHED.
TEST(SharedShm, TheGrantThatOpenedTheSessionStopsAtOnceWhenRevoked) {
  std::vector<char> mem(4096);
  test::fill_random(mem.data(), mem.size(), 5);
  Owner o(mem);
  for (int i = 0; i < 20; i++) {  // the old race lost often within a few tries
    auto g = o.grant();
    auto *t = o.holder("shm", g, "opener-" + std::to_string(i));
    char *buf = nullptr;
    ASSERT_EQ(0, libd_trdma_reg(t, 4096, reinterpret_cast<void **>(&buf)));
    ASSERT_EQ(0, libd_trdma_read(t, 4096, 0, buf)) << libd_last_error();
    EXPECT_EQ(0, memcmp(buf, mem.data(), 4096));
    ASSERT_EQ(0, o.server->revoke(g.id));
    EXPECT_EQ(-ECONNRESET, libd_trdma_read(t, 64, 0, buf)) << "try " << i;
    EXPECT_NE(0, libd_trdma_write(t, 64, 0, buf)) << "try " << i;
    ASSERT_EQ(0, libd_transport_terminate(t));
  }
}

TEST(SharedShm, AHolderTheTableVouchedForIsStillHeardByTheOwner) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto *first = o.holder("shm", o.grant());
  ASSERT_EQ(0, libd_transport_connect(first)) << libd_last_error();
  auto g = o.grant(), h = o.grant();
  auto *t = o.holder("shm", g), *gone = o.holder("shm", h);
  ASSERT_EQ(0, libd_transport_connect(t)) << libd_last_error();
  ASSERT_EQ(0, libd_transport_connect(gone)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_notify(t, 77, 0)) << libd_last_error();
  libd::Notice n;
  ASSERT_EQ(0, o.server->wait_notify(g.id, &n, 3000)) << libd_last_error();
  EXPECT_EQ(77u, n.value);
  ASSERT_EQ(0, libd_transport_terminate(gone));  // without a word: a loss
  EXPECT_EQ(-ECONNRESET, o.server->wait_notify(h.id, &n, 3000));
  EXPECT_EQ(1u, o.server->connections());
}

// ---- an operation's own connect on a shared tcp connection: ATTACH and the operation together --

TEST(SharedTcp, AnOperationRidesItsOwnAttach) {
  std::vector<char> mem(1 << 16);
  test::fill_random(mem.data(), mem.size(), 5);
  Owner o(mem);
  auto *first = o.holder("tcp", o.grant());
  ASSERT_EQ(0, libd_transport_connect(first)) << libd_last_error();  // opens the session
  auto g = o.grant("buf", LIBD_RIGHT_READ);
  auto *t = o.holder("tcp", g);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, mem.size(), reinterpret_cast<void **>(&buf)));
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async(t, 4096, 1024, buf, &op)) << libd_last_error();  // connects on the way
  ASSERT_EQ(0, libd_op_wait(op, 5000)) << libd_last_error();
  libd_op_free(op);
  EXPECT_EQ(0, memcmp(buf, mem.data() + 1024, 4096));
  // What the client could not check before the verdict, the server does: a write is refused.
  ASSERT_EQ(0, libd_trdma_write_async(t, 64, 0, buf, &op));
  EXPECT_EQ(-EACCES, libd_op_wait(op, 5000));
  libd_op_free(op);
  uint64_t size;
  unsigned rights;
  ASSERT_EQ(0, libd_trdma_remote(t, &size, &rights)) << libd_last_error();  // the server's verdict, kept
  EXPECT_EQ(mem.size(), size);
  EXPECT_EQ(unsigned(LIBD_RIGHT_READ), rights);
  EXPECT_EQ(-EACCES, libd_trdma_write_async(t, 64, 0, buf, &op)) << "after the verdict the client refuses it itself";
  EXPECT_EQ(1u, o.server->connections());
}

// A read on a grant revoked before it was attached, started by `start`: it fails with the refusal
// itself, and the session goes on for the others.
static void a_read_on_a_revoked_grant_is_refused(int (*start)(libd_transport *, size_t, uint64_t, void *, libd_op **),
                                                 bool settles) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto *first = o.holder("tcp", o.grant());
  ASSERT_EQ(0, libd_transport_connect(first)) << libd_last_error();
  auto g = o.grant();
  ASSERT_EQ(0, o.server->revoke(g.id));
  auto *t = o.holder("tcp", g);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 64, reinterpret_cast<void **>(&buf)));
  libd_op *op = nullptr;
  ASSERT_EQ(0, start(t, 64, 0, buf, &op)) << libd_last_error();
  EXPECT_EQ(-EACCES, libd_op_wait(op, 5000));
  libd_op_free(op);
  EXPECT_EQ(-EACCES, libd_trdma_remote(t, nullptr, nullptr)) << "the verdict is kept for whoever asks";
  if (settles) {
    EXPECT_NE(LIBD_STATE_READY, libd_transport_state(t));
  }
  ASSERT_EQ(0, libd_transport_terminate(t));
  char *fbuf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(first, 64, reinterpret_cast<void **>(&fbuf)));
  EXPECT_EQ(0, libd_trdma_read(first, 64, 0, fbuf)) << "the session goes on: " << libd_last_error();
  EXPECT_EQ(1u, o.server->connections());
}

TEST(SharedTcp, AnOperationOnARevokedGrantFailsWithTheRefusal) {
  a_read_on_a_revoked_grant_is_refused(libd_trdma_read_async, true);
}

TEST_P(Shared, TheLastWordLetsGoOfTheGrantInTheSameWrite) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto [first, t, g, buf] = second_holder(o, GetParam(), 64);
  ASSERT_EQ(0, libd_trdma_read(t, 64, 0, buf)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_notify_last(t, 9, 0)) << libd_last_error();
  libd::Notice n;
  ASSERT_EQ(0, o.server->wait_notify(g.id, &n, 3000)) << libd_last_error();
  EXPECT_EQ(9u, n.value);
  // The owner, woken by the word, finds nobody holding the grant: ending it is no trip to the loop.
  EXPECT_EQ(0u, o.server->holders(g.id)) << "the DETACH is counted before the word is handed over";
  EXPECT_EQ(1u, o.server->connections()) << "after the word";
  EXPECT_NE(0, libd_trdma_read(t, 64, 0, buf)) << "the holder let go of the grant";
  EXPECT_EQ(1u, o.server->connections()) << "after the read: " << libd_last_error();
  ASSERT_EQ(0, libd_transport_terminate(t));
  EXPECT_EQ(-ETIMEDOUT, o.server->wait_notify(g.id, &n, 100)) << "no loss: it said it was done";
  EXPECT_EQ(0, o.server->revoke(g.id));
  EXPECT_EQ(1u, o.server->connections()) << test::transport_error(first) << " | " << test::transport_error(t);
}

TEST_P(Shared, AWriteWithItsWordBehindItIsInTheOwnersMemoryWhenTheWordComes) {
  std::vector<char> mem(4096, 0);
  Owner o(mem);
  auto [first, t, g, buf] = second_holder(o, GetParam(), 1024);
  test::fill_random(buf, 1024, 17);
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_write_async_notify(t, 1024, 512, buf, 21, 0, &op)) << libd_last_error();
  libd::Notice n;
  ASSERT_EQ(0, o.server->wait_notify(g.id, &n, 3000)) << libd_last_error();
  EXPECT_EQ(21u, n.value);
  EXPECT_EQ(0, n.status);
  EXPECT_EQ(0, std::memcmp(mem.data() + 512, buf, 1024)) << "the word came before the data it follows";
  EXPECT_EQ(0, libd_op_wait(op, 3000)) << libd_last_error();
  libd_op_free(op);
  EXPECT_EQ(1u, o.server->connections());
}

TEST_P(Shared, AReadWithItsWordBehindItMovesTheDataAndTellsTheOwner) {
  std::vector<char> mem(4096);
  test::fill_random(mem.data(), mem.size(), 5);
  Owner o(mem);
  auto g = o.grant();
  auto *t = o.holder(GetParam(), g);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 256, reinterpret_cast<void **>(&buf)));
  for (uint64_t i = 0; i < 3; i++) {  // the first connects; the next ride the connection
    libd_op *op = nullptr;
    std::memset(buf, 0, 256);
    ASSERT_EQ(0, libd_trdma_read_async_notify(t, 256, i * 256, buf, 40 + i, 0, &op)) << libd_last_error();
    ASSERT_EQ(0, libd_op_wait(op, 3000)) << libd_last_error();
    libd_op_free(op);
    EXPECT_EQ(0, std::memcmp(mem.data() + i * 256, buf, 256));
    libd::Notice n;
    ASSERT_EQ(0, o.server->wait_notify(g.id, &n, 3000)) << libd_last_error();
    EXPECT_EQ(40 + i, n.value);
  }
}

TEST(WordBehindARequest, AWordTheTransportCannotSendLeavesItsTransferRunning) {
  auto a = make_action("words");
  ASSERT_EQ(0, libd_action_add_transport(a.get(), "m;local;size,4096")) << libd_last_error();
  auto *t = libd_action_get_transport(a.get(), "m");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 64, reinterpret_cast<void **>(&buf)));
  std::memset(buf, 7, 64);
  libd_op *op = nullptr;
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_write_async_notify(t, 64, 128, buf, 1, 0, &op)) << "local memory has no owner to tell";
  ASSERT_NE(nullptr, op) << "the transfer started all the same";
  EXPECT_EQ(0, libd_op_wait(op, 3000)) << libd_last_error();
  libd_op_free(op);
  std::memset(buf, 0, 64);
  ASSERT_EQ(0, libd_trdma_read(t, 64, 128, buf)) << libd_last_error();
  EXPECT_EQ(7, buf[63]);
  op = nullptr;
  EXPECT_EQ(-EINVAL, libd_trdma_read_async_notify(nullptr, 64, 0, buf, 1, 0, &op));
  EXPECT_EQ(nullptr, op);
  EXPECT_EQ(-EINVAL, libd_trdma_read_async_notify(t, 64, 0, buf, 1, 0x40, &op)) << "an unknown flag";
  EXPECT_EQ(nullptr, op);
}

// Waits until the server counts `n` holders of the grant (a DETACH is read by the server's loop).
static void wait_holders(libd::MemoryServer &server, const std::string &grant, size_t n) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server.holders(grant) != n && std::chrono::steady_clock::now() < until) std::this_thread::yield();
  ASSERT_EQ(n, server.holders(grant));
}

TEST_P(Shared, ALastTransferLetsGoOfTheGrantOnceAnswered) {
  std::vector<char> mem(4096);
  test::fill_random(mem.data(), mem.size(), 13);
  Owner o(mem);
  auto [first, t, g, buf] = second_holder(o, GetParam(), 512);
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async_last(t, 512, 1024, buf, &op)) << libd_last_error();
  ASSERT_EQ(0, libd_op_wait(op, 3000)) << "the read completes all the same: " << libd_last_error();
  libd_op_free(op);
  EXPECT_EQ(0, std::memcmp(mem.data() + 1024, buf, 512));
  if (GetParam() == "tcp") {
    wait_holders(*o.server, g.id, 0);  // let go of behind the request, before any terminate
    EXPECT_NE(0, libd_trdma_read(t, 64, 0, buf)) << "the holder let go of the grant";
  }
  ASSERT_EQ(0, libd_transport_terminate(t));
  wait_holders(*o.server, g.id, 0);
  EXPECT_EQ(1u, o.server->connections()) << "the session goes on for the others";
  char *fbuf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(first, 64, reinterpret_cast<void **>(&fbuf)));
  EXPECT_EQ(0, libd_trdma_read(first, 64, 0, fbuf)) << libd_last_error();
}

TEST_P(Shared, ALastWriteWithItsLastWordLeavesNobodyHoldingTheGrant) {
  std::vector<char> mem(4096, 0);
  Owner o(mem);
  auto [first, t, g, buf] = second_holder(o, GetParam(), 256);
  test::fill_random(buf, 256, 29);
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_write_async_notify(t, 256, 0, buf, 33, LIBD_WORD_LAST, &op)) << libd_last_error();
  libd::Notice n;
  ASSERT_EQ(0, o.server->wait_notify(g.id, &n, 3000)) << libd_last_error();
  EXPECT_EQ(33u, n.value);
  EXPECT_EQ(0, std::memcmp(mem.data(), buf, 256));
  EXPECT_EQ(0u, o.server->holders(g.id)) << "the DETACH is counted before the word is handed over";
  EXPECT_EQ(0, libd_op_wait(op, 3000)) << libd_last_error();
  libd_op_free(op);
  ASSERT_EQ(0, libd_transport_terminate(t));
  EXPECT_EQ(0, o.server->revoke(g.id));
  EXPECT_EQ(1u, o.server->connections());
}

TEST(SharedTcp, ALastReadOnARevokedGrantFailsWithTheRefusal) {
  // The holder let go of the grant behind its request: the refusal fails the read all the same
  // (the transport, which moves nothing more, is not put in ERROR for it).
  a_read_on_a_revoked_grant_is_refused(libd_trdma_read_async_last, false);
}

TEST_P(Shared, APlainWordKeepsTheGrantUntilTheHolderLeaves) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto g = o.grant();
  auto *t = o.holder(GetParam(), g);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 64, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_read(t, 64, 0, buf)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_notify(t, 5, 0)) << libd_last_error();
  libd::Notice n;
  ASSERT_EQ(0, o.server->wait_notify(g.id, &n, 3000)) << libd_last_error();
  EXPECT_EQ(1u, o.server->holders(g.id)) << "a word alone does not let go of the grant";
  ASSERT_EQ(0, libd_trdma_read(t, 64, 0, buf)) << libd_last_error();
  ASSERT_EQ(0, libd_transport_terminate(t));
}

// announce,0 (shm, a grant the owner's table vouches for): the server hears of the holder only
// with its word; one that leaves without a word was never there for it.
TEST(UnannouncedShm, AHolderThatLeavesWithoutAWordIsNeverSeen) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto *first = o.holder("shm", o.grant());
  ASSERT_EQ(0, libd_transport_connect(first)) << libd_last_error();  // the session, for the table
  for (std::string announce : {"1", "0"}) {
    auto g = o.grant();
    auto *t = o.holder("shm", g, "holder", "announce," + announce + ";");
    char *buf = nullptr;
    ASSERT_EQ(0, libd_trdma_reg(t, 64, reinterpret_cast<void **>(&buf)));
    ASSERT_EQ(0, libd_trdma_read(t, 64, 0, buf)) << libd_last_error();
    ASSERT_EQ(0, libd_transport_terminate(t));
    libd::Notice n;
    if (announce == "1") {
      EXPECT_EQ(-ECONNRESET, o.server->wait_notify(g.id, &n, 3000)) << "an announced holder that left is a loss";
    } else {
      EXPECT_EQ(-ETIMEDOUT, o.server->wait_notify(g.id, &n, 200)) << "an unannounced one was never there";
      EXPECT_EQ(0u, o.server->holders(g.id));
    }
  }
}

TEST(UnannouncedShm, ItsWordReachesTheOwnerAndARevokeCutsItOff) {
  std::vector<char> mem(4096);
  test::fill_random(mem.data(), mem.size(), 5);
  Owner o(mem);
  auto *first = o.holder("shm", o.grant());
  ASSERT_EQ(0, libd_transport_connect(first)) << libd_last_error();
  auto g = o.grant();
  auto *t = o.holder("shm", g, "holder", "announce,0;");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 128, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_read(t, 64, 0, buf)) << libd_last_error();
  EXPECT_EQ(0, memcmp(buf, mem.data(), 64));
  ASSERT_EQ(0, libd_trdma_notify(t, 41, 0)) << libd_last_error();
  libd::Notice n;
  ASSERT_EQ(0, o.server->wait_notify(g.id, &n, 3000)) << "the word announces the holder: " << libd_last_error();
  EXPECT_EQ(41u, n.value);
  EXPECT_EQ(1u, o.server->holders(g.id));
  auto g2 = o.grant();
  auto *t2 = o.holder("shm", g2, "holder-2", "announce,0;");
  ASSERT_EQ(0, libd_trdma_reg(t2, 64, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_read(t2, 64, 0, buf)) << libd_last_error();
  ASSERT_EQ(0, o.server->revoke(g2.id));
  EXPECT_NE(0, libd_trdma_read(t2, 64, 0, buf)) << "the slot, checked before each transfer, cuts it off";
}

TEST(UnannouncedShm, AnnounceTakesZeroOrOne) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto action = make_action("holder");
  std::string durl = "t;shm;share,1;announce,2;" + o.server->client_config(o.grant());
  EXPECT_EQ(-EINVAL, libd_action_add_transport(action.get(), durl.c_str()));
}

// A holder on this host that the owner's server never heard of (announce,0: no ATTACH, so no
// DETACHED can come) learns of its grant's expiry from the owner's table alone, at its next
// transfer: the cleared slot says why the grant ended.
TEST(SharedShm, AnExpiredGrantsSlotTellsAHolderTheServerNeverHeardOfWhy) {
  std::vector<char> mem(4096);
  Owner o(mem);
  auto *first = o.holder("shm", o.grant());  // opens the session (AUTH_OK says where the table is)
  ASSERT_EQ(0, libd_transport_connect(first)) << libd_last_error();
  auto g = o.grant("buf", 3, /*ttl_ms=*/200);
  auto *t = o.holder("shm", g, "holder", "announce,0;");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 64, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_read(t, 64, 0, buf)) << libd_last_error();
  EXPECT_EQ(0u, o.server->holders(g.id)) << "the holder was announced";
  libd::Notice n;
  ASSERT_EQ(-EKEYEXPIRED, o.server->wait_notify(g.id, &n, 10000));
  EXPECT_EQ(-ECONNRESET, libd_trdma_read(t, 64, 0, buf));
  std::string why = libd_last_error();
  EXPECT_NE(std::string::npos, why.find("let this grant expire")) << why;
  // Revoked, the slot says nothing more than that the grant ended.
  auto r = o.grant();
  auto *u = o.holder("shm", r, "holder-2", "announce,0;");
  ASSERT_EQ(0, libd_trdma_reg(u, 64, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_read(u, 64, 0, buf)) << libd_last_error();
  ASSERT_EQ(0, o.server->revoke(r.id));
  EXPECT_EQ(-ECONNRESET, libd_trdma_read(u, 64, 0, buf));
  why = libd_last_error();
  EXPECT_NE(std::string::npos, why.find("ended this grant")) << why;
  EXPECT_EQ(std::string::npos, why.find("let this grant expire")) << why;
}
