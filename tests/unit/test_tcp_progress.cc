// A waiter that polls a tcp operation (libd_op_poll) reads the answer off the socket itself when
// nobody else is reading: its completion does not wait for the shared loop's thread to wake up.
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "harness.h"
#include "io/ioloop.h"

namespace {

// Holds the process's shared client loop until released: nothing the loop does happens meanwhile.
struct StalledLoop {
  std::promise<void> release;
  std::promise<void> entered;
  StalledLoop() {
    auto gate = release.get_future().share();
    libd::IoLoop::shared().post([this, gate] {
      entered.set_value();
      gate.wait();
    });
    entered.get_future().wait();
  }
  ~StalledLoop() { release.set_value(); }
};

void poll_until_done(libd_op *op, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (libd_op_poll(op) == -EINPROGRESS && std::chrono::steady_clock::now() < end) std::this_thread::yield();
}

class TcpProgress : public ::testing::TestWithParam<std::string> {};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Share, TcpProgress, ::testing::Values("", "share,1"),
                         [](const auto &i) { return i.param.empty() ? std::string("own") : std::string("shared"); });

TEST_P(TcpProgress, APollingWaiterCompletesItsReadWhileTheLoopIsBusy) {
  auto rig = test::make_rig("tcp", 1 << 16, 3, GetParam());
  ASSERT_NE(nullptr, rig.t);
  ASSERT_EQ(0, libd_transport_connect(rig.t)) << libd_last_error();
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 4096, reinterpret_cast<void **>(&buf)));
  std::vector<libd_op *> ops;
  {
    StalledLoop stalled;
    for (int i = 0; i < 4; i++) {
      libd_op *op = nullptr;
      ASSERT_EQ(0, libd_trdma_read_async(rig.t, 1024, uint64_t(i) * 1024, buf + i * 1024, &op)) << libd_last_error();
      ops.push_back(op);
    }
    for (auto *op : ops) {
      poll_until_done(op, std::chrono::milliseconds(3000));
      EXPECT_EQ(0, libd_op_poll(op)) << "completed by its waiter, the loop being held";
    }
  }
  for (auto *op : ops) libd_op_free(op);
}

// busy_poll_us: a blocking call looks at its socket without sleeping for that long before it
// blocks, so a small read's answer finds it awake (no context switch of its own per read).
TEST(TcpBusyPoll, ABlockingReadPollsInsteadOfSleeping) {
  auto rig = test::make_rig("tcp", 1 << 16, 3, "busy_poll_us,200000");
  ASSERT_EQ(0, libd_transport_connect(rig.t)) << libd_last_error();
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 64, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_read(rig.t, 64, 0, buf)) << libd_last_error();
  struct rusage before, after;
  getrusage(RUSAGE_THREAD, &before);
  for (int i = 0; i < 200; i++) ASSERT_EQ(0, libd_trdma_read(rig.t, 64, 0, buf)) << libd_last_error();
  getrusage(RUSAGE_THREAD, &after);
  EXPECT_LT(after.ru_nvcsw - before.ru_nvcsw, 100) << "the reader slept waiting for its answers";
}

TEST(TcpBusyPoll, TheParameterIsChecked) {
  for (const char *bad : {"busy_poll_us,x", "busy_poll_us,2000000"}) {
    auto action = test::make_action("client-1");
    std::string durl = std::string("mem;tcp;host,127.0.0.1;port,1;grant,g;secret,") + std::string(64, 'a') + ";" + bad;
    EXPECT_EQ(-EINVAL, libd_action_add_transport(action.get(), durl.c_str())) << bad;
  }
}
