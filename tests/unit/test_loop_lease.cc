// A thread that waits anyway may drive a server's loop itself (IoLoop::progress,
// libd_trdma_server_progress): while its lease lasts the loop's own thread is parked, work is done
// on the driver's thread, and the loop's thread takes back when the lease is released or lapses.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "io/ioloop.h"

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Calls progress until the loop ran on this thread (the first call of a lease only asks for it).
bool take_loop(libd::IoLoop &loop, uint32_t lease_us) {
  auto end = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < end)
    if (loop.progress(lease_us)) return true;
  return false;
}

// Posts fn's thread id check: which thread ran it.
std::future<std::thread::id> ran_on(libd::IoLoop &loop) {
  auto done = std::make_shared<std::promise<std::thread::id>>();
  auto fut = done->get_future();
  loop.post([done, &loop] {
    EXPECT_TRUE(loop.on_loop_thread()) << "the thread running posted work is the loop's, for as long as it runs it";
    done->set_value(std::this_thread::get_id());
  });
  return fut;
}

}  // namespace

TEST(LoopLease, TheLeaseHolderRunsTheLoopsWork) {
  libd::IoLoop loop;
  ASSERT_TRUE(take_loop(loop, 60'000'000));
  auto where = ran_on(loop);
  auto end = Clock::now() + std::chrono::seconds(10);
  while (where.wait_for(milliseconds(0)) != std::future_status::ready && Clock::now() < end) loop.progress(60'000'000);
  ASSERT_EQ(std::future_status::ready, where.wait_for(milliseconds(0)));
  EXPECT_EQ(std::this_thread::get_id(), where.get()) << "run by the progress() caller, not the parked thread";
  EXPECT_FALSE(loop.on_loop_thread()) << "between calls the caller does not run the loop";
  loop.release();
}

TEST(LoopLease, ReleasingGivesTheLoopBackAtOnce) {
  libd::IoLoop loop;
  ASSERT_TRUE(take_loop(loop, 60'000'000));  // a minute: only release() can end it in time
  loop.release();
  auto where = ran_on(loop);
  ASSERT_EQ(std::future_status::ready, where.wait_for(std::chrono::seconds(10))) << "the loop's thread stayed parked";
  EXPECT_NE(std::this_thread::get_id(), where.get());
}

// The release may come while the loop's thread is still on its way to park (between its look at
// the lease and its wait): it must not sleep out the lease then.
TEST(LoopLease, AReleaseRightAfterTheAskIsNotLost) {
  libd::IoLoop loop;
  for (int round = 0; round < 300; round++) {
    loop.progress(60'000'000);  // asks the loop's thread to park, a minute
    if (round % 3 == 1) std::this_thread::yield();
    loop.release();
    auto where = ran_on(loop);
    ASSERT_EQ(std::future_status::ready, where.wait_for(std::chrono::seconds(10)))
        << "round " << round << ": the loop's thread slept through the release";
  }
}

