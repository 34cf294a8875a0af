// A waiter that polls a tcp operation (libd_op_poll) reads the answer off the socket itself when
// nobody else is reading: its completion does not wait for the shared loop's thread to wake up.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "core/op.h"
#include "harness.h"
#include "io/ioloop.h"
#include "transports/tcp/tcp_conn.h"

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

// How many times the loop's thread slept while `one` ran 400 times, after 20 runs to settle
// (-1: its count could not be read).
template <class One>
long loop_sleeps_over_400(pid_t loop, One one) {
  for (int i = 0; i < 20; i++) one();
  long before = test::sleeps_of(loop);
  for (int i = 0; i < 400; i++) one();
  long after = test::sleeps_of(loop);
  return before < 0 || after < 0 ? -1 : after - before;
}

// Milliseconds until `efd` (an operation's watch eventfd) is written, its count then read; -1 if
// it is not written within 10 s.
long ms_until_written(int efd) {
  auto t0 = std::chrono::steady_clock::now();
  struct pollfd p = {efd, POLLIN, 0};
  if (::poll(&p, 1, 10000) != 1) return -1;
  long ms = long(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
  uint64_t n;
  return ::read(efd, &n, sizeof n) == ssize_t(sizeof n) ? ms : -1;
}

pid_t shared_loop_thread() {
  std::promise<pid_t> tid;
  libd::IoLoop::shared().post([&] { tid.set_value(pid_t(syscall(SYS_gettid))); });
  return tid.get_future().get();
}

// A longer lease for a test (a caller that stops without saying so holds the loop this long),
// the default and the loop given back afterwards.
struct LongLease {
  uint32_t saved = libd::TcpConn::poll_lease_us();
  explicit LongLease(uint32_t us) { libd::TcpConn::set_poll_lease_us(us); }
  ~LongLease() {
    libd::TcpConn::set_poll_lease_us(saved);
    libd::IoLoop::shared().release();
  }
};

// A client of a one-element server over tcp (`extra`: its durl's further parameters), connected,
// with `local` bytes of its own registered at buf.
struct Client {
  void connect_client(const std::string &extra, size_t local) {
    rig = test::make_rig("tcp", 1 << 16, 3, extra);
    ASSERT_NE(nullptr, rig.t);
    ASSERT_EQ(0, libd_transport_connect(rig.t)) << libd_last_error();
    ASSERT_EQ(0, libd_trdma_reg(rig.t, local, reinterpret_cast<void **>(&buf)));
  }
  test::Rig rig;
  char *buf = nullptr;
};

// The parameter: a connection of the client's own, or the process's shared one.
class TcpProgress : public ::testing::TestWithParam<std::string>, protected Client {
 protected:
  void connect_client(size_t local) { Client::connect_client(GetParam(), local); }
  // One 64-byte read, polled to its end; its poller first busy elsewhere for up to `late` (whoever
  // reads the socket meanwhile takes the answer).
  void polled_read(std::chrono::microseconds late = std::chrono::microseconds(0)) {
    libd_op *op = nullptr;
    ASSERT_EQ(0, libd_trdma_read_async(rig.t, 64, 0, buf, &op)) << libd_last_error();
    auto until = std::chrono::steady_clock::now() + late;
    while (!op->op->done() && std::chrono::steady_clock::now() < until) {
    }
    poll_until_done(op, std::chrono::milliseconds(3000));
    EXPECT_EQ(0, libd_op_poll(op));
    libd_op_free(op);
  }
};

// A client on the process's shared connection that spins for its answers (for up to a second: on
// a loaded host no read outlasts the spin, and a caller that stops spinning sleeps and gives the
// loop back, its thread then serving and waking).
class TcpLeader : public ::testing::Test, protected Client {
 protected:
  void connect_spinning(size_t local) { connect_client("share,1;busy_poll_us,1000000", local); }
};

}  // namespace

INSTANTIATE_TEST_SUITE_P(Share, TcpProgress, ::testing::Values("", "share,1"),
                         [](const auto &i) { return i.param.empty() ? std::string("own") : std::string("shared"); });

