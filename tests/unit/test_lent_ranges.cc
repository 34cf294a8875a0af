// Memory lent as several ranges, through the public C API: an owner serves a list of its own
// buffers as one element (libd_trdma_server_expose_ranges) under one grant, and a holder that
// registered a list of its own (libd_trdma_reg_ranges) moves all of them with one readv/writev.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness.h"

using test::make_action;

namespace {

// "shm+share" is shm on the process's shared connection (share,1), where the grant is attached
// from the owner's grant table.
std::string impl_of(const std::string &param) {
  auto plus = param.find("+share");
  return plus == std::string::npos ? param : param.substr(0, plus) + ";share,1";
}

// The owner's three buffers, of unequal sizes, apart from each other on the heap.
struct Owned {
  std::vector<char> a = std::vector<char>(100), b = std::vector<char>(4096), c = std::vector<char>(1 << 16);
  std::vector<libd_range> ranges() { return {{a.data(), a.size()}, {b.data(), b.size()}, {c.data(), c.size()}}; }
  uint64_t total() const { return a.size() + b.size() + c.size(); }
};

struct Pair {
  test::ActionPtr owner, holder;
  libd_transport *srv = nullptr, *t = nullptr;
  std::string config;
};

Pair make_pair(const std::string &impl, Owned &mem, unsigned rights = 3) {
  Pair p;
  p.owner = make_action("owner");
  std::string kind = impl == "verbs" ? "verbs_server" : "tcp_server";
  std::string durl = "srv;" + kind + ";size,0;path," + test::unique_socket_path("ranges");
  EXPECT_EQ(0, libd_action_add_transport(p.owner.get(), durl.c_str())) << libd_last_error();
  p.srv = libd_action_get_transport(p.owner.get(), "srv");
  EXPECT_EQ(0, libd_trdma_server_serve(p.srv)) << libd_last_error();
  auto r = mem.ranges();
  EXPECT_EQ(0, libd_trdma_server_expose_ranges(p.srv, "list", r.data(), int(r.size()))) << libd_last_error();
  libd_grant_spec spec = {"list", "holder", 0, 0, rights, 0};
  char out[2048];
  int rc = libd_trdma_server_grant_ex(p.srv, &spec, out, sizeof out);
  EXPECT_GT(rc, 0) << libd_last_error();
  p.config = rc > 0 ? std::string(out) : std::string();
  p.holder = make_action("holder");
  std::string hdurl = "m;" + impl_of(impl) + ";" + p.config + ";timeout_ms,3000";
  EXPECT_EQ(0, libd_action_add_transport(p.holder.get(), hdurl.c_str())) << libd_last_error();
  p.t = libd_action_get_transport(p.holder.get(), "m");
  return p;
}

class LentRanges : public ::testing::TestWithParam<std::string> {};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Impl, LentRanges, ::testing::Values("shm", "tcp", "shm+share", "tcp+share"), [](const auto &i) {
  std::string name = i.param;
  auto plus = name.find('+');
  return plus == std::string::npos ? name : name.substr(0, plus) + "_shared";
});

TEST_P(LentRanges, AListOfBuffersIsReadAndWrittenInPlaceUnderOneGrant) {
  Owned mem;
  test::fill_random(mem.a.data(), mem.a.size(), 1);
  test::fill_random(mem.b.data(), mem.b.size(), 2);
  test::fill_random(mem.c.data(), mem.c.size(), 3);
  auto p = make_pair(GetParam(), mem);
  uint64_t size = 0;
  unsigned rights = 0;
  ASSERT_EQ(0, libd_trdma_remote(p.t, &size, &rights)) << libd_last_error();
  EXPECT_EQ(mem.total(), size) << "the grant spans the three ranges, end to end";

  // The holder's own list: three buffers of the same sizes, registered at once.
  std::vector<char> x(100), y(4096), z(1 << 16);
  libd_range mine[3] = {{z.data(), z.size()}, {x.data(), x.size()}, {y.data(), y.size()}};  // any order
  ASSERT_EQ(0, libd_trdma_reg_ranges(p.t, mine, 3)) << libd_last_error();
  libd_iov list[3] = {{x.size(), 0, x.data()}, {y.size(), 100, y.data()}, {z.size(), 4196, z.data()}};
  ASSERT_EQ(0, libd_trdma_readv(p.t, list, 3)) << libd_last_error();
  EXPECT_EQ(0, memcmp(x.data(), mem.a.data(), x.size()));
  EXPECT_EQ(0, memcmp(y.data(), mem.b.data(), y.size()));
  EXPECT_EQ(0, memcmp(z.data(), mem.c.data(), z.size()));

  // Inside one range, at an offset of its own.
  char part[64];
  libd_range one = {part, sizeof part};
  ASSERT_EQ(0, libd_trdma_reg_ranges(p.t, &one, 1)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_read(p.t, sizeof part, 100 + 1000, part)) << libd_last_error();
  EXPECT_EQ(0, memcmp(part, mem.b.data() + 1000, sizeof part));

  ASSERT_EQ(0, libd_trdma_reg_ranges(p.t, mine, 3)) << libd_last_error();
  test::fill_random(x.data(), x.size(), 4);
  test::fill_random(y.data(), y.size(), 5);
  test::fill_random(z.data(), z.size(), 6);
  ASSERT_EQ(0, libd_trdma_writev(p.t, list, 3)) << libd_last_error();
  EXPECT_EQ(0, memcmp(x.data(), mem.a.data(), x.size())) << "the writes landed in the owner's own buffers";
  EXPECT_EQ(0, memcmp(y.data(), mem.b.data(), y.size()));
  EXPECT_EQ(0, memcmp(z.data(), mem.c.data(), z.size()));
}