// The loop is taken with a long lease (a short one can lapse before a thread on a loaded host
// parks), then shortened by a call with a short one: the lease that counts is the last.
TEST(LoopLease, ALapsedLeaseGivesTheLoopBack) {
  libd::IoLoop loop;
  ASSERT_TRUE(take_loop(loop, 60'000'000));
  ASSERT_TRUE(loop.progress(20'000));  // the caller then stops calling, as a driver gone elsewhere
  auto where = ran_on(loop);
  ASSERT_EQ(std::future_status::ready, where.wait_for(std::chrono::seconds(10))) << "the loop's thread stayed parked";
  EXPECT_NE(std::this_thread::get_id(), where.get());
}

// A holder that renewed its lease for a long while (the parked thread looking later and later
// meanwhile) and then stops calling still gets the loop taken back.
TEST(LoopLease, ALeaseRenewedForLongThenLeftLapsesToo) {
  libd::IoLoop loop;
  ASSERT_TRUE(take_loop(loop, 60'000'000));
  auto end = Clock::now() + milliseconds(80);
  while (Clock::now() < end) loop.progress(1000);
  auto where = ran_on(loop);
  ASSERT_EQ(std::future_status::ready, where.wait_for(std::chrono::seconds(10))) << "the loop's thread stayed parked";
  EXPECT_NE(std::this_thread::get_id(), where.get());
}

// When the parked thread looks at the lease next: at its end at first, then later past it the
// longer the loop has been leased (a quarter of the time parked), never more than 10 ms past it.
TEST(LoopLease, TheParkedThreadLooksLaterTheLongerItIsParked) {
  const int64_t ms = 1'000'000, until = 500 * ms;
  EXPECT_EQ(until, libd::IoLoop::next_look_ns(until, 100 * ms, 100 * ms)) << "just parked: at the lease's end";
  EXPECT_EQ(until + 1 * ms, libd::IoLoop::next_look_ns(until, 100 * ms, 104 * ms));
  EXPECT_EQ(until + 5 * ms, libd::IoLoop::next_look_ns(until, 100 * ms, 120 * ms));
  EXPECT_EQ(until + libd::IoLoop::kMaxParkedSlackNs, libd::IoLoop::next_look_ns(until, 100 * ms, 499 * ms));
  EXPECT_EQ(10 * ms, libd::IoLoop::kMaxParkedSlackNs);
}

TEST(LoopLease, RunSyncDuringALeaseDoesNotWaitForTheHolder) {
  libd::IoLoop loop;
  ASSERT_TRUE(take_loop(loop, 60'000'000));
  std::vector<int> order;
  loop.post([&] { order.push_back(1); });  // queued before: runs first
  auto other = std::async(std::launch::async, [&] {
    loop.run_sync([&] { order.push_back(2); });
    return std::this_thread::get_id();
  });
  ASSERT_EQ(std::future_status::ready, other.wait_for(std::chrono::seconds(10)))
      << "run_sync waited for a lease holder that is not calling";
  EXPECT_EQ((std::vector<int>{1, 2}), order);
  loop.release();
}

TEST(LoopLease, ALoopDestroyedDuringALeaseStops) {
  auto loop = std::make_unique<libd::IoLoop>();
  ASSERT_TRUE(take_loop(*loop, 60'000'000));
  auto gone = std::async(std::launch::async, [&] { loop.reset(); });
  EXPECT_EQ(std::future_status::ready, gone.wait_for(std::chrono::seconds(10))) << "the destructor waited for the lease";
}

TEST(LoopLease, ProgressFromTheLoopItselfDoesNothing) {
  libd::IoLoop loop;
  std::promise<bool> got;
  loop.post([&] { got.set_value(loop.progress(1000)); });
  EXPECT_FALSE(got.get_future().get());
}

// ---- a transfer part way: progress() runs on until it is done ----

namespace {

// Counts the passes of a loop (an idle handle runs once a pass); each pass moves bytes if `busy`.
// `by_starter` counts only the passes run on the thread that started the counter: once a lease
// ends, the loop's own thread runs passes too, and a test may read the count after that.
struct PassCounter {
  uv_idle_t idle{};
  libd::IoLoop *loop = nullptr;
  std::thread::id starter;
  std::atomic<int> passes{0};
  std::atomic<int> by_starter{0};
  std::atomic<bool> busy{true};

  void start(libd::IoLoop &l) {
    loop = &l;
    starter = std::this_thread::get_id();
    idle.data = this;
    l.run_sync([this] {
      uv_idle_init(loop->loop(), &idle);
      uv_idle_start(&idle, [](uv_idle_t *h) {
        auto *self = static_cast<PassCounter *>(h->data);
        self->passes++;
        if (std::this_thread::get_id() == self->starter) self->by_starter++;
        if (self->busy) self->loop->note_activity();
      });
    });
  }
};

}  // namespace

// Limits no test reaches: where a test counts passes, a thread descheduled between two of them
// (a loaded machine, a sanitizer) must not end the call by the clock.
constexpr libd::IoLoop::ProgressLimits kNoTimeLimits{60'000'000'000, 60'000'000'000};

// A loop whose passes are counted, leased to the test's thread.
class ProgressOnAPartWayTransfer : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(take_loop(loop, 60'000'000));
    count.start(loop);
  }
  void TearDown() override { loop.release(); }

  PassCounter count;  // outlives the loop, which closes its handle
  libd::IoLoop loop;
};