TEST_P(TcpProgress, APollingWaiterCompletesItsReadWhileTheLoopIsBusy) {
  ASSERT_NO_FATAL_FAILURE(connect_client(4096));
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

// While a caller polls, the process's shared client loop is the caller's (leased): the answers it
// polls for are read on its thread, and the loop's thread, parked, is not woken for each of them
// (a thread asleep in epoll_wait would be: the loop watches every socket with work on it).
TEST_P(TcpProgress, APollingWaiterWakesNoLoopThreadForItsAnswers) {
  ASSERT_NO_FATAL_FAILURE(connect_client(64));
  pid_t loop = shared_loop_thread();
  // A lease longer than the whole test: the loop's thread, parked once, has no lapse to look at.
  LongLease lease(5000000);
  long slept = loop_sleeps_over_400(loop, [&] { polled_read(); });
  ASSERT_GE(slept, 0);
  // Woken by the answers instead, it slept 100-440 times for these 400 reads; with the lease
  // 0 or 1, also with the host's two cores taken by other work.
  EXPECT_LT(slept, 20) << "the loop's thread slept and woke " << slept << " times for 400 polled reads";
}

// A poller that looks late (its answer already taken by the loop's thread, awake) still polls:
// its next operations keep the loop, and their answers wake that thread no more. Without that,
// the loop's thread, woken by each answer, takes it before the poller's first look, every time.
TEST_P(TcpProgress, APollerThatLooksLateKeepsTheLoopForItsNextOperations) {
  ASSERT_NO_FATAL_FAILURE(connect_client(64));
  pid_t loop = shared_loop_thread();
  LongLease lease(5000000);
  long slept = loop_sleeps_over_400(loop, [&] { polled_read(std::chrono::microseconds(300)); });
  ASSERT_GE(slept, 0);
  // 400 without the lease; 0 or 1 with it.
  EXPECT_LT(slept, 20) << "the loop's thread slept and woke " << slept << " times for 400 late-polled reads";
}

// A thread that keeps polling operations that finished long ago (a reaper) holds the loop as
// any poller does, and so runs it at each look: another thread's operation, left to the loop
// while that thread sleeps, completes meanwhile instead of waiting for the reaper to stop.
TEST_P(TcpProgress, AReaperPollingFinishedOperationsHoldsUpNobody) {
  ASSERT_NO_FATAL_FAILURE(connect_client(128));
  // A lease longer than the test: no lapse hands the loop back while the reaper looks.
  LongLease lease(3000000);
  libd_op *finished = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async(rig.t, 64, 0, buf, &finished)) << libd_last_error();
  ASSERT_EQ(0, libd_op_wait(finished, 10000)) << libd_last_error();
  std::atomic<bool> stop{false};
  std::thread reaper([&] {
    while (!stop.load()) libd_op_poll(finished);
  });
  auto t0 = std::chrono::steady_clock::now();
  int rc = 0;
  for (int i = 0; i < 20 && rc == 0; i++) {
    libd_op *op = nullptr;
    rc = libd_trdma_read_async(rig.t, 64, 0, buf + 64, &op);
    if (rc == 0) rc = libd_op_wait(op, 3000);
    libd_op_free(op);
  }
  long ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  reaper.join();
  libd_op_free(finished);
  EXPECT_EQ(0, rc) << "a sleeper's read beside the reaper: " << libd_strerror(rc);
  // Served by the reaper's looks: a few milliseconds for the 20. A reaper that took the loop
  // without running it held the first read up for the whole lease.
  EXPECT_LT(ms, 1000) << "20 reads of a sleeper took " << ms << " ms beside the reaper";
}

