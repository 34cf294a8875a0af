// Faults injected around real transports (faults,1): the engine below is the real one, only what
// reaches it changes, and every fault is set and cleared at run time (libd_transport_set).
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include "harness.h"
#include "libd.h"

namespace {

class Faulty : public ::testing::TestWithParam<std::string> {
 protected:
  test::Rig rig;
  char *buf = nullptr;
  void SetUp() override {
    rig = test::make_rig(GetParam(), 1 << 16, 3, "faults,1;timeout_ms,2000");
    ASSERT_EQ(0, libd_trdma_reg(rig.t, 4096, reinterpret_cast<void **>(&buf)));
    std::memcpy(buf, "before", 6);
    ASSERT_EQ(0, libd_trdma_write(rig.t, 6, 0, buf)) << libd_last_error();
  }
  int set(const char *key, const char *value) { return libd_transport_set(rig.t, key, value); }
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Impl, Faulty, ::testing::Values("shm", "tcp"), [](const auto &i) { return i.param; });

TEST_P(Faulty, AnInjectedErrorFailsTheOperationAndTheTransportGoesOn) {
  ASSERT_EQ(0, set("errno", "EPROTO"));
  ASSERT_EQ(0, set("fault", "error"));
  ASSERT_EQ(0, set("count", "1"));
  EXPECT_EQ(-EPROTO, libd_trdma_read(rig.t, 6, 0, buf));
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(rig.t));
  EXPECT_EQ(0, libd_trdma_read(rig.t, 6, 0, buf)) << libd_last_error();  // the count ran out
  EXPECT_EQ(0, std::memcmp(buf, "before", 6));
}

TEST_P(Faulty, ADelayedOperationReachesTheRealEngineLate) {
  ASSERT_EQ(0, set("delay_ms", "150"));
  ASSERT_EQ(0, set("fault", "delay"));
  std::memset(buf, 0, 6);
  auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(0, libd_trdma_read(rig.t, 6, 0, buf)) << libd_last_error();
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(150));
  EXPECT_EQ(0, std::memcmp(buf, "before", 6));
}

TEST_P(Faulty, ACancelledDelayedOperationNeverTouchesItsBuffer) {
  ASSERT_EQ(0, set("delay_ms", "100"));
  ASSERT_EQ(0, set("fault", "delay"));
  std::memset(buf, 0, 6);
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async(rig.t, 6, 0, buf, &op)) << libd_last_error();
  EXPECT_EQ(-ECANCELED, libd_op_cancel(op));
  // A second delayed read ends after the first one's delay would have: by then it would have landed.
  ASSERT_EQ(0, libd_trdma_read(rig.t, 1, 100, buf + 100)) << libd_last_error();
  EXPECT_EQ(std::string(6, '\0'), std::string(buf, 6));
  libd_op_free(op);
}

TEST_P(Faulty, ADroppedOperationEndsAtItsDeadlineAndRecoverBringsItBack) {
  ASSERT_EQ(0, set("fault", "drop"));
  ASSERT_EQ(0, set("count", "1"));
  EXPECT_EQ(-ETIMEDOUT, libd_trdma_read(rig.t, 6, 0, buf));
  EXPECT_EQ(LIBD_STATE_ERROR, libd_transport_state(rig.t));
  ASSERT_EQ(0, libd_transport_recover(rig.t)) << libd_last_error();
  EXPECT_EQ(0, libd_trdma_read(rig.t, 6, 0, buf)) << libd_last_error();
}

TEST_P(Faulty, DisconnectAndRefuse) {
  ASSERT_EQ(0, set("fault", "disconnect"));
  ASSERT_EQ(0, set("count", "1"));
  EXPECT_EQ(-ECONNRESET, libd_trdma_read(rig.t, 6, 0, buf));
  EXPECT_EQ(LIBD_STATE_ERROR, libd_transport_state(rig.t));
  ASSERT_EQ(0, set("fault", "refuse"));
  ASSERT_EQ(0, set("count", "1"));
  EXPECT_EQ(-ECONNREFUSED, libd_transport_recover(rig.t));
  ASSERT_EQ(0, libd_transport_recover(rig.t)) << libd_last_error();
  EXPECT_EQ(0, libd_trdma_read(rig.t, 6, 0, buf)) << libd_last_error();
}

TEST_P(Faulty, WithFaultsOnNothingBypassesTheInjector) {
  EXPECT_EQ(0, libd_transport_caps(rig.t) & (LIBD_CAP_NOWAIT | LIBD_CAP_DIRECT));
  ASSERT_EQ(0, set("fault", "error"));
  EXPECT_EQ(-EAGAIN, libd_trdma_read_nowait(rig.t, 6, 0, buf));  // the blocking form sees the fault
  EXPECT_EQ(-EIO, libd_trdma_read(rig.t, 6, 0, buf));
}

TEST(Faults, TheKnobsAreCheckedAndNeedFaultsOn) {
  auto rig = test::make_rig("tcp", 4096, 3, "faults,1");
  EXPECT_EQ(-EINVAL, libd_transport_set(rig.t, "fault", "sometimes"));
  EXPECT_EQ(-EINVAL, libd_transport_set(rig.t, "errno", "EWHAT"));
  EXPECT_EQ(-EINVAL, libd_transport_set(rig.t, "delay_ms", "9999999"));
  auto plain = test::make_rig("tcp", 4096);
  EXPECT_EQ(-EOPNOTSUPP, libd_transport_set(plain.t, "fault", "error"));
  auto a = test::make_action("x");
  EXPECT_EQ(-EINVAL, libd_action_add_transport(a.get(), "m;local;size,64;faults,2"));
}