TEST_P(LentRanges, ATransferThatCrossesFromOneRangeIntoTheNextIsRefusedAndTheRestGoesOn) {
  Owned mem;
  test::fill_random(mem.b.data(), mem.b.size(), 7);
  auto p = make_pair(GetParam(), mem);
  std::vector<char> buf(256);
  libd_range r = {buf.data(), buf.size()};
  ASSERT_EQ(0, libd_trdma_reg_ranges(p.t, &r, 1)) << libd_last_error();
  // Bytes 90..110 are the end of the first buffer and the start of the second: not one run of
  // the owner's memory (the bytes between the two buffers are not lent).
  EXPECT_EQ(-EINVAL, libd_trdma_read(p.t, 20, 90, buf.data()));
  EXPECT_NE(std::string(libd_last_error()).find("crosses"), std::string::npos) << libd_last_error();
  EXPECT_EQ(-EINVAL, libd_trdma_write(p.t, 20, 90, buf.data()));
  // The transport and the grant are still good.
  ASSERT_EQ(0, libd_trdma_read(p.t, 256, 100, buf.data())) << libd_last_error();
  EXPECT_EQ(0, memcmp(buf.data(), mem.b.data(), 256));
}

TEST_P(LentRanges, AWithdrawnListCutsItsHolderOff) {
  Owned mem;
  auto p = make_pair(GetParam(), mem);
  char b[16];
  libd_range r = {b, sizeof b};
  ASSERT_EQ(0, libd_trdma_reg_ranges(p.t, &r, 1)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_read(p.t, sizeof b, 4196, b)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_server_withdraw(p.srv, "list")) << libd_last_error();
  // Over shm the owner tells the holder on its socket (the holder moves the bytes itself).
  uint64_t seq = 0;
  while (libd_transport_state(p.t) == LIBD_STATE_READY)
    ASSERT_GE(libd_transport_wait_change(p.t, &seq, 5000), 0) << "the holder was not cut off";
  EXPECT_NE(0, libd_trdma_read(p.t, sizeof b, 4196, b)) << "the list is no longer lent";
}

TEST_P(LentRanges, ALocalBufferOutsideEveryRegisteredOneIsRefused) {
  Owned mem;
  auto p = make_pair(GetParam(), mem);
  std::vector<char> x(100), y(100), elsewhere(100);
  libd_range mine[2] = {{x.data(), x.size()}, {y.data(), y.size()}};
  ASSERT_EQ(0, libd_trdma_reg_ranges(p.t, mine, 2)) << libd_last_error();
  EXPECT_EQ(-ERANGE, libd_trdma_read(p.t, 100, 0, elsewhere.data()));
  EXPECT_EQ(-ERANGE, libd_trdma_read(p.t, 100, 0, x.data() + 1)) << "runs past the end of x";
  EXPECT_EQ(0, libd_trdma_read(p.t, 100, 0, y.data())) << libd_last_error();
  // Registering the lowest of them again, alone, replaces the list: y is no longer registered.
  void *first = x.data() < y.data() ? x.data() : y.data();
  void *second = first == x.data() ? y.data() : x.data();
  ASSERT_EQ(0, libd_trdma_reg(p.t, 100, &first)) << libd_last_error();
  EXPECT_EQ(0, libd_trdma_read(p.t, 100, 0, first)) << libd_last_error();
  EXPECT_EQ(-ERANGE, libd_trdma_read(p.t, 100, 0, second));
}

