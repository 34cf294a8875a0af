// Every client transport, the same tests: data verified end to end from 1 byte to 64 MiB, many
// threads, many operations in flight, batches, and refusals that leave the transport usable.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>

#include "harness.h"

using test::fill_random;
using test::make_rig;

class EveryTransport : public ::testing::TestWithParam<std::string> {};

static std::vector<std::string> implementations() {
  std::vector<std::string> v = {"local", "fake", "shm", "tcp"};
  if (test::verbs_wanted()) v.push_back("verbs");
  return v;
}

INSTANTIATE_TEST_SUITE_P(Impl, EveryTransport, ::testing::ValuesIn(implementations()),
                         [](const auto &info) { return info.param; });

TEST_P(EveryTransport, RoundTripsFromOneByteTo64MiBAtRandomOffsets) {
  const uint64_t kElement = 96ull << 20;
  auto rig = make_rig(GetParam(), kElement);
  const size_t kLocal = 129ull << 20;  // room for a write source and a separate read target
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, kLocal, reinterpret_cast<void **>(&buf))) << libd_last_error();
  std::mt19937_64 rng(7);
  for (uint64_t size : {1ull, 7ull, 64ull, 4096ull, 65537ull, 1ull << 20, (16ull << 20) + 3, 64ull << 20}) {
    uint64_t raddr = rng() % (kElement - size + 1);
    size_t src = size_t(rng() % (kLocal / 2 - size + 1));
    size_t dst = kLocal / 2 + size_t(rng() % (kLocal / 2 - size + 1));
    fill_random(buf + src, size, size);
    ASSERT_EQ(0, libd_trdma_write(rig.t, size, raddr, buf + src)) << size << ": " << libd_last_error();
    memset(buf + dst, 0, size);
    ASSERT_EQ(0, libd_trdma_read(rig.t, size, raddr, buf + dst)) << size << ": " << libd_last_error();
    ASSERT_EQ(0, memcmp(buf + src, buf + dst, size)) << "data differs at size " << size;
  }
  libd_stats st;
  ASSERT_EQ(0, libd_transport_stats(rig.t, &st));
  EXPECT_EQ(8u, st.read_ops);
  EXPECT_EQ(8u, st.write_ops);
  EXPECT_EQ(st.read_bytes, st.write_bytes);
}

TEST_P(EveryTransport, ManyThreadsShareOneTransport) {
  const int kThreads = 8, kIters = 150;
  const size_t kSlice = 64 * 1024;
  auto rig = make_rig(GetParam(), kThreads * kSlice);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 2 * kThreads * kSlice, reinterpret_cast<void **>(&buf)));
  std::atomic<int> failures{0};
  std::vector<std::thread> th;
  for (int i = 0; i < kThreads; i++)
    th.emplace_back([&, i] {
      std::mt19937 rng{unsigned(i)};
      char *src = buf + size_t(i) * 2 * kSlice, *dst = src + kSlice;
      for (int k = 0; k < kIters; k++) {
        size_t n = 1 + rng() % kSlice;
        fill_random(src, n, uint64_t(i * 1000 + k));
        if (libd_trdma_write(rig.t, n, uint64_t(i) * kSlice, src) ||
            libd_trdma_read(rig.t, n, uint64_t(i) * kSlice, dst) || memcmp(src, dst, n))
          failures++;
      }
    });
  for (auto &x : th) x.join();
  EXPECT_EQ(0, failures.load()) << libd_last_error();
}

TEST_P(EveryTransport, ManyOperationsInFlight) {
  const int kOps = 128;
  const size_t kSize = 8192;
  auto rig = make_rig(GetParam(), kOps * kSize);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 2 * kOps * kSize, reinterpret_cast<void **>(&buf)));
  fill_random(buf, kOps * kSize, 99);
  std::vector<libd_op *> ops(kOps);
  for (int i = 0; i < kOps; i++)
    ASSERT_EQ(0, libd_trdma_write_async(rig.t, kSize, uint64_t(i) * kSize, buf + i * kSize, &ops[size_t(i)]));
  for (auto *op : ops) {
    EXPECT_EQ(0, libd_op_wait(op, 10000)) << libd_last_error();
    libd_op_free(op);
  }
  char *back = buf + kOps * kSize;
  for (int i = 0; i < kOps; i++)
    ASSERT_EQ(0, libd_trdma_read_async(rig.t, kSize, uint64_t(i) * kSize, back + i * kSize, &ops[size_t(i)]));
  for (auto *op : ops) {
    EXPECT_EQ(0, libd_op_wait(op, 10000)) << libd_last_error();
    libd_op_free(op);
  }
  EXPECT_EQ(0, memcmp(buf, back, kOps * kSize));
}

