// Lent memory and completion notifications, through the public C API: an owner serves its own
// buffer in place (size,0 server + libd_trdma_server_expose), grants it with an expiry, and
// learns from libd_trdma_server_wait_notify when the holder is done — or that it vanished.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"

using test::make_action;

namespace {

// An owner serving lent memory over tcp and a unix socket (verbs_server for "verbs"), and a
// holder transport of the implementation under test.
struct Pair {
  test::ActionPtr owner, holder;
  libd_transport *srv = nullptr, *t = nullptr;
  std::string config, grant_id;
};

// A test parameter as a durl's implementation: "shm+share" is shm on the process's shared
// connection (share,1).
std::string impl_of(const std::string &param) {
  auto plus = param.find("+share");
  return plus == std::string::npos ? param : param.substr(0, plus) + ";share,1";
}

std::string grant_id_of(const std::string &config) {
  auto at = config.find("grant,") + 6;
  return config.substr(at, config.find(';', at) - at);
}

std::string grant(libd_transport *srv, const char *element, unsigned rights, uint64_t ttl_ms, const char *client = "holder",
                  uint64_t offset = 0, uint64_t length = 0) {
  libd_grant_spec spec = {element, client, offset, length, rights, ttl_ms};
  char out[2048];
  int rc = libd_trdma_server_grant_ex(srv, &spec, out, sizeof out);
  EXPECT_GT(rc, 0) << libd_last_error();
  return rc > 0 ? std::string(out) : std::string();
}

Pair make_owner_and_holder(const std::string &impl, std::vector<char> &mem, unsigned rights = 3, uint64_t ttl_ms = 0,
               const std::string &extra = "timeout_ms,3000") {
  Pair p;
  p.owner = make_action("owner");
  std::string kind = impl == "verbs" ? "verbs_server" : "tcp_server";
  std::string durl = "srv;" + kind + ";size,0;path," + test::unique_socket_path("notify");
  EXPECT_EQ(0, libd_action_add_transport(p.owner.get(), durl.c_str())) << libd_last_error();
  p.srv = libd_action_get_transport(p.owner.get(), "srv");
  EXPECT_EQ(0, libd_trdma_server_serve(p.srv)) << libd_last_error();
  EXPECT_EQ(0, libd_trdma_server_expose(p.srv, "buf", mem.data(), mem.size())) << libd_last_error();
  p.config = grant(p.srv, "buf", rights, ttl_ms);
  p.grant_id = grant_id_of(p.config);
  p.holder = make_action("holder");
  std::string hdurl = "m;" + impl_of(impl) + ";" + p.config + ";" + extra;
  EXPECT_EQ(0, libd_action_add_transport(p.holder.get(), hdurl.c_str())) << libd_last_error();
  p.t = libd_action_get_transport(p.holder.get(), "m");
  return p;
}

class Lent : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "verbs" && !test::verbs_wanted()) GTEST_SKIP() << "no RDMA device on this host";
  }
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Impl, Lent, ::testing::Values("shm", "tcp", "verbs", "shm+share", "tcp+share"), [](const auto &i) {
  std::string name = i.param;
  auto plus = name.find('+');
  return plus == std::string::npos ? name : name.substr(0, plus) + "_shared";
});

TEST_P(Lent, TheOwnersOwnBufferIsReadAndWrittenInPlace) {
  std::vector<char> mem(1 << 20);
  test::fill_random(mem.data(), mem.size(), 1);
  auto p = make_owner_and_holder(GetParam(), mem);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(p.t, mem.size(), reinterpret_cast<void **>(&buf))) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_read(p.t, mem.size(), 0, buf)) << libd_last_error();
  EXPECT_EQ(0, memcmp(buf, mem.data(), mem.size()));
  test::fill_random(buf, 4096, 2);
  ASSERT_EQ(0, libd_trdma_write(p.t, 4096, 8192, buf)) << libd_last_error();
  EXPECT_EQ(0, memcmp(buf, mem.data() + 8192, 4096)) << "the write landed in the owner's vector itself";
}