// A caller that spins on its own answer (busy_poll_us: a blocking read or an attachment's verdict
// led on the calling thread) holds the shared loop while it spins: on a shared session, which
// the loop's thread watches while it is idle, that thread would otherwise be woken by each answer
// only to find the caller reading it, and woken again to watch the session afterwards.
TEST_F(TcpLeader, ASpinningLeaderWakesNoLoopThreadForItsAnswers) {
  ASSERT_NO_FATAL_FAILURE(connect_spinning(64));
  pid_t loop = shared_loop_thread();
  LongLease lease(5000000);
  long slept = loop_sleeps_over_400(loop, [&] { ASSERT_EQ(0, libd_trdma_read(rig.t, 64, 0, buf)) << libd_last_error(); });
  ASSERT_GE(slept, 0);
  // Without the lease: 213 (as many as the polled reads' test without one).
  EXPECT_LT(slept, 100) << "the loop's thread slept and woke " << slept << " times for 400 spun reads";
}

// A leader that ends with other threads' operations left to the loop gives the loop back: their
// waiters may sleep without a look that would end its lease, and would wait for it to lapse.
TEST_F(TcpLeader, OperationsLeftToTheLoopAreNotHeldByTheLeadersLease) {
  ASSERT_NO_FATAL_FAILURE(connect_spinning(8192));
  LongLease lease(3000000);
  std::atomic<bool> stop{false};
  std::thread spinner([&] {
    while (!stop.load())
      if (libd_trdma_read(rig.t, 64, 0, buf) != 0) break;
  });
  long worst_ms = 0;
  for (int i = 0; i < 200; i++) {
    // A blocking read: posted to the loop when the other thread leads, and waited for without
    // a look of its own (a waiter that looks, libd_op_wait, would end the lease itself).
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(0, libd_trdma_read(rig.t, 64, 4096, buf + 4096)) << libd_last_error();
    worst_ms = std::max<long>(worst_ms, std::chrono::duration_cast<std::chrono::milliseconds>(
                                            std::chrono::steady_clock::now() - t0).count());
    if (worst_ms >= 1500) break;  // one is enough to know
  }
  stop = true;
  spinner.join();
  EXPECT_LT(worst_ms, 1500) << "a read left to the loop waited for the leader's 3 s lease to lapse";
}

// A caller that stops polling (it arms the operation's eventfd to sleep) gives the loop back at
// once: the loop's thread completes the operation and writes the eventfd, long before the
// caller's lease would have lapsed.
TEST_P(TcpProgress, AWaiterThatStopsPollingIsWokenByTheLoop) {
  ASSERT_NO_FATAL_FAILURE(connect_client(64));
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ASSERT_GE(efd, 0);
  LongLease lease(3000000);
  for (int i = 0; i < 20; i++) {
    libd_op *op = nullptr;
    ASSERT_EQ(0, libd_trdma_read_async(rig.t, 64, 0, buf, &op)) << libd_last_error();
    libd_op_poll(op);  // two looks: the lease is the caller's now...
    libd_op_poll(op);
    ASSERT_EQ(0, libd_op_watch(op, efd));  // ...then it sleeps until told
    long ms = ms_until_written(efd);
    ASSERT_GE(ms, 0) << "the operation's eventfd was not written";
    EXPECT_LT(ms, 1500) << "woken only when the caller's 3 s lease lapsed";
    EXPECT_EQ(0, libd_op_poll(op));
    ASSERT_EQ(0, libd_op_watch(op, -1));
    libd_op_free(op);
  }
  close(efd);
}

// The same for a caller that polled and then sleeps in libd_op_wait.
TEST_P(TcpProgress, AWaiterThatPolledThenWaitsIsWokenByTheLoop) {
  ASSERT_NO_FATAL_FAILURE(connect_client(64));
  LongLease lease(3000000);
  for (int i = 0; i < 20; i++) {
    libd_op *op = nullptr;
    ASSERT_EQ(0, libd_trdma_read_async(rig.t, 64, 0, buf, &op)) << libd_last_error();
    libd_op_poll(op);
    libd_op_poll(op);
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(0, libd_op_wait(op, 10000)) << libd_last_error();
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(ms, 1500) << "woken only when the caller's 3 s lease lapsed";
    libd_op_free(op);
  }
}

