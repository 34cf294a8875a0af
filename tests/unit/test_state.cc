// The transport state machine and the operation engine, driven through the fake transport.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "harness.h"

using namespace std::chrono;
using test::make_action;

namespace {
libd_transport *add(libd_action *a, const std::string &durl) {
  EXPECT_EQ(0, libd_action_add_transport(a, durl.c_str())) << libd_last_error();
  return libd_action_get_transport(a, durl.substr(0, durl.find(';')).c_str());
}
double ms_since(steady_clock::time_point t0) {
  return duration<double, std::milli>(steady_clock::now() - t0).count();
}
// A fake memory element of 4 KiB whose operations take delay_ms, with `reg` bytes registered.
libd_transport *delayed_fake(libd_action *a, size_t reg, const char *delay_ms, void **buf) {
  auto *t = add(a, "m;fake;size,4096");
  EXPECT_EQ(0, libd_trdma_reg(t, reg, buf));
  EXPECT_EQ(0, libd_transport_set(t, "delay_ms", delay_ms));
  EXPECT_EQ(0, libd_transport_set(t, "fault", "delay"));
  return t;
}
}  // namespace

TEST(State, InitToInitdToReadyToTerminated) {
  auto a = make_action("s1");
  auto *t = add(a.get(), "m;fake");
  EXPECT_EQ(LIBD_STATE_INIT, libd_transport_state(t));
  EXPECT_EQ(-EINVAL, libd_transport_connect(t));  // not configured
  EXPECT_EQ(-EINVAL, libd_action_config_transport(a.get(), "m", "size,abc"));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("'size'")) << libd_last_error();
  EXPECT_EQ(LIBD_STATE_INIT, libd_transport_state(t));
  ASSERT_EQ(0, libd_action_config_transport(a.get(), "m", "size,4096"));
  EXPECT_EQ(LIBD_STATE_INITD, libd_transport_state(t));
  ASSERT_EQ(0, libd_transport_connect(t));
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(t));
  EXPECT_EQ(0, libd_transport_recover(t));  // READY: nothing to do
  ASSERT_EQ(0, libd_transport_terminate(t));
  EXPECT_EQ(LIBD_STATE_TERMINATED, libd_transport_state(t));
  void *buf = nullptr;
  EXPECT_EQ(-ESHUTDOWN, libd_trdma_reg(t, 64, &buf));
  EXPECT_EQ(-ESHUTDOWN, libd_transport_connect(t));
  EXPECT_EQ(-ESHUTDOWN, libd_action_config_transport(a.get(), "m", "size,1"));
  EXPECT_EQ(0, libd_transport_terminate(t));  // idempotent
}

TEST(State, OperationWaitsForConfigurationThenRuns) {
  auto a = make_action("s2", {"+timeout_ms", "5000"});
  auto *t = add(a.get(), "m;fake");
  void *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 4096, &buf));
  memcpy(buf, "hello", 5);
  std::atomic<int> rc{1};
  std::thread op([&] { rc = libd_trdma_write(t, 5, 0, buf); });
  // The operation is parked in INIT; configure from elsewhere, as the runtime would.
  uint64_t seq = 0;
  EXPECT_EQ(-ETIMEDOUT, libd_transport_wait_state(t, LIBD_STATE_READY, 50));
  ASSERT_EQ(0, libd_action_config_transport(a.get(), "m", "size,4096"));
  op.join();
  EXPECT_EQ(0, rc.load()) << libd_last_error();
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_wait_change(t, &seq, 1000));
  memset(buf, 0, 5);
  ASSERT_EQ(0, libd_trdma_read(t, 5, 0, buf));
  EXPECT_EQ(0, memcmp(buf, "hello", 5));
}

TEST(State, UnconfiguredOperationTimesOutAtTheDeadline) {
  auto a = make_action("s3", {"+timeout_ms", "300"});
  auto *t = add(a.get(), "m;fake");
  void *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 64, &buf));
  auto t0 = steady_clock::now();
  EXPECT_EQ(-ETIMEDOUT, libd_trdma_read(t, 8, 0, buf));
  double ms = ms_since(t0);
  EXPECT_GE(ms, 290);
  EXPECT_LT(ms, 2000);
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("not configured within 300 ms")) << libd_last_error();
}

TEST(State, ManyThreadsParkedInInitAllProceedOnOneConfig) {
  auto a = make_action("s4", {"+timeout_ms", "10000"});
  auto *t = add(a.get(), "m;fake");
  void *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 64 * 16, &buf));
  std::vector<std::thread> th;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; i++)
    th.emplace_back([&, i] {
      char *p = static_cast<char *>(buf) + i * 64;
      memset(p, 'a' + i, 64);
      if (libd_trdma_write(t, 64, uint64_t(i) * 64, p) == 0) ok++;
    });
  ASSERT_EQ(0, libd_action_config_transport(a.get(), "m", "size,4096"));
  for (auto &x : th) x.join();
  EXPECT_EQ(16, ok.load());
}