TEST_P(Lent, NotifyWakesAnOwnerAlreadyWaiting) {
  std::vector<char> mem(4096);
  auto p = make_owner_and_holder(GetParam(), mem);
  // The owner waits first, with no timeout: only the notification can end this wait.
  auto waited = std::async(std::launch::async, [&] {
    uint64_t value = 0;
    int status = 1;
    int rc = libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, -1);
    return std::make_tuple(rc, value, status, std::string(mem.data(), 5));
  });
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(p.t, 64, reinterpret_cast<void **>(&buf)));
  memcpy(buf, "hello", 5);
  ASSERT_EQ(0, libd_trdma_write(p.t, 5, 0, buf)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_notify(p.t, 0xfeedfacecafeULL, 0)) << libd_last_error();
  auto [rc, value, status, seen] = waited.get();
  EXPECT_EQ(0, rc) << libd_last_error();
  EXPECT_EQ(0xfeedfacecafeULL, value);
  EXPECT_EQ(0, status);
  EXPECT_EQ("hello", seen) << "the owner learns 'done' only after the data is in place";
}

TEST_P(Lent, NotificationsQueueInOrderAndCarryAGiveUpStatus) {
  std::vector<char> mem(4096);
  auto p = make_owner_and_holder(GetParam(), mem);
  ASSERT_EQ(0, libd_trdma_notify(p.t, 1, 0)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_notify(p.t, 2, -ECANCELED)) << libd_last_error();
  EXPECT_EQ(-EINVAL, libd_trdma_notify(p.t, 3, 5));
  uint64_t value;
  int status;
  ASSERT_EQ(0, libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, 3000)) << libd_last_error();
  EXPECT_EQ(1u, value);
  EXPECT_EQ(0, status);
  ASSERT_EQ(0, libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, 3000)) << libd_last_error();
  EXPECT_EQ(2u, value);
  EXPECT_EQ(-ECANCELED, status);
  EXPECT_EQ(-ETIMEDOUT, libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, 50));
}

TEST_P(Lent, AHolderThatLeavesWithoutNotifyingEndsTheOwnersWait) {
  std::vector<char> mem(4096);
  auto p = make_owner_and_holder(GetParam(), mem);
  ASSERT_EQ(0, libd_transport_connect(p.t)) << libd_last_error();
  auto waited = std::async(std::launch::async, [&] {
    uint64_t value;
    int status;
    int rc = libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, -1);
    return std::make_pair(rc, std::string(libd_last_error()));  // the message is the waiting thread's
  });
  ASSERT_EQ(0, libd_transport_terminate(p.t));
  auto [rc, why] = waited.get();
  EXPECT_EQ(-ECONNRESET, rc);
  EXPECT_NE(std::string::npos, why.find("without saying it finished")) << why;
}

TEST_P(Lent, AHolderThatNotifiedThenLeftIsNotALoss) {
  std::vector<char> mem(4096);
  auto p = make_owner_and_holder(GetParam(), mem);
  ASSERT_EQ(0, libd_trdma_notify(p.t, 7, 0)) << libd_last_error();
  ASSERT_EQ(0, libd_transport_terminate(p.t));
  uint64_t value;
  int status;
  ASSERT_EQ(0, libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, 3000));
  EXPECT_EQ(7u, value);
  EXPECT_EQ(-ETIMEDOUT, libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, 100));
}

// A holder on this host whose transfer completed before the owner ended the grant, and that only
// then says so: its word is refused at once (the grant's slot in the owner's table, which a
// holder on the process's shared connection follows), not sent or left to the race with the
// owner's DETACHED on the socket.
TEST_P(Lent, AWordAfterTheOwnerEndedTheGrantIsRefused) {
  if (GetParam() != "shm+share")
    GTEST_SKIP() << "only a holder on the shared connection follows its grant's slot (elsewhere the word is sent "
                    "and the owner drops it)";
  std::vector<char> mem(4096, 'x');
  auto p = make_owner_and_holder(GetParam(), mem);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(p.t, 64, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_read(p.t, 8, 0, buf)) << libd_last_error();
  EXPECT_EQ(0, std::memcmp(buf, "xxxxxxxx", 8));
  ASSERT_EQ(0, libd_trdma_server_revoke(p.srv, p.grant_id.c_str())) << libd_last_error();
  EXPECT_EQ(-ECONNRESET, libd_trdma_notify(p.t, 7, 0));
  EXPECT_NE(std::string(libd_last_error()).find("ended this grant"), std::string::npos) << libd_last_error();
}