// One look (a status check) is no polling: it does not park the loop's thread, which goes on
// serving a waiter that sleeps. (The server's loop is held by this thread, so that the sleeper's
// answer comes only after the look.)
TEST_P(TcpProgress, ASingleLookLeavesTheLoopToItsThread) {
  ASSERT_NO_FATAL_FAILURE(connect_client(64));
  LongLease lease(3000000);
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ASSERT_GE(efd, 0);
  while (rig.server->progress(3000000) != 1) std::this_thread::yield();  // the server's loop is ours
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async(rig.t, 64, 0, buf, &op)) << libd_last_error();
  ASSERT_EQ(0, libd_op_watch(op, efd));
  libd_op *other = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async(rig.t, 64, 0, buf, &other)) << libd_last_error();
  std::thread([&] { libd_op_poll(other); }).join();  // one look, from a thread that never looked before
  auto t0 = std::chrono::steady_clock::now();
  struct pollfd p = {efd, POLLIN, 0};
  long ms = 0;
  while (::poll(&p, 1, 0) == 0 && ms < 10000) {
    rig.server->progress(3000000);  // serve both requests
    ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  }
  rig.server->progress(0);
  EXPECT_LT(ms, 1500) << "the look parked the loop's thread for the 3 s lease";
  EXPECT_EQ(0, libd_op_wait(other, 10000));
  EXPECT_EQ(0, libd_op_wait(op, 10000));
  ASSERT_EQ(0, libd_op_watch(op, -1));
  libd_op_free(op);
  libd_op_free(other);
  close(efd);
}

// One thread polls its reads while another sleeps in libd_op_wait on its own: the sleeper's
// answers are read by the poller's turns of the loop (or by the loop's thread once the lease
// lapses) and it is woken.
TEST_P(TcpProgress, ASleeperIsServedWhileAnotherThreadPolls) {
  ASSERT_NO_FATAL_FAILURE(connect_client(8192));
  std::atomic<bool> stop{false};
  std::atomic<int> polled{0};
  std::thread poller([&] {
    while (!stop.load()) {
      libd_op *op = nullptr;
      if (libd_trdma_read_async(rig.t, 64, 0, buf, &op) != 0) break;
      poll_until_done(op, std::chrono::milliseconds(3000));
      if (libd_op_poll(op) == 0) polled++;
      libd_op_free(op);
    }
  });
  // The sleeper's reads go on until the poller has completed reads of its own meanwhile (on a
  // loaded host the poller's thread may not run at all during a fixed number of them).
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (polled.load() == 0 && std::chrono::steady_clock::now() < end) std::this_thread::yield();
  if (polled.load() == 0) {
    stop = true;
    poller.join();  // (a failing ASSERT here would leave it joinable: std::terminate)
    FAIL() << "the poller completed nothing";
  }
  int first = polled.load(), waited = 0, reads = 0;
  while ((reads < 200 || polled.load() < first + 10) && std::chrono::steady_clock::now() < end) {
    libd_op *op = nullptr;
    if (libd_trdma_read_async(rig.t, 64, 4096, buf + 4096, &op) != 0) {
      ADD_FAILURE() << "read " << reads << ": " << libd_last_error();
      break;
    }
    reads++;
    if (libd_op_wait(op, 5000) == 0) waited++;
    libd_op_free(op);
  }
  stop = true;
  poller.join();
  EXPECT_EQ(reads, waited) << libd_last_error();
  EXPECT_GE(reads, 200);
  EXPECT_GE(polled.load(), first + 10) << "the poller did not poll while the sleeper read";
}

// An operation's own connect on the process's shared connection, as scad.connect makes one per
// operation: a new holder of a new grant, its first transfer (the ATTACH goes out with it), the
// owner's verdict waited for spinning (busy_poll_us), the transfer waited for, the holder gone.
class TcpAttachingLeader : public ::testing::Test {
 protected:
  void SetUp() override {
    mem.resize(1 << 20);
    test::fill_random(mem.data(), mem.size(), 11);
    ASSERT_EQ(0, server.add_lent_element("buf", mem.data(), mem.size())) << libd_last_error();
    ASSERT_EQ(0, server.listen_tcp("127.0.0.1", 0, &port)) << libd_last_error();
    ASSERT_NO_FATAL_FAILURE(first = holder());
    ASSERT_EQ(0, libd_transport_connect(first.t)) << libd_last_error();  // opens the session
  }