TEST(LentRangesApi, ErrorsNameTheProblem) {
  auto owner = make_action("owner");
  std::string durl = "srv;tcp_server;size,0;path," + test::unique_socket_path("ranges-api");
  ASSERT_EQ(0, libd_action_add_transport(owner.get(), durl.c_str())) << libd_last_error();
  libd_transport *srv = libd_action_get_transport(owner.get(), "srv");
  std::vector<char> a(10), b(10);
  libd_range r[2] = {{a.data(), a.size()}, {b.data(), b.size()}};
  EXPECT_EQ(-ENOTCONN, libd_trdma_server_expose_ranges(srv, "x", r, 2)) << "not serving yet";
  ASSERT_EQ(0, libd_trdma_server_serve(srv)) << libd_last_error();
  EXPECT_EQ(-EINVAL, libd_trdma_server_expose_ranges(srv, "x", r, 0));
  EXPECT_EQ(-EINVAL, libd_trdma_server_expose_ranges(srv, "x", r, LIBD_MAX_RANGES + 1));
  libd_range empty[2] = {{a.data(), 10}, {b.data(), 0}};
  EXPECT_EQ(-EINVAL, libd_trdma_server_expose_ranges(srv, "x", empty, 2));
  EXPECT_NE(std::string(libd_last_error()).find("range 1"), std::string::npos) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_server_expose_ranges(srv, "x", r, 2)) << libd_last_error();
  EXPECT_EQ(-EEXIST, libd_trdma_server_expose_ranges(srv, "x", r, 2));
  // A grant opens the whole list or nothing: part of it would be a range of a range.
  libd_grant_spec part = {"x", "*", 0, 10, LIBD_RIGHT_READ, 0};
  char out[1024];
  EXPECT_EQ(-ERANGE, libd_trdma_server_grant_ex(srv, &part, out, sizeof out));
  libd_grant_spec whole = {"x", "*", 0, 0, LIBD_RIGHT_READ, 0};
  EXPECT_GT(libd_trdma_server_grant_ex(srv, &whole, out, sizeof out), 0) << libd_last_error();

  auto holder = make_action("holder");
  ASSERT_EQ(0, libd_action_add_transport(holder.get(), ("m;tcp;" + std::string(out)).c_str())) << libd_last_error();
  libd_transport *t = libd_action_get_transport(holder.get(), "m");
  EXPECT_EQ(-EINVAL, libd_trdma_reg_ranges(t, r, 0));
  EXPECT_EQ(-EINVAL, libd_trdma_reg_ranges(t, empty, 2));
}

TEST(LentRangesVerbs, AVerbsHolderIsToldToLendEachRangeOnItsOwn) {
  if (!test::verbs_wanted()) GTEST_SKIP() << "no RDMA device on this host";
  Owned mem;
  auto p = make_pair("verbs", mem);
  EXPECT_EQ(-EOPNOTSUPP, libd_transport_connect(p.t));
  EXPECT_NE(std::string(libd_last_error()).find("ranges"), std::string::npos) << libd_last_error();
  std::vector<char> x(100), y(100);
  libd_range mine[2] = {{x.data(), x.size()}, {y.data(), y.size()}};
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_reg_ranges(p.t, mine, 2));
}

// On a shared connection a second grant is attached from the owner's grant table, with no round
// trip: its slot names the table of ranges, which the holder reads from the owner itself.
TEST(LentRangesShm, AGrantAttachedFromTheOwnersTableFindsEachRange) {
  Owned mem;
  test::fill_random(mem.a.data(), mem.a.size(), 8);
  test::fill_random(mem.c.data(), mem.c.size(), 9);
  auto p = make_pair("shm+share", mem, LIBD_RIGHT_READ);
  char b[8];
  libd_range r = {b, sizeof b};
  ASSERT_EQ(0, libd_trdma_reg_ranges(p.t, &r, 1)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_read(p.t, sizeof b, 0, b)) << libd_last_error();  // opens the session
  libd_grant_spec spec = {"list", "holder", 0, 0, LIBD_RIGHT_READ, 0};
  char out[2048];
  ASSERT_GT(libd_trdma_server_grant_ex(p.srv, &spec, out, sizeof out), 0) << libd_last_error();
  std::string config(out);
  ASSERT_NE(config.find("_"), std::string::npos) << "a grant on a whole lent element has a slot: " << config;
  std::string durl = "m2;shm;share,1;" + config + ";timeout_ms,3000";
  ASSERT_EQ(0, libd_action_add_transport(p.holder.get(), durl.c_str())) << libd_last_error();
  libd_transport *t2 = libd_action_get_transport(p.holder.get(), "m2");
  std::vector<char> x(100), z(1 << 16);
  libd_range mine[2] = {{x.data(), x.size()}, {z.data(), z.size()}};
  ASSERT_EQ(0, libd_trdma_reg_ranges(t2, mine, 2)) << libd_last_error();
  libd_iov list[2] = {{x.size(), 0, x.data()}, {z.size(), 4196, z.data()}};
  ASSERT_EQ(0, libd_trdma_readv(t2, list, 2)) << libd_last_error();
  EXPECT_EQ(0, memcmp(x.data(), mem.a.data(), x.size()));
  EXPECT_EQ(0, memcmp(z.data(), mem.c.data(), z.size()));
  EXPECT_EQ(-EINVAL, libd_trdma_read(t2, 20, 90, x.data())) << "crossing is refused on this path too";
  // The slot moves when the owner withdraws the list: the holder finds out before its next copy
  // (this holds because the grant came from the table: over ATTACH the word would come later).
  ASSERT_EQ(0, libd_trdma_server_withdraw(p.srv, "list")) << libd_last_error();
  EXPECT_NE(0, libd_trdma_readv(t2, list, 2)) << "the list is no longer lent";
}