TEST_P(EveryTransport, ScatterGatherBatches) {
  auto rig = make_rig(GetParam(), 1 << 20);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 1 << 20, reinterpret_cast<void **>(&buf)));
  std::vector<libd_iov> w, r;
  for (int i = 0; i < 16; i++) {
    size_t n = 100 + size_t(i) * 37;
    fill_random(buf + i * 4096, n, uint64_t(i));
    w.push_back({n, uint64_t(15 - i) * 8192, buf + i * 4096});
    r.push_back({n, uint64_t(15 - i) * 8192, buf + (1 << 19) + i * 4096});
  }
  ASSERT_EQ(0, libd_trdma_writev(rig.t, w.data(), int(w.size()))) << libd_last_error();
  libd_op *op;
  ASSERT_EQ(0, libd_trdma_readv_async(rig.t, r.data(), int(r.size()), &op));
  ASSERT_EQ(0, libd_op_wait(op, 10000)) << libd_last_error();
  libd_op_free(op);
  for (int i = 0; i < 16; i++) EXPECT_EQ(0, memcmp(w[size_t(i)].buf, r[size_t(i)].buf, w[size_t(i)].size)) << i;
  EXPECT_EQ(-EINVAL, libd_trdma_readv(rig.t, r.data(), 0));
  // One bad entry refuses the whole batch before anything moves.
  r[3].raddr = 1 << 20;
  EXPECT_EQ(-ERANGE, libd_trdma_readv(rig.t, r.data(), int(r.size())));
}

TEST_P(EveryTransport, OutOfRangeIsRefusedAndTheTransportStaysUsable) {
  const uint64_t kSize = 1 << 16;
  auto rig = make_rig(GetParam(), kSize);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 4096, reinterpret_cast<void **>(&buf)));
  EXPECT_EQ(-ERANGE, libd_trdma_read(rig.t, 2, kSize - 1, buf));
  EXPECT_EQ(-ERANGE, libd_trdma_write(rig.t, 1, kSize, buf));
  EXPECT_EQ(-ERANGE, libd_trdma_read(rig.t, 16, UINT64_MAX - 8, buf));
  EXPECT_EQ(-ERANGE, libd_trdma_read(rig.t, 4097, 0, buf));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("registered buffer"));
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(rig.t));
  memcpy(buf, "still fine", 10);
  ASSERT_EQ(0, libd_trdma_write(rig.t, 10, kSize - 10, buf));
  memset(buf, 0, 10);
  ASSERT_EQ(0, libd_trdma_read(rig.t, 10, kSize - 10, buf));
  EXPECT_EQ(0, memcmp(buf, "still fine", 10));
}

TEST_P(EveryTransport, ReadOnlyGrantRefusesWrites) {
  auto rig = make_rig(GetParam(), 1 << 16, LIBD_RIGHT_READ);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 4096, reinterpret_cast<void **>(&buf)));
  EXPECT_EQ(-EACCES, libd_trdma_write(rig.t, 8, 0, buf));
  EXPECT_EQ(0, libd_trdma_read(rig.t, 8, 0, buf)) << libd_last_error();
  EXPECT_EQ(std::string(8, '\0'), std::string(buf, 8)) << "a new element reads as zeroes";
}

TEST_P(EveryTransport, RegistrationIsReplacedAndReusedForFree) {
  auto rig = make_rig(GetParam(), 1 << 16);
  void *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 4096, &buf));
  void *same = buf;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 4096, &same));  // the same registration again
  EXPECT_EQ(buf, same);
  std::vector<char> mine(8192, 'q');
  void *user = mine.data();
  ASSERT_EQ(0, libd_trdma_reg(rig.t, mine.size(), &user));
  ASSERT_EQ(0, libd_trdma_write(rig.t, 8192, 0, mine.data()));
  EXPECT_EQ(-ERANGE, libd_trdma_write(rig.t, 8, 0, buf)) << "the old buffer is no longer registered";
}

// The non-blocking forms move data only where that cannot wait; everything else is -EAGAIN with
// nothing done, and the blocking form then does the work (and reports errors properly).
TEST_P(EveryTransport, NowaitOnlyWhereNothingCanWait) {
  auto rig = make_rig(GetParam(), 1 << 16);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 4096, reinterpret_cast<void **>(&buf)));
  bool inline_copy = GetParam() == "local" || GetParam() == "shm";
  if (libd_transport_state(rig.t) != LIBD_STATE_READY) {
    EXPECT_EQ(-EAGAIN, libd_trdma_write_nowait(rig.t, 8, 0, buf)) << "not connected yet: it would wait";
  }
  ASSERT_EQ(0, libd_transport_connect(rig.t));
  memcpy(buf, "nowait!!", 8);
  int rc = libd_trdma_write_nowait(rig.t, 8, 64, buf);
  if (!inline_copy) {
    EXPECT_EQ(-EAGAIN, rc);
    ASSERT_EQ(0, libd_trdma_write(rig.t, 8, 64, buf));
  } else {
    ASSERT_EQ(0, rc);
  }
  memset(buf, 0, 8);
  rc = libd_trdma_read_nowait(rig.t, 8, 64, buf + 100);
  EXPECT_EQ(inline_copy ? 0 : -EAGAIN, rc);
  if (rc == 0) {
    EXPECT_EQ(0, memcmp(buf + 100, "nowait!!", 8));
  }
  EXPECT_EQ(-EAGAIN, libd_trdma_read_nowait(rig.t, 8, 1 << 16, buf)) << "out of range: the blocking form reports it";
  EXPECT_EQ(-EAGAIN, libd_trdma_read_nowait(rig.t, 8, 0, buf + 4095));
  libd_stats st;
  libd_transport_stats(rig.t, &st);
  EXPECT_EQ(inline_copy ? 1u : 0u, st.read_ops);
}