  struct Holder {
    test::ActionPtr action;
    libd_transport *t = nullptr;
    char *buf = nullptr;
  };

  Holder holder() {
    libd::Grant g;
    g.element = "buf";
    g.client = "*";
    g.rights = LIBD_RIGHT_READ | LIBD_RIGHT_WRITE;
    EXPECT_EQ(0, server.grant(&g)) << libd_last_error();
    Holder h;
    h.action = test::make_action("holder");
    std::string durl = "t;tcp;share,1;timeout_ms,10000;busy_poll_us,1000000;" + server.client_config(g);
    EXPECT_EQ(0, libd_action_add_transport(h.action.get(), durl.c_str())) << libd_last_error();
    h.t = libd_action_get_transport(h.action.get(), "t");
    EXPECT_EQ(0, libd_trdma_reg(h.t, mem.size(), reinterpret_cast<void **>(&h.buf)));
    return h;
  }

  // Starts the holder's first transfer and waits for the verdict: whether the transfer was done
  // when the verdict came back.
  bool done_with_verdict(Holder &h, size_t size, bool write, libd_op **op) {
    int rc = write ? libd_trdma_write_async(h.t, size, 0, h.buf, op) : libd_trdma_read_async(h.t, size, 0, h.buf, op);
    EXPECT_EQ(0, rc) << libd_last_error();
    if (rc) return false;
    uint64_t remote_size;
    unsigned rights;
    EXPECT_EQ(0, libd_trdma_remote(h.t, &remote_size, &rights)) << libd_last_error();
    return (*op)->op->done();
  }

  std::vector<char> mem;  // outlives the server, whose loop may still be sending from it
  libd::MemoryServer server;
  uint16_t port = 0;
  Holder first;
};

// The verdict's wait reads on until the transfer behind the ATTACH is answered too (the caller
// waits for it next): handing the rest of the stream to the loop's thread would wake that thread
// in the middle of the transfer, and it and the caller would take the socket from each other.
TEST_F(TcpAttachingLeader, ASpinningVerdictReadsItsTransferToTheEnd) {
  for (bool write : {false, true}) {
    for (int i = 0; i < 5; i++) {
      Holder h = holder();
      if (write) test::fill_random(h.buf, 512 * 1024, 20 + i);
      libd_op *op = nullptr;
      EXPECT_TRUE(done_with_verdict(h, 512 * 1024, write, &op))
          << (write ? "a write" : "a read") << " of 512 KiB was still under way when its verdict returned";
      if (!op) continue;
      EXPECT_EQ(0, libd_op_wait(op, 10000)) << libd_last_error();
      libd_op_free(op);
      EXPECT_EQ(0, memcmp(h.buf, mem.data(), 512 * 1024)) << (write ? "written" : "read") << " bytes differ";
    }
  }
}