TEST_P(Lent, AnExpiredGrantEndsTheWaitAndCutsTheHolderOff) {
  std::vector<char> mem(4096);
  auto p = make_owner_and_holder(GetParam(), mem, 3, /*ttl_ms=*/300);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(p.t, 64, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_write(p.t, 8, 0, buf)) << libd_last_error();
  uint64_t value;
  int status;
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(-EKEYEXPIRED, libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, 10000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // The holder's connection is closed: its transport leaves READY, and a new one is refused.
  uint64_t seq = 0;
  while (libd_transport_state(p.t) == LIBD_STATE_READY)
    ASSERT_GE(libd_transport_wait_change(p.t, &seq, 5000), 0) << "the holder was not cut off";
  auto again = make_action("holder");
  std::string durl = "m;" + impl_of(GetParam()) + ";" + p.config + ";timeout_ms,2000";
  ASSERT_EQ(0, libd_action_add_transport(again.get(), durl.c_str()));
  EXPECT_EQ(-EACCES, libd_transport_connect(libd_action_get_transport(again.get(), "m")));
  EXPECT_EQ(0, libd_trdma_server_revoke(p.srv, p.grant_id.c_str())) << "revoke frees an expired grant's record";
  EXPECT_EQ(-ENOENT, libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, 10));
}

TEST_P(Lent, RevokeEndsAWaitInProgress) {
  std::vector<char> mem(4096);
  auto p = make_owner_and_holder(GetParam(), mem);
  std::atomic<bool> waiting{false};
  auto waited = std::async(std::launch::async, [&] {
    uint64_t value;
    int status;
    waiting = true;
    return libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, -1);
  });
  while (!waiting) std::this_thread::yield();
  ASSERT_EQ(0, libd_trdma_server_revoke(p.srv, p.grant_id.c_str())) << libd_last_error();
  int rc = waited.get();
  // Revoked before the wait began it is -ENOENT; during it, -ECANCELED: either way it ends.
  EXPECT_TRUE(rc == -ECANCELED || rc == -ENOENT) << rc;
  EXPECT_EQ(-ENOENT, libd_trdma_server_revoke(p.srv, p.grant_id.c_str()));
}

TEST_P(Lent, AGrantCoversExactlyItsRangeAndDirection) {
  std::vector<char> mem(8192);
  auto p = make_owner_and_holder(GetParam(), mem);
  std::string ro = grant(p.srv, "buf", LIBD_RIGHT_READ, 0, "holder", 4096, 1024);
  auto a = make_action("holder");
  std::string durl = "r;" + impl_of(GetParam()) + ";" + ro + ";timeout_ms,2000";
  ASSERT_EQ(0, libd_action_add_transport(a.get(), durl.c_str()));
  auto *t = libd_action_get_transport(a.get(), "r");
  if (GetParam().rfind("shm", 0) == 0) {
    // A peer attached to the owner's process is not confined to a range by the kernel, as a
    // mapped memfd is not: shm refuses a grant on part of an element, lent or not.
    EXPECT_EQ(-EPERM, libd_transport_connect(t));
    std::string whole = grant(p.srv, "buf", LIBD_RIGHT_READ, 0);
    auto w = make_action("holder");
    std::string wdurl = "w;shm;" + whole + ";timeout_ms,2000";
    ASSERT_EQ(0, libd_action_add_transport(w.get(), wdurl.c_str()));
    auto *wt = libd_action_get_transport(w.get(), "w");
    char *wbuf = nullptr;
    ASSERT_EQ(0, libd_trdma_reg(wt, 8192, reinterpret_cast<void **>(&wbuf)));
    EXPECT_EQ(0, libd_trdma_read(wt, 8192, 0, wbuf)) << libd_last_error();
    EXPECT_EQ(-EACCES, libd_trdma_write(wt, 8, 0, wbuf));
    return;
  }
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 4096, reinterpret_cast<void **>(&buf)));
  uint64_t size;
  unsigned rights;
  ASSERT_EQ(0, libd_trdma_remote(t, &size, &rights)) << libd_last_error();
  EXPECT_EQ(unsigned(LIBD_RIGHT_READ), rights);
  EXPECT_EQ(0, libd_trdma_read(t, 1024, 4096, buf)) << libd_last_error();
  EXPECT_EQ(-EACCES, libd_trdma_write(t, 8, 4096, buf));
  EXPECT_EQ(-ERANGE, libd_trdma_read(t, 8, 0, buf));
  EXPECT_EQ(-ERANGE, libd_trdma_read(t, 8, 4096 + 1024, buf));
  // Another action's copy of the same configuration is refused.
  auto thief = make_action("someone-else");
  std::string tdurl = "x;" + impl_of(GetParam()) + ";" + ro + ";timeout_ms,2000";
  ASSERT_EQ(0, libd_action_add_transport(thief.get(), tdurl.c_str()));
  EXPECT_EQ(-EACCES, libd_transport_connect(libd_action_get_transport(thief.get(), "x")));
}