TEST(State, WaitChangeMissesNothing) {
  auto a = make_action("s5");
  auto *t = add(a.get(), "m;fake;size,4096");
  uint64_t seq = 0;
  int s = libd_transport_wait_change(t, &seq, 1000);  // the INIT->INITD change already happened
  EXPECT_EQ(LIBD_STATE_INITD, s);
  std::atomic<bool> saw_ready{false}, saw_terminated{false};
  std::thread watcher([&] {
    uint64_t my = seq;
    for (;;) {
      int st = libd_transport_wait_change(t, &my, 5000);
      if (st == LIBD_STATE_READY) saw_ready = true;
      if (st == LIBD_STATE_TERMINATED || st < 0) { saw_terminated = st == LIBD_STATE_TERMINATED; return; }
    }
  });
  ASSERT_EQ(0, libd_transport_connect(t));
  ASSERT_EQ(0, libd_transport_terminate(t));
  watcher.join();
  EXPECT_TRUE(saw_terminated.load());
  EXPECT_EQ(LIBD_STATE_TERMINATED, libd_transport_wait_change(t, &seq, 50));  // catches up
  EXPECT_EQ(-ETIMEDOUT, libd_transport_wait_change(t, &seq, 50));             // nothing new since
}

TEST(State, DisconnectGoesToErrorAndRecoverRestores) {
  auto a = make_action("s6");
  auto *t = add(a.get(), "m;fake;size,4096");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 4096, reinterpret_cast<void **>(&buf)));
  memcpy(buf, "keep", 4);
  ASSERT_EQ(0, libd_trdma_write(t, 4, 100, buf));
  ASSERT_EQ(0, libd_transport_set(t, "fault", "disconnect"));
  EXPECT_EQ(-ECONNRESET, libd_trdma_read(t, 4, 100, buf));
  EXPECT_EQ(LIBD_STATE_ERROR, libd_transport_state(t));
  EXPECT_EQ(-ECONNRESET, libd_trdma_read(t, 4, 100, buf));  // stays in ERROR
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("call recover()")) << libd_last_error();
  char why[256];
  ASSERT_GT(libd_transport_error(t, why, sizeof why), 0);
  EXPECT_NE(std::string::npos, std::string(why).find("disconnected"));
  // The peer refuses while it is down.
  ASSERT_EQ(0, libd_transport_set(t, "fault", "refuse"));
  EXPECT_EQ(-ECONNREFUSED, libd_transport_recover(t));
  EXPECT_EQ(LIBD_STATE_ERROR, libd_transport_state(t));
  ASSERT_EQ(0, libd_transport_set(t, "fault", "none"));
  ASSERT_EQ(0, libd_transport_recover(t)) << libd_last_error();
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(t));
  memset(buf, 0, 4);
  ASSERT_EQ(0, libd_trdma_read(t, 4, 100, buf));
  EXPECT_EQ(0, memcmp(buf, "keep", 4));
}

TEST(State, InjectedErrorFailsOneOperationOnly) {
  auto a = make_action("s7");
  auto *t = add(a.get(), "m;fake;size,4096");
  void *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 64, &buf));
  ASSERT_EQ(0, libd_transport_set(t, "errno", "EIO"));
  ASSERT_EQ(0, libd_transport_set(t, "fault", "error"));
  ASSERT_EQ(0, libd_transport_set(t, "count", "1"));
  EXPECT_EQ(-EIO, libd_trdma_read(t, 8, 0, buf));
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(t));
  EXPECT_EQ(0, libd_trdma_read(t, 8, 0, buf));
  libd_stats st;
  ASSERT_EQ(0, libd_transport_stats(t, &st));
  EXPECT_EQ(1u, st.errors);
  EXPECT_EQ(1u, st.read_ops);
  EXPECT_EQ(8u, st.read_bytes);
  EXPECT_GT(libd_stats_percentile_ns(&st, 0.5), 0u);
  EXPECT_EQ(-EINVAL, libd_transport_set(t, "fault", "meteor"));
  EXPECT_EQ(-EOPNOTSUPP, libd_transport_set(t, "colour", "blue"));
}

TEST(State, LostAnswerEndsAtTheDeadlineNotNever) {
  auto a = make_action("s8", {"+timeout_ms", "300"});
  auto *t = add(a.get(), "m;fake;size,4096");
  void *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 64, &buf));
  ASSERT_EQ(0, libd_transport_set(t, "fault", "drop"));
  auto t0 = steady_clock::now();
  EXPECT_EQ(-ETIMEDOUT, libd_trdma_read(t, 8, 0, buf));
  EXPECT_LT(ms_since(t0), 1500);
  EXPECT_EQ(LIBD_STATE_ERROR, libd_transport_state(t));
}