TEST_F(ProgressOnAPartWayTransfer, PassesFollowUntilTheTransferIsDone) {
  int before = count.passes;
  ASSERT_TRUE(loop.progress(60'000'000, [&] { return count.passes - before < 5; }, kNoTimeLimits));
  EXPECT_EQ(5, count.passes - before) << "one call ran the loop until the transfer was no longer part way, and no further";
  before = count.passes;
  ASSERT_TRUE(loop.progress(60'000'000, [] { return false; }));
  EXPECT_EQ(1, count.passes - before) << "with nothing part way a call is one pass";
}

TEST_F(ProgressOnAPartWayTransfer, ATransferThatStallsEndsTheCall) {
  count.busy = false;  // part way for ever, and no bytes move (a peer that stopped sending)
  auto t0 = Clock::now();
  ASSERT_TRUE(loop.progress(60'000'000, [] { return true; }));
  auto took = Clock::now() - t0;
  EXPECT_GE(took, std::chrono::nanoseconds(libd::IoLoop::kProgressIdleNs)) << "gave up before the idle time";
  EXPECT_LT(took, std::chrono::seconds(30)) << "a stalled transfer held the caller for its whole lease";
}

TEST_F(ProgressOnAPartWayTransfer, ACallRunsOnForItsBudgetAtMost) {
  // Bytes move on every pass, and the transfer never ends; only the budget ends the call (the idle
  // time is set out of reach: a thread descheduled between passes must not end it early).
  libd::IoLoop::ProgressLimits limits;
  limits.idle_ns = kNoTimeLimits.idle_ns;
  for (uint32_t lease_us : {60'000'000u, 200u}) {
    auto t0 = Clock::now();
    ASSERT_TRUE(loop.progress(lease_us, [] { return true; }, limits));
    auto took = Clock::now() - t0;
    auto budget = std::min<int64_t>(int64_t(lease_us) * 1000, libd::IoLoop::kProgressMaxNs);
    EXPECT_GE(took, std::chrono::nanoseconds(budget)) << lease_us;
    EXPECT_LT(took, std::chrono::seconds(30)) << "the call outlasted its budget";
  }
  EXPECT_GT(count.passes, 2);
}

TEST_F(ProgressOnAPartWayTransfer, AReleaseEndsThePasses) {
  // The third look releases the lease (an owner stopping, say): no pass of the caller's after it.
  // Once released, the loop's own thread runs passes again; those are not the caller's.
  int before = count.by_starter;
  int looks = 0;
  ASSERT_TRUE(loop.progress(60'000'000, [&] {
    if (++looks == 3) loop.release();
    return true;
  }, kNoTimeLimits));
  EXPECT_EQ(3, count.by_starter - before) << "the caller ran passes after the lease was released";
}

// ---- through the C API: an owner driving its memory server ----

namespace {

struct Owner {
  // First, so freed last: the server's thread may still be inside the writev of an answer from it
  // when the holder already has the bytes (and ASan looks at the buffer after the call returns).
  std::vector<char> mem = std::vector<char>(4096, 'x');
  test::ActionPtr owner, holder;
  libd_transport *srv = nullptr, *t = nullptr;
  char *buf = nullptr;  // the holder's registered memory
};

void make(Owner &o) {
  o.owner = test::make_action("owner");
  std::string durl = "srv;tcp_server;size,0;path," + test::unique_socket_path("lease");
  ASSERT_EQ(0, libd_action_add_transport(o.owner.get(), durl.c_str())) << libd_last_error();
  o.srv = libd_action_get_transport(o.owner.get(), "srv");
  ASSERT_EQ(0, libd_trdma_server_serve(o.srv)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_server_expose(o.srv, "buf", o.mem.data(), o.mem.size())) << libd_last_error();
  libd_grant_spec spec = {"buf", "holder", 0, 0, 3, 0};
  char config[2048];
  ASSERT_GT(libd_trdma_server_grant_ex(o.srv, &spec, config, sizeof config), 0) << libd_last_error();
  o.holder = test::make_action("holder");
  std::string hdurl = std::string("m;tcp;") + config + ";timeout_ms,20000";
  ASSERT_EQ(0, libd_action_add_transport(o.holder.get(), hdurl.c_str())) << libd_last_error();
  o.t = libd_action_get_transport(o.holder.get(), "m");
  ASSERT_EQ(0, libd_trdma_reg(o.t, 64, reinterpret_cast<void **>(&o.buf)));
  ASSERT_EQ(0, libd_transport_connect(o.t)) << libd_last_error();  // connected before any lease
}

// Reads 5 bytes into o.buf on another thread; the future holds the read's result and how long it took.
std::future<std::pair<int, milliseconds>> read_later(Owner &o) {
  return std::async(std::launch::async, [&o] {
    auto t0 = Clock::now();
    int rc = libd_trdma_read(o.t, 5, 0, o.buf);
    return std::make_pair(rc, std::chrono::duration_cast<milliseconds>(Clock::now() - t0));
  });
}

bool take_server(libd_transport *srv, uint32_t lease_us) {
  auto end = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < end) {
    int rc = libd_trdma_server_progress(srv, lease_us);
    EXPECT_GE(rc, 0) << libd_last_error();
    if (rc == 1) return true;
  }
  return false;
}

}  // namespace