TEST_P(Lent, WithdrawCutsHoldersOff) {
  std::vector<char> mem(4096);
  auto p = make_owner_and_holder(GetParam(), mem);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(p.t, 64, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_write(p.t, 8, 0, buf)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_server_withdraw(p.srv, "buf")) << libd_last_error();
  uint64_t seq = 0;
  while (libd_transport_state(p.t) == LIBD_STATE_READY)
    ASSERT_GE(libd_transport_wait_change(p.t, &seq, 5000), 0) << "the holder was not cut off";
  EXPECT_NE(0, libd_trdma_write(p.t, 8, 0, buf));
  EXPECT_EQ(-ENOENT, libd_trdma_server_withdraw(p.srv, "buf"));
  uint64_t value;
  int status;
  EXPECT_EQ(-ENOENT, libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, 10));
}

TEST(LentApi, ErrorsNameTheProblem) {
  auto owner = make_action("owner");
  ASSERT_EQ(0, libd_action_add_transport(owner.get(), "srv;tcp_server;size,0"));
  auto *srv = libd_action_get_transport(owner.get(), "srv");
  char b[16];
  EXPECT_EQ(-ENOTCONN, libd_trdma_server_expose(srv, "x", b, sizeof b));
  ASSERT_EQ(0, libd_trdma_server_serve(srv)) << libd_last_error();
  EXPECT_EQ(-EINVAL, libd_trdma_server_expose(srv, "x", nullptr, 16));
  EXPECT_EQ(-EINVAL, libd_trdma_server_expose(srv, "x", b, 0));
  ASSERT_EQ(0, libd_trdma_server_expose(srv, "x", b, sizeof b));
  EXPECT_EQ(-EEXIST, libd_trdma_server_expose(srv, "x", b, sizeof b));
  libd_grant_spec outside = {"x", "c", 8, 16, LIBD_RIGHT_READ, 0};
  char out[1024];
  EXPECT_EQ(-ERANGE, libd_trdma_server_grant_ex(srv, &outside, out, sizeof out));
  libd_grant_spec none = {"nope", "c", 0, 0, LIBD_RIGHT_READ, 0};
  EXPECT_EQ(-ENOENT, libd_trdma_server_grant_ex(srv, &none, out, sizeof out));
  uint64_t value;
  int status;
  EXPECT_EQ(-ENOENT, libd_trdma_server_wait_notify(srv, "gnothere", &value, &status, 10));
  // The server's own element does not exist with size,0.
  EXPECT_EQ(-ENOENT, libd_trdma_server_grant(srv, "c", 0, 0, LIBD_RIGHT_READ, out, sizeof out));
  // A client transport has no owner side, a server none of the holder's.
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_notify(srv, 1, 0));
  ASSERT_EQ(0, libd_trdma_server_withdraw(srv, "x"));
}

TEST(LentApi, StopEndsEveryWait) {
  std::vector<char> mem(4096);
  auto p = make_owner_and_holder("tcp", mem);
  auto waited = std::async(std::launch::async, [&] {
    uint64_t value;
    int status;
    return libd_trdma_server_wait_notify(p.srv, p.grant_id.c_str(), &value, &status, -1);
  });
  ASSERT_EQ(0, libd_transport_connect(p.t)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_server_stop(p.srv));
  int rc = waited.get();
  EXPECT_TRUE(rc == -ECANCELED || rc == -ENOTCONN || rc == -ENOENT) << rc;
}