TEST(State, AsyncWaitPollAndCancel) {
  auto a = make_action("s9");
  auto *t = add(a.get(), "m;fake;size,4096");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 4096, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_transport_set(t, "delay_ms", "200"));
  ASSERT_EQ(0, libd_transport_set(t, "fault", "delay"));
  libd_op *op = nullptr;
  memset(buf, 'x', 16);
  ASSERT_EQ(0, libd_trdma_write_async(t, 16, 0, buf, &op));
  EXPECT_EQ(-EINPROGRESS, libd_op_poll(op));
  EXPECT_EQ(-ETIMEDOUT, libd_op_wait(op, 10));
  EXPECT_EQ(0, libd_op_wait(op, 5000));
  EXPECT_EQ(0, libd_op_poll(op));
  libd_op_free(op);
  // A cancelled read never lands in the buffer afterwards.
  memset(buf + 1024, 'z', 16);
  ASSERT_EQ(0, libd_trdma_read_async(t, 16, 0, buf + 1024, &op));
  EXPECT_EQ(-ECANCELED, libd_op_cancel(op));
  EXPECT_EQ(-ECANCELED, libd_op_poll(op));
  libd_op_free(op);
  ASSERT_EQ(0, libd_transport_set(t, "fault", "none"));
  ASSERT_EQ(0, libd_trdma_read(t, 16, 2048, buf + 2048));  // after the 200 ms the delay would have taken
  std::this_thread::sleep_for(milliseconds(300));  // past the cancelled op's due time, to prove no late write
  EXPECT_EQ(std::string(16, 'z'), std::string(buf + 1024, 16));
  // Freeing a running op cancels it.
  ASSERT_EQ(0, libd_transport_set(t, "fault", "delay"));
  ASSERT_EQ(0, libd_trdma_read_async(t, 16, 0, buf, &op));
  EXPECT_EQ(0, libd_op_free(op));
}

// Re-registering while an operation is in flight is refused (the engine may still use the old
// buffer); once it has completed, the same call succeeds.
TEST(State, RegWaitsForOperationsInFlight) {
  auto a = make_action("s9b");
  void *buf = nullptr;
  auto *t = delayed_fake(a.get(), 4096, "300", &buf);
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async(t, 16, 0, buf, &op));
  void *other = nullptr;
  EXPECT_EQ(-EBUSY, libd_trdma_reg(t, 8192, &other));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("in flight"));
  ASSERT_EQ(0, libd_op_wait(op, 5000));
  libd_op_free(op);
  EXPECT_EQ(0, libd_trdma_reg(t, 8192, &other));
  libd_stats st;
  ASSERT_EQ(0, libd_transport_stats(t, &st));
  EXPECT_EQ(1u, st.read_ops);
}

TEST(State, TerminateFailsPendingOperations) {
  auto a = make_action("s10");
  void *buf = nullptr;
  auto *t = delayed_fake(a.get(), 64, "60000", &buf);
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async(t, 8, 0, buf, &op));
  ASSERT_EQ(0, libd_transport_terminate(t));
  EXPECT_LT(libd_op_wait(op, 1000), 0);
  EXPECT_NE(-ETIMEDOUT, libd_op_poll(op));
  libd_op_free(op);
}

TEST(State, BufferAndRangeChecks) {
  auto a = make_action("s11");
  auto *t = add(a.get(), "m;fake;size,4096;rights,r");
  char local[64];
  EXPECT_EQ(-ENOBUFS, libd_trdma_read(t, 8, 0, local));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("call reg() first"));
  void *buf = local;
  ASSERT_EQ(0, libd_trdma_reg(t, sizeof local, &buf));
  EXPECT_EQ(local, buf);
  EXPECT_EQ(-ERANGE, libd_trdma_read(t, 65, 0, local));         // past the local buffer
  EXPECT_EQ(-ERANGE, libd_trdma_read(t, 8, 0, local + 60));
  EXPECT_EQ(-ERANGE, libd_trdma_read(t, 8, 4090, local));       // past the remote element
  EXPECT_EQ(-ERANGE, libd_trdma_read(t, 8, UINT64_MAX - 2, local));
  EXPECT_EQ(-EACCES, libd_trdma_write(t, 8, 0, local));         // read-only grant
  EXPECT_EQ(0, libd_trdma_read(t, 8, 4088, local));             // and it is still usable
  uint64_t size;
  unsigned rights;
  ASSERT_EQ(0, libd_trdma_remote(t, &size, &rights));
  EXPECT_EQ(4096u, size);
  EXPECT_EQ(unsigned(LIBD_RIGHT_READ), rights);
}

TEST(State, ConcurrentRecoverersAgree) {
  auto a = make_action("s12");
  auto *t = add(a.get(), "m;fake;size,4096");
  ASSERT_EQ(0, libd_transport_connect(t));
  void *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 64, &buf));
  ASSERT_EQ(0, libd_transport_set(t, "fault", "disconnect"));
  ASSERT_EQ(0, libd_transport_set(t, "count", "1"));
  EXPECT_EQ(-ECONNRESET, libd_trdma_read(t, 8, 0, buf));
  std::vector<std::thread> th;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; i++) th.emplace_back([&] { if (libd_transport_recover(t) == 0) ok++; });
  for (auto &x : th) x.join();
  EXPECT_EQ(8, ok.load());
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(t));
}