TEST(ServerProgress, AnOwnerThatDrivesItsServerServesTheHolder) {
  Owner o;
  ASSERT_NO_FATAL_FAILURE(make(o));
  memcpy(o.mem.data(), "hello", 5);
  ASSERT_TRUE(take_server(o.srv, 1'000'000));  // the server's own thread parks for up to a second
  auto read = read_later(o);
  auto end = Clock::now() + std::chrono::seconds(10);
  while (read.wait_for(milliseconds(0)) != std::future_status::ready && Clock::now() < end)
    libd_trdma_server_progress(o.srv, 1'000'000);
  auto [rc, took] = read.get();
  EXPECT_EQ(0, rc) << libd_last_error();
  EXPECT_EQ("hello", std::string(o.buf, 5));
  EXPECT_LT(took.count(), 500) << "served by the driving thread, not after the lease lapsed";
  EXPECT_EQ(0, libd_trdma_server_progress(o.srv, 0));
}

TEST(ServerProgress, AHeldLeaseDelaysTheHolderUntilItLapses) {
  Owner o;
  ASSERT_NO_FATAL_FAILURE(make(o));
  auto t0 = Clock::now();
  ASSERT_TRUE(take_server(o.srv, 400'000));  // then the owner stops calling
  auto read = read_later(o);
  auto [rc, took] = read.get();
  EXPECT_EQ(0, rc) << libd_last_error() << ": the server's thread takes the loop back when the lease lapses";
  EXPECT_GE(std::chrono::duration_cast<milliseconds>(Clock::now() - t0).count(), 390)
      << "the parked server answered before the lease lapsed";
}

TEST(ServerProgress, ReleasingLetsTheServersThreadServe) {
  Owner o;
  ASSERT_NO_FATAL_FAILURE(make(o));
  ASSERT_TRUE(take_server(o.srv, 1'000'000));
  ASSERT_EQ(0, libd_trdma_server_progress(o.srv, 0));
  auto [rc, took] = read_later(o).get();
  EXPECT_EQ(0, rc) << libd_last_error();
  EXPECT_LT(took.count(), 500) << "the server's thread stayed parked after the release";
}

TEST(ServerProgress, TheLeaseIsCheckedAndOnlyServersHaveOne) {
  Owner o;
  ASSERT_NO_FATAL_FAILURE(make(o));
  EXPECT_EQ(-EINVAL, libd_trdma_server_progress(o.srv, 1'000'001));
  EXPECT_NE(std::string(libd_last_error()).find("lease_us"), std::string::npos) << libd_last_error();
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_server_progress(o.t, 1000)) << "a client transport has no server to drive";
  auto idle = test::make_action("idle");
  ASSERT_EQ(0, libd_action_add_transport(idle.get(), ("s;tcp_server;size,0;path," + test::unique_socket_path("idle")).c_str()));
  EXPECT_EQ(-ENOTCONN, libd_trdma_server_progress(libd_action_get_transport(idle.get(), "s"), 1000))
      << "not serving yet";
}