// Operations one after the other, each on a grant of its own, cost the loop's thread no wake-up:
// the caller's lease keeps it parked, and nothing the caller does needs it (the deadline tick of
// the previous operations still runs, the session's watch is left on).
TEST_F(TcpAttachingLeader, OperationsOneAfterTheOtherWakeNoLoopThread) {
  pid_t loop = shared_loop_thread();
  LongLease lease(5000000);
  long slept = loop_sleeps_over_400(loop, [&] {
    Holder h = holder();
    libd_op *op = nullptr;
    done_with_verdict(h, 256 * 1024, false, &op);
    if (!op) return;
    EXPECT_EQ(0, libd_op_wait(op, 10000)) << libd_last_error();
    libd_op_free(op);
  });
  ASSERT_GE(slept, 0);
  EXPECT_LT(slept, 100) << "the loop's thread slept and woke " << slept << " times for 400 operations";
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

// The same for the wait of an asynchronous operation (libd_op_wait): it polls before it sleeps,
// reading its answers itself, as a caller polling with libd_op_poll would; 16 writes at once
// are then sent and answered without the loop's thread handing each completion over.
TEST(TcpBusyPoll, AnOperationsWaitPollsInsteadOfSleeping) {
  auto rig = test::make_rig("tcp", 1 << 20, 3, "busy_poll_us,200000");
  ASSERT_EQ(0, libd_transport_connect(rig.t)) << libd_last_error();
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 1 << 20, reinterpret_cast<void **>(&buf)));
  test::fill_random(buf, 1 << 20, 9);
  auto batch = [&] {
    libd_op *ops[16];
    for (int i = 0; i < 16; i++)
      ASSERT_EQ(0, libd_trdma_write_async(rig.t, 64 * 1024, uint64_t(i) * 64 * 1024, buf + i * 64 * 1024, &ops[i]))
          << libd_last_error();
    for (auto *op : ops) {
      EXPECT_EQ(0, libd_op_wait(op, 10000)) << libd_last_error();
      libd_op_free(op);
    }
  };
  batch();
  // A long lease: a preempted waiter (a loaded host) does not let the loop's thread take the loop
  // back between batches, whose posts would then wait for its lock.
  LongLease lease(5000000);
  struct rusage before, after;
  getrusage(RUSAGE_THREAD, &before);
  for (int i = 0; i < 50; i++) batch();
  getrusage(RUSAGE_THREAD, &after);
  // Sleeping waits: one or more a batch (50 and up); polled, a few at most.
  EXPECT_LT(after.ru_nvcsw - before.ru_nvcsw, 25) << "the waiter slept for its writes' answers";
}

// A polling wait that returns while another operation of the connection is still under way and
// its waiter sleeps (on its eventfd) gives the loop back: that waiter is served by the loop's
// thread at once, not when the poller's lease lapses.
TEST(TcpBusyPoll, APollingWaitGivesTheLoopBackToASleepersOperation) {
  constexpr size_t kLarge = 32 << 20;
  auto rig = test::make_rig("tcp", kLarge + 4096, 3, "share,1;busy_poll_us,1000000");
  ASSERT_EQ(0, libd_transport_connect(rig.t)) << libd_last_error();
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, kLarge + 4096, reinterpret_cast<void **>(&buf)));
  int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ASSERT_GE(efd, 0);
  LongLease lease(3000000);
  for (int i = 0; i < 3; i++) {
    libd_op *small = nullptr, *large = nullptr;
    ASSERT_EQ(0, libd_trdma_read_async(rig.t, 64, 0, buf, &small)) << libd_last_error();
    ASSERT_EQ(0, libd_trdma_read_async(rig.t, kLarge, 4096, buf + 4096, &large)) << libd_last_error();
    ASSERT_EQ(0, libd_op_watch(large, efd));  // its waiter sleeps until the eventfd is written
    EXPECT_EQ(0, libd_op_wait(small, 10000)) << libd_last_error();  // polls: takes the loop
    long ms = ms_until_written(efd);
    ASSERT_GE(ms, 0) << "the large read's eventfd was not written";
    EXPECT_LT(ms, 1500) << "the sleeper's read waited for the poller's 3 s lease to lapse";
    EXPECT_EQ(0, libd_op_poll(large));
    ASSERT_EQ(0, libd_op_watch(large, -1));
    libd_op_free(small);
    libd_op_free(large);
  }
  close(efd);
}

TEST(TcpBusyPoll, TheParameterIsChecked) {
  for (const char *bad : {"busy_poll_us,x", "busy_poll_us,2000000"}) {
    auto action = test::make_action("client-1");
    std::string durl = std::string("mem;tcp;host,127.0.0.1;port,1;grant,g;secret,") + std::string(64, 'a') + ";" + bad;
    EXPECT_EQ(-EINVAL, libd_action_add_transport(action.get(), durl.c_str())) << bad;
  }
}
