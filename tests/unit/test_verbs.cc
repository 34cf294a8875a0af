// The verbs transport. The record and the no-device path run everywhere; the rest needs an RDMA
// device and runs in the Soft-RoCE guest (tests/softroce/run), where a missing device fails.
// Several tests drive a queue pair directly (ibv::connect_driver) to check what the *device*
// enforces — a key beyond its range, a key on another client's queue pair — past the library's
// own checks.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>

#include "core/params.h"
#include "harness.h"
#include "io/ioloop.h"
#include "transports/verbs/verbs_connect.h"
#include "ibv/cm.h"
#include "ibv/qp.h"
#include "ibv/record.h"

using test::fill_random;
using test::make_rig;
using namespace libd;

// After a reset: recover rebuilds the queue pair, and 4 KiB written then read back match.
static void RecoverAndRoundTrip(libd_transport *t, char *buf, uint64_t seed) {
  ASSERT_EQ(0, libd_transport_recover(t)) << libd_last_error();
  fill_random(buf, 4096, seed);
  ASSERT_EQ(0, libd_trdma_write(t, 4096, 0, buf)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_read(t, 4096, 0, buf + 8192)) << libd_last_error();
  EXPECT_EQ(0, memcmp(buf, buf + 8192, 4096));
}

// Waits for each operation, the newest first (its last request is the likeliest to have no
// signalled one after it), and frees it.
static void WaitNewestFirst(const std::vector<libd_op *> &ops) {
  for (size_t i = ops.size(); i-- > 0;) {
    ASSERT_EQ(0, libd_op_wait(ops[i], 5000)) << i << ": " << libd_last_error();
    libd_op_free(ops[i]);
  }
}

#define NEED_VERBS()                                                         \
  do {                                                                       \
    if (!test::verbs_wanted()) GTEST_SKIP() << "no RDMA device on this host"; \
  } while (0)

TEST(VerbsRecord, RoundTripsEveryField) {
  ibv::Record r;
  r.flags = ibv::kRecordFlagMemoryWindow;
  r.qpn = 0x123456;
  r.psn = 0xabcdef;
  r.mtu = 3;
  r.port = 1;
  r.lid = 77;
  for (int i = 0; i < 16; i++) r.gid[i] = uint8_t(i * 11);
  r.addr = 0x7f0011223344;
  r.length = 1 << 20;
  r.rkey = 0xdeadbeef;
  r.rights = 3;
  r.rd_atomic = 16;
  std::string wire = ibv::encode_record(r);
  ASSERT_EQ(ibv::kRecordSize, wire.size());
  EXPECT_EQ("RV", wire.substr(0, 2)) << "magic 0x5652, little-endian";
  ibv::Record back;
  std::string why;
  ASSERT_EQ(0, ibv::decode_record(wire.data(), wire.size(), &back, &why)) << why;
  EXPECT_EQ(r.qpn, back.qpn);
  EXPECT_EQ(r.psn, back.psn);
  EXPECT_EQ(r.addr, back.addr);
  EXPECT_EQ(r.rkey, back.rkey);
  EXPECT_EQ(0, memcmp(r.gid, back.gid, 16));
}

TEST(VerbsRecord, RefusesWhatIsNotAVersion1Record) {
  ibv::Record r;
  r.qpn = 5;
  r.mtu = 3;
  r.rd_atomic = 1;
  std::string good = ibv::encode_record(r), why;
  ibv::Record out;
  auto refused = [&](std::string w, const char *expect) {
    why.clear();
    int rc = ibv::decode_record(w.data(), w.size(), &out, &why);
    EXPECT_EQ(-EPROTO, rc);
    EXPECT_NE(std::string::npos, why.find(expect)) << why;
  };
  refused(good.substr(0, 63), "63 bytes");
  std::string v = good;
  v[2] = 2;
  refused(v, "version 2");
  v = good;
  v[0] = 'x';
  refused(v, "magic");
  v = good;
  v[7] = 1;  // qpn over 24 bits
  refused(v, "queue pair number");
  v = good;
  v[12] = 9;
  refused(v, "MTU");
  v = good;
  v[60] = 1;
  refused(v, "reserved");
  v = good;
  for (int i = 32; i < 48; i++) v[size_t(i)] = char(0xff);  // addr + length wraps
  refused(v, "wraps");
}

TEST(VerbsCm, HelloAndTicketRoundTripAndRefuseGarbage) {
  std::string ticket(ibv::kTicketSize, 'T'), back, why;
  std::string hello = ibv::encode_cm_hello(ticket);
  ASSERT_EQ(ibv::kCmHelloSize, hello.size());
  EXPECT_EQ("RC", hello.substr(0, 2));
  ASSERT_EQ(0, ibv::decode_cm_hello(hello.data(), hello.size(), &back, &why)) << why;
  EXPECT_EQ(ticket, back);
  std::string padded = hello + std::string(36, '\0');  // the CM pads a REQ's private data
  EXPECT_EQ(0, ibv::decode_cm_hello(padded.data(), padded.size(), &back, &why)) << why;
  auto refused = [&](const std::string &w, const char *expect) {
    why.clear();
    EXPECT_EQ(-EPROTO, ibv::decode_cm_hello(w.data(), w.size(), &back, &why));
    EXPECT_NE(std::string::npos, why.find(expect)) << why;
  };
  refused(hello.substr(0, 19), "expected 20");
  refused("XX" + hello.substr(2), "magic");
  std::string v = hello;
  v[2] = 2;
  refused(v, "version 2");
  refused(hello + "x", "trailing");
  EXPECT_EQ(-EPROTO, ibv::decode_cm_hello(nullptr, 0, &back, &why));

  uint16_t port = 0;
  std::string body = ibv::encode_cm_ticket(4791, ticket);
  ASSERT_EQ(0, ibv::decode_cm_ticket(body.data(), body.size(), &port, &back, &why)) << why;
  EXPECT_EQ(4791, port);
  EXPECT_EQ(ticket, back);
  EXPECT_EQ(-EPROTO, ibv::decode_cm_ticket(body.data(), body.size() - 1, &port, &back, &why));
  std::string zero = ibv::encode_cm_ticket(0, ticket);
  EXPECT_EQ(-EPROTO, ibv::decode_cm_ticket(zero.data(), zero.size(), &port, &back, &why));
}

TEST(Verbs, WithoutADeviceInitSaysSo) {
  if (test::verbs_wanted()) GTEST_SKIP() << "this host has an RDMA device";
  auto a = test::make_action("client-1");
  int rc = libd_action_add_transport(a.get(), "mem;verbs;host,127.0.0.1;port,9;grant,g;secret,0123456789abcdef0123456789abcdef");
  EXPECT_EQ(-ENODEV, rc);
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("no RDMA device")) << libd_last_error();
  libd::MemoryServer server;
  EXPECT_EQ(-ENODEV, server.enable_verbs(libd::Params()));
}

// Out-of-range settings are refused by name before any device is touched (so on every host).
TEST(Verbs, BadSettingsAreRefusedByName) {
  const std::string base = "mem;verbs;host,127.0.0.1;port,9;grant,g;secret,0123456789abcdef0123456789abcdef";
  for (auto [extra, name] : std::vector<std::pair<std::string, std::string>>{
           {"depth,0", "depth"}, {"inline,5000", "inline"}, {"poll,2", "poll"}, {"setup,udp", "setup"},
           {"doorbell_batch,5000", "doorbell_batch"}, {"doorbell_batch,many", "doorbell_batch"}}) {
    SCOPED_TRACE(extra);
    auto a = test::make_action("client-1");
    EXPECT_EQ(-EINVAL, libd_action_add_transport(a.get(), (base + ";" + extra).c_str()));
    EXPECT_NE(std::string::npos, std::string(libd_last_error()).find(name)) << libd_last_error();
  }
}

TEST(Verbs, LargeTransfersAreSplitAndTheBacklogDrains) {
  NEED_VERBS();
  // 4 KiB requests, 4 on the wire: a 1 MiB write is 256 requests queued behind a depth of 4.
  auto rig = make_rig("verbs", 2 << 20, 3, "max_msg,4096;depth,4");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 2 << 20, reinterpret_cast<void **>(&buf))) << libd_last_error();
  fill_random(buf, 1 << 20, 5);
  ASSERT_EQ(0, libd_trdma_write(rig.t, (1 << 20) - 3, 3, buf)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_read(rig.t, (1 << 20) - 3, 3, buf + (1 << 20))) << libd_last_error();
  EXPECT_EQ(0, memcmp(buf, buf + (1 << 20), (1 << 20) - 3));
}

TEST(Verbs, ContiguousBatchesShareRequestsAndSplitMidSegment) {
  NEED_VERBS();
  // 40 pieces of 1000 bytes, remote-contiguous, from scattered local places, with empty entries
  // among them: gathered several to a request, cut inside a piece at max_msg (4096), through 2
  // slots.
  auto rig = make_rig("verbs", 1 << 20, 3, "max_msg,4096;depth,2");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 1 << 20, reinterpret_cast<void **>(&buf)));
  std::vector<libd_iov> w, r;
  for (int i = 0; i < 40; i++) {
    if (i % 13 == 0) w.push_back({0, 0, buf}), r.push_back({0, 0, buf});
    fill_random(buf + i * 2048, 1000, uint64_t(i) + 7);
    w.push_back({1000, 500 + uint64_t(i) * 1000, buf + i * 2048});
    r.push_back({1000, 500 + uint64_t(i) * 1000, buf + (1 << 19) + (39 - i) * 2048});
  }
  w.push_back({0, 0, buf}), r.push_back({0, 0, buf});
  ASSERT_EQ(0, libd_trdma_writev(rig.t, w.data(), int(w.size()))) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_readv(rig.t, r.data(), int(r.size()))) << libd_last_error();
  for (size_t i = 0; i < w.size(); i++) EXPECT_EQ(0, memcmp(w[i].buf, r[i].buf, w[i].size)) << i;
  // And the same range read back in one piece: the writes landed contiguously.
  ASSERT_EQ(0, libd_trdma_read(rig.t, 40000, 500, buf + (3 << 18))) << libd_last_error();
  for (int i = 0; i < 40; i++) EXPECT_EQ(0, memcmp(buf + i * 2048, buf + (3 << 18) + i * 1000, 1000)) << i;
}

TEST(Verbs, PollingModeMovesTheSameData) {
  NEED_VERBS();
  auto rig = make_rig("verbs", 1 << 20, 3, "poll,1");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 1 << 20, reinterpret_cast<void **>(&buf)));
  for (size_t n : {1ul, 64ul, 4096ul, 300000ul}) {
    fill_random(buf, n, n);
    ASSERT_EQ(0, libd_trdma_write(rig.t, n, 100, buf)) << libd_last_error();
    ASSERT_EQ(0, libd_trdma_read(rig.t, n, 100, buf + (1 << 19))) << libd_last_error();
    ASSERT_EQ(0, memcmp(buf, buf + (1 << 19), n)) << n;
  }
  // Counted as any operation, whichever path ran them (these ran on the direct path).
  libd_stats st{};
  ASSERT_EQ(0, libd_transport_stats(rig.t, &st));
  EXPECT_EQ(4u, st.read_ops);
  EXPECT_EQ(4u, st.write_ops);
  EXPECT_EQ(1u + 64 + 4096 + 300000, st.read_bytes);
  EXPECT_EQ(1u + 64 + 4096 + 300000, st.write_bytes);
  EXPECT_EQ(0u, st.errors);
}

// Blocking calls from several threads, mixed with pipelined asynchronous ones: a blocking call
// may find another direct one running, or asynchronous writes still waiting for their doorbell
// (doorbell_batch 4), and must then take the general path. Each read sees every write posted
// before it, every byte lands, and every operation is counted exactly once (a declined direct
// attempt leaves nothing in flight: re-registering, which needs none, succeeds).
TEST(Verbs, ConcurrentBlockingAndAsyncCallsInPollingModeAllLand) {
  NEED_VERBS();
  constexpr uint64_t kRegion = 1 << 14, kSize = 64;
  constexpr int kRounds = 150;
  constexpr int kBurst = 14;  // not a multiple of doorbell_batch: the last ones usually wait for a doorbell
  auto rig = make_rig("verbs", 4 * kRegion, 3, "poll,1;depth,32;doorbell_batch,4");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 8 * kRegion, reinterpret_cast<void **>(&buf)));
  std::atomic<int> failures{0};
  std::string first_failure;
  std::mutex failure_mu;
  auto fail = [&](const std::string &what) {
    std::lock_guard<std::mutex> lk(failure_mu);
    if (failures++ == 0) first_failure = what + ": " + libd_last_error();
  };
  auto blocking = [&](int region) {
    char *out = buf + 2 * region * kRegion, *in = out + kRegion;
    for (int i = 0; i < kRounds; i++) {
      uint64_t at = uint64_t(region) * kRegion + uint64_t(i % 64) * kSize;
      fill_random(out, kSize, uint64_t(region * 1000 + i));
      if (libd_trdma_write(rig.t, kSize, at, out)) return fail("blocking write");
      if (libd_trdma_read(rig.t, kSize, at, in)) return fail("blocking read");
      if (memcmp(out, in, kSize)) return fail("blocking read-back " + std::to_string(i));
    }
  };
  auto pipelined = [&](int region) {
    char *out = buf + 2 * region * kRegion, *in = out + kRegion;
    for (int round = 0; round < kRounds / kBurst; round++) {
      fill_random(out, kBurst * kSize, uint64_t(round + 77));
      std::vector<libd_op *> ops(kBurst);
      for (int i = 0; i < kBurst; i++)
        if (libd_trdma_write_async(rig.t, kSize, region * kRegion + uint64_t(i) * kSize, out + i * kSize, &ops[size_t(i)]))
          return fail("async write");
      // Read back before waiting: some writes still wait for their doorbell, and the read must
      // not overtake them.
      int rc = libd_trdma_read(rig.t, kBurst * kSize, region * kRegion, in);
      for (auto *op : ops) {
        if (libd_op_wait(op, 5000)) fail("async write wait");
        libd_op_free(op);
      }
      if (rc) return fail("read-back");
      if (memcmp(out, in, kBurst * kSize)) return fail("async read-back " + std::to_string(round));
    }
  };
  std::thread a(blocking, 0), b(blocking, 1), c(blocking, 2), d(pipelined, 3);
  a.join(), b.join(), c.join(), d.join();
  EXPECT_EQ(0, failures.load()) << first_failure;
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(rig.t));
  libd_stats st{};
  ASSERT_EQ(0, libd_transport_stats(rig.t, &st));
  EXPECT_EQ(uint64_t(3 * kRounds + kRounds / kBurst * kBurst), st.write_ops);
  EXPECT_EQ(uint64_t(3 * kRounds + kRounds / kBurst), st.read_ops);
  EXPECT_EQ(uint64_t(3 * kRounds + kRounds / kBurst * kBurst) * kSize, st.write_bytes);
  EXPECT_EQ(0, libd_trdma_reg(rig.t, 8 * kRegion, reinterpret_cast<void **>(&buf)))
      << "nothing may be left counted in flight: " << libd_last_error();
}

// The set-up of the tests that drive drivers directly: the device, a memory server with one
// element of `element` bytes and one grant, and `local` bytes of client memory registered.
struct DriverRig {
  std::shared_ptr<ibv::Device> dev;
  libd::MemoryServer server;
  uint16_t port = 0;
  libd::Grant grant;
  char *mem = nullptr;
  size_t mem_size = 0;
  std::shared_ptr<ibv::Mr> mr;
  ~DriverRig() {
    mr.reset();
    if (mem) munmap(mem, mem_size);
  }
  // A started driver with `cfg`, connected through the record exchange, our memory its local side.
  int connect(const ibv::QpDriver::Config &cfg, ibv::Connected *out) {
    int rc = ibv::connect_driver(dev, cfg, "127.0.0.1", std::to_string(port), {grant.id, grant.secret, grant.client},
                                   ibv::Setup::kOob, Deadline::after_ms(5000), nullptr, out);
    if (rc == 0) out->driver->set_local(mr);
    return rc;
  }
};

// An driver configuration for tests that count doorbells: depth 64, `batch` for coalescing, and
// no deadline tick (it would ring and fence on its own), so nothing rings but the test's calls.
static ibv::QpDriver::Config CountingConfig(bool poll_mode, size_t batch) {
  ibv::QpDriver::Config cfg;
  cfg.poll_mode = poll_mode;
  cfg.depth = 64;
  cfg.doorbell_batch = int(batch);
  cfg.tick_ms = 3600 * 1000;
  return cfg;
}

static void OpenDriverRig(DriverRig *r, uint64_t element, uint64_t offset, uint64_t length, size_t local) {
  ASSERT_EQ(0, ibv::Device::open(libd::Params(), &r->dev)) << libd_last_error();
  ASSERT_EQ(0, r->server.add_element("e1", element));
  ASSERT_EQ(0, r->server.enable_verbs(libd::Params())) << libd_last_error();
  ASSERT_EQ(0, r->server.listen_tcp("127.0.0.1", 0, &r->port));
  r->grant.element = "e1", r->grant.client = "A", r->grant.offset = offset, r->grant.length = length, r->grant.rights = 3;
  ASSERT_EQ(0, r->server.grant(&r->grant));
  void *mem = mmap(nullptr, local, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(MAP_FAILED, mem);
  r->mem = static_cast<char *>(mem);
  r->mem_size = local;
  ASSERT_EQ(0, r->dev->mrs().acquire(r->mem, local, IBV_ACCESS_LOCAL_WRITE, &r->mr));
}

// Selective signalling: with many operations live, only some requests ask for a completion and
// one completion stands for everything posted before it. Every operation must still complete with
// its data however the caller waits: newest first (its request may have no signalled one after
// it: the waiter posts a fence), in order, or not at all (the deadline tick fences). Both modes,
// a read-write grant (the fence is a zero-length write) and a read-only one (a zero-length read).
TEST(Verbs, UnsignalledRequestsStillCompleteEveryOperation) {
  NEED_VERBS();
  constexpr int kOps = 96;       // well over half the depth live: most requests go unsignalled
  constexpr uint64_t kSize = 100;  // under the inline size: writes travel in the request
  for (const char *mode : {"poll,1", "poll,0"}) {
    SCOPED_TRACE(mode);
    auto rig = make_rig("verbs", 1 << 20, 3, std::string(mode) + ";depth,64");
    char *buf = nullptr;
    ASSERT_EQ(0, libd_trdma_reg(rig.t, 1 << 20, reinterpret_cast<void **>(&buf)));
    fill_random(buf, kOps * kSize, 11);
    std::vector<libd_op *> ops(kOps);
    for (int i = 0; i < kOps; i++)
      ASSERT_EQ(0, libd_trdma_write_async(rig.t, kSize, i * kSize, buf + i * kSize, &ops[size_t(i)])) << libd_last_error();
    ASSERT_NO_FATAL_FAILURE(WaitNewestFirst(ops));
    char *back = buf + (1 << 19);
    for (int i = 0; i < kOps; i++)
      ASSERT_EQ(0, libd_trdma_read_async(rig.t, kSize, i * kSize, back + i * kSize, &ops[size_t(i)])) << libd_last_error();
    // Nobody waits: the transport's counters show when every read has completed.
    libd_stats st{};
    Deadline until = Deadline::after_ms(5000);
    while (libd_transport_stats(rig.t, &st) == 0 && st.read_ops < uint64_t(kOps) && !until.expired())
      std::this_thread::yield();
    EXPECT_EQ(uint64_t(kOps), st.read_ops) << "operations nobody waits for must complete too";
    for (auto *op : ops) {
      EXPECT_EQ(0, libd_op_wait(op, 5000)) << libd_last_error();
      libd_op_free(op);
    }
    EXPECT_EQ(0, memcmp(buf, back, kOps * kSize));
  }
  auto ro = make_rig("verbs", 1 << 20, LIBD_RIGHT_READ, "poll,1;depth,64");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(ro.t, 1 << 20, reinterpret_cast<void **>(&buf)));
  std::vector<libd_op *> ops(kOps);
  for (int i = 0; i < kOps; i++)
    ASSERT_EQ(0, libd_trdma_read_async(ro.t, kSize, i * kSize, buf + i * kSize, &ops[size_t(i)])) << libd_last_error();
  ASSERT_NO_FATAL_FAILURE(WaitNewestFirst(ops));
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(ro.t)) << "a fence must be an operation the grant allows";
}

// Doorbell coalescing (polling mode): once doorbell_batch requests are on the wire, a new
// asynchronous operation waits, and one doorbell rings for doorbell_batch of them — or sooner, at
// the next progress, at a synchronous call, or at the deadline tick when nobody drives the driver.
// Every byte still lands.
TEST(Verbs, PipelinedOperationsShareDoorbellsAndEveryOneLands) {
  NEED_VERBS();
  constexpr size_t kBatch = 8, kSize = 64, kSpace = 1 << 16;
  DriverRig rig;
  ASSERT_NO_FATAL_FAILURE(OpenDriverRig(&rig, kSpace, 0, kSpace, 2 * kSpace));
  ibv::QpDriver::Config cfg = CountingConfig(true, kBatch);
  ibv::Connected c, ticking;
  ASSERT_EQ(0, rig.connect(cfg, &c)) << libd_last_error();
  cfg.tick_ms = 50;
  ASSERT_EQ(0, rig.connect(cfg, &ticking)) << libd_last_error();
  ibv::QpDriver *e = c.driver.get();
  char *mem = rig.mem, *back = mem + kSpace;
  auto stats = std::make_shared<libd::Stats>();
  std::vector<std::shared_ptr<Op>> ops;
  size_t next = 0;  // writes go to consecutive slots of the remote range
  auto start = [&](bool sync = false) {
    auto op = std::make_shared<Op>(OpKind::Write, std::vector<Segment>{{kSize, next * kSize, mem + next * kSize}},
                                   Deadline::after_ms(5000), stats);
    next++;
    if (sync) e->run(op);
    else e->post(op);
    ops.push_back(op);
    return op;
  };
  fill_random(mem, kSpace, 21);

  uint64_t d0 = e->doorbells();
  for (size_t i = 0; i < kBatch; i++) start();  // fewer than kBatch on the wire: each rings at once
  EXPECT_EQ(d0 + kBatch, e->doorbells());
  for (size_t i = 0; i + 1 < kBatch; i++) start();  // then they wait for each other...
  EXPECT_EQ(d0 + kBatch, e->doorbells());
  start();  // ...and the kBatch-th rings once for all of them
  EXPECT_EQ(d0 + kBatch + 1, e->doorbells());
  start();  // one waiting alone goes out at the next progress
  EXPECT_EQ(d0 + kBatch + 1, e->doorbells());
  e->progress(nullptr);
  EXPECT_EQ(d0 + kBatch + 2, e->doorbells());

  // A synchronous call rings at once, for what waits before it too; their completions stand for
  // everything before them, so the waiting one is done when the call returns.
  auto deferred_until_ringing = [&] {  // starts operations until one waits for its doorbell
    for (size_t i = 0; i <= 2 * kBatch; i++) {
      uint64_t before = e->doorbells();
      auto op = start();
      if (e->doorbells() == before) return op;
    }
    return std::shared_ptr<Op>();
  };
  auto waiting = deferred_until_ringing();
  ASSERT_TRUE(waiting) << "with kBatch on the wire an operation must wait for its doorbell";
  auto sync = start(true);
  EXPECT_EQ(0, sync->status()) << sync->message();
  EXPECT_TRUE(waiting->done()) << "a synchronous call rings the doorbell for what waits before it";

  // Cancelling one that waits for its doorbell drops it: nothing rings, nothing is reset, and
  // the queue pair goes on (the operations after it land).
  auto dropped = deferred_until_ringing();
  ASSERT_TRUE(dropped);
  uint64_t rung = e->doorbells();
  EXPECT_EQ(-ECANCELED, dropped->cancel());
  EXPECT_EQ(rung, e->doorbells()) << "a cancelled operation that never went out rings nothing";
  ops.pop_back();  // it wrote nothing: its slot is the next one's
  next--;
  auto after = start(true);
  EXPECT_EQ(0, after->status()) << after->message();

  // Nobody drives the driver: the deadline tick rings and fences, and the operation completes.
  e = ticking.driver.get();
  waiting = deferred_until_ringing();
  ASSERT_TRUE(waiting);
  Deadline until = Deadline::after_ms(3000);
  while (!waiting->done() && !until.expired()) std::this_thread::yield();
  EXPECT_EQ(0, waiting->status()) << "an operation nobody waits for still goes out and completes";

  for (auto &op : ops) {
    EXPECT_EQ(0, op->wait_until(Clock::now() + std::chrono::seconds(5))) << op->message();
  }
  // Everything written reads back the same.
  auto read = std::make_shared<Op>(OpKind::Read, std::vector<Segment>{{next * kSize, 0, back}}, Deadline::after_ms(5000), stats);
  e->run(read);
  ASSERT_EQ(0, read->status()) << read->message();
  EXPECT_EQ(0, memcmp(mem, back, next * kSize));
  c.driver->close(-ECONNABORTED, "test over");
  ticking.driver->close(-ECONNABORTED, "test over");
}

// Event mode coalesces doorbells too, and nothing waits for the tick: while the loop thread is
// held (so that no completion is taken meanwhile), operations past doorbell_batch on the wire wait
// for their doorbell; a caller's own progress (libd_op_poll, a waiter's look before it sleeps)
// and a synchronous call ring for them, and so does the loop's next completion event once the
// loop runs again. Every byte lands.
TEST(Verbs, InEventModeTheCompletionEventRingsWaitingDoorbells) {
  NEED_VERBS();
  constexpr size_t kBatch = 4, kSize = 64, kSpace = 1 << 16;
  DriverRig rig;
  ASSERT_NO_FATAL_FAILURE(OpenDriverRig(&rig, kSpace, 0, kSpace, 2 * kSpace));
  ibv::QpDriver::Config cfg = CountingConfig(false, kBatch);  // no tick: only callers and completion events ring
  ibv::Connected c;
  ASSERT_EQ(0, rig.connect(cfg, &c)) << libd_last_error();
  ibv::QpDriver *e = c.driver.get();
  char *mem = rig.mem, *back = mem + kSpace;
  fill_random(mem, kSpace, 31);
  auto stats = std::make_shared<libd::Stats>();
  std::vector<std::shared_ptr<Op>> ops;
  auto start = [&](bool sync = false) {
    size_t i = ops.size();  // writes go to consecutive slots of the remote range
    auto op = std::make_shared<Op>(OpKind::Write, std::vector<Segment>{{kSize, i * kSize, mem + i * kSize}},
                                   Deadline::after_ms(5000), stats);
    if (sync) e->run(op);
    else e->post(op);
    ops.push_back(op);
    return op;
  };
  auto poll_until_done = [](const std::shared_ptr<Op> &op) {
    Deadline until = Deadline::after_ms(3000);
    while (op->poll() == -EINPROGRESS && !until.expired()) std::this_thread::yield();
    return op->status();
  };
  // Holds the loop thread: completion events wait, so nothing drains unless a caller does.
  // (Should the test end early, the broken promise lets the loop go.)
  std::unique_ptr<std::promise<void>> release;
  auto hold_loop = [&] {
    release = std::make_unique<std::promise<void>>();
    auto stalled = std::make_shared<std::promise<void>>();  // the loop's task owns it until it ends
    std::future<void> is_stalled = stalled->get_future();
    IoLoop::shared().post([stalled, released = release->get_future().share()] {
      stalled->set_value();
      released.wait();
    });
    is_stalled.wait();
  };
  auto release_loop = [&] {
    if (release) release->set_value();
    release.reset();
  };
  hold_loop();

  uint64_t d0 = e->doorbells();
  for (size_t i = 0; i < kBatch; i++) start();  // fewer than kBatch on the wire: each rings
  EXPECT_EQ(d0 + kBatch, e->doorbells());
  auto waiting = start();  // kBatch undrained on the wire: it waits for its doorbell
  EXPECT_EQ(d0 + kBatch, e->doorbells());
  EXPECT_EQ(0, poll_until_done(waiting)) << "a caller's progress rings for it: " << waiting->message();
  EXPECT_EQ(d0 + kBatch + 1, e->doorbells());

  for (size_t i = 0; i < kBatch; i++) start();
  waiting = start();
  uint64_t rung = e->doorbells();
  auto sync = start(true);
  EXPECT_EQ(rung + 1, e->doorbells()) << "a synchronous call rings at once, for what waits before it too";
  EXPECT_EQ(0, poll_until_done(sync)) << sync->message();
  EXPECT_TRUE(waiting->done()) << "its request went out in the synchronous call's burst, before it";

  // Let the loop take the event the first completion raised (and re-arm), then hold it again: the
  // event that rings for the next waiting operation must come from a completion after that.
  release_loop();
  Deadline taken = Deadline::after_ms(3000);
  while (e->events() == 0 && !taken.expired()) std::this_thread::yield();
  ASSERT_EQ(1u, e->events()) << "the completions so far raised one event (the queue was armed once)";
  hold_loop();
  for (size_t i = 0; i < kBatch; i++) start();
  waiting = start();
  EXPECT_FALSE(waiting->done());
  release_loop();  // the loop takes the new completion event: its progress rings the doorbell
  Deadline until = Deadline::after_ms(3000);
  while (!waiting->done() && !until.expired()) std::this_thread::yield();
  EXPECT_EQ(0, waiting->status()) << "nobody waits and no tick runs: the completion event must ring for it";
  EXPECT_LE(2u, e->events());

  for (auto &op : ops) EXPECT_EQ(0, op->wait_until(Clock::now() + std::chrono::seconds(5))) << op->message();
  auto read = std::make_shared<Op>(OpKind::Read, std::vector<Segment>{{ops.size() * kSize, 0, back}},
                                   Deadline::after_ms(5000), stats);
  e->run(read);
  EXPECT_EQ(0, read->wait_until(Clock::now() + std::chrono::seconds(5))) << read->message();
  EXPECT_EQ(0, memcmp(mem, back, ops.size() * kSize));
  release_loop();
  c.driver->close(-ECONNABORTED, "test over");
}

// The direct path: a blocking one-segment call in polling mode runs without an Op, with one
// doorbell, and lands its bytes. Where it cannot run so it declines and the general path runs the
// call: in event mode, behind asynchronous operations waiting for their doorbell, past the
// largest request. A device error on it breaks the queue pair with the reason.
TEST(Verbs, BlockingCallsRunDirectlyWhereTheyCan) {
  NEED_VERBS();
  constexpr size_t kSpace = 1 << 16;
  DriverRig rig;
  ASSERT_NO_FATAL_FAILURE(OpenDriverRig(&rig, kSpace, 4096, 8192, kSpace));
  ibv::QpDriver::Config cfg = CountingConfig(true, 4);
  cfg.max_msg = 4096;
  ibv::Connected c, events;
  ASSERT_EQ(0, rig.connect(cfg, &c)) << libd_last_error();
  cfg.poll_mode = false;
  ASSERT_EQ(0, rig.connect(cfg, &events)) << libd_last_error();
  char *mem = rig.mem;
  ibv::QpDriver *e = c.driver.get();
  // Runs one blocking call directly; false if the driver declined it.
  auto direct = [&](ibv::QpDriver *eng, OpKind kind, uint64_t size, uint64_t raddr, char *local, int *rc, std::string *why) {
    uint64_t seq;
    bool pending;
    if (!eng->start_direct(kind, {size, raddr, local}, &seq, &pending, rc, why)) return false;
    if (pending) *rc = eng->finish_direct(seq, Deadline::after_ms(5000), why);
    return true;
  };
  int rc = 0;
  std::string why;
  for (uint64_t size : {uint64_t(1), uint64_t(64), uint64_t(4096)}) {
    SCOPED_TRACE(size);
    fill_random(mem, size, size);
    uint64_t d0 = e->doorbells();
    ASSERT_TRUE(direct(e, OpKind::Write, size, 4096 + 100, mem, &rc, &why));
    ASSERT_EQ(0, rc) << why;
    ASSERT_TRUE(direct(e, OpKind::Read, size, 4096 + 100, mem + 8192, &rc, &why));
    ASSERT_EQ(0, rc) << why;
    EXPECT_EQ(d0 + 2, e->doorbells()) << "one doorbell each, no fence";
    EXPECT_EQ(0, memcmp(mem, mem + 8192, size));
  }
  EXPECT_FALSE(direct(e, OpKind::Read, 4097, 4096, mem, &rc, &why)) << "more than one request: the general path";
  EXPECT_FALSE(direct(events.driver.get(), OpKind::Read, 64, 4096, mem, &rc, &why)) << "event mode: the general path";

  // Asynchronous writes until one waits for its doorbell: a blocking call must not overtake it.
  auto stats = std::make_shared<libd::Stats>();
  fill_random(mem, 16 * 64, 5);
  std::vector<std::shared_ptr<Op>> ops;
  std::shared_ptr<Op> waiting;
  for (uint64_t i = 0; i < 16 && !waiting; i++) {
    auto op = std::make_shared<Op>(OpKind::Write, std::vector<Segment>{{64, 4096 + i * 64, mem + i * 64}},
                                   Deadline::after_ms(5000), stats);
    uint64_t before = e->doorbells();
    e->post(op);
    ops.push_back(op);
    if (e->doorbells() == before) waiting = op;
  }
  ASSERT_TRUE(waiting) << "with doorbell_batch on the wire an operation must wait for its doorbell";
  EXPECT_FALSE(direct(e, OpKind::Read, 64, 4096, mem + 8192, &rc, &why)) << "it would overtake the waiting write";
  auto read = std::make_shared<Op>(OpKind::Read, std::vector<Segment>{{ops.size() * 64, 4096, mem + 8192}},
                                   Deadline::after_ms(5000), stats);
  e->run(read);
  ASSERT_EQ(0, read->status()) << read->message();
  EXPECT_TRUE(waiting->done()) << "the general path rings for what waits before it";
  EXPECT_EQ(0, memcmp(mem, mem + 8192, ops.size() * 64)) << "the read saw every write before it";
  for (auto &op : ops) EXPECT_EQ(0, op->wait_until(Clock::now() + std::chrono::seconds(5))) << op->message();

  // Past the key's range (the library's own check bypassed): the device refuses, the queue pair
  // breaks with the reason, and later calls decline (the general path reports the break).
  e->set_remote(4096, c.peer.addr + 8192, c.peer.rkey, true);
  ASSERT_TRUE(direct(e, OpKind::Read, 64, 4096, mem, &rc, &why));
  EXPECT_EQ(-EACCES, rc);
  EXPECT_NE(std::string::npos, why.find("does not allow this range")) << why;
  EXPECT_FALSE(direct(e, OpKind::Read, 64, 4096, mem, &rc, &why)) << "a broken driver declines";
  for (auto *conn : {&c, &events}) conn->driver->close(-ECONNABORTED, "test over");
}

// A direct call whose peer stops answering (its queue pair in ERROR drops every packet) ends at
// its deadline, long before the device's own retries would give up (about 0.5 s), with the
// queue pair reset and the request given back.
TEST(Verbs, ADirectCallToASilentPeerEndsAtItsDeadline) {
  NEED_VERBS();
  std::shared_ptr<ibv::Device> dev;
  ASSERT_EQ(0, ibv::Device::open(libd::Params(), &dev)) << libd_last_error();
  ibv::QpDriver::Config cfg;
  cfg.poll_mode = true;
  std::shared_ptr<ibv::QpDriver> e;
  ASSERT_EQ(0, ibv::QpDriver::create(dev, cfg, nullptr, &e)) << libd_last_error();
  // The peer: a bare queue pair of our own, wired to the driver's.
  ibv_cq *peer_cq = ibv_create_cq(dev->ctx(), 8, nullptr, nullptr, 0);
  ASSERT_TRUE(peer_cq);
  ibv_qp *peer = nullptr;
  ASSERT_EQ(0, ibv::create_rc_qp(*dev, peer_cq, ibv::QpShape(), &peer)) << libd_last_error();
  uint32_t psn_e = ibv::random_psn(), psn_p = ibv::random_psn();
  ibv::Record rec_e = ibv::local_record(*dev, e->qp(), psn_e), rec_p = ibv::local_record(*dev, peer, psn_p);
  ASSERT_EQ(0, ibv::connect_rc_qp(*dev, e->qp(), 0, psn_e, rec_p)) << libd_last_error();
  ASSERT_EQ(0, ibv::connect_rc_qp(*dev, peer, IBV_ACCESS_REMOTE_READ, psn_p, rec_e)) << libd_last_error();
  constexpr size_t kSpace = 8192;
  char *mem = static_cast<char *>(mmap(nullptr, 2 * kSpace, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  char *remote = mem + kSpace;
  ibv_mr *remote_mr = ibv_reg_mr(dev->pd(), remote, kSpace, IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE);
  ASSERT_TRUE(remote_mr);
  std::shared_ptr<ibv::Mr> mr;
  ASSERT_EQ(0, dev->mrs().acquire(mem, kSpace, IBV_ACCESS_LOCAL_WRITE, &mr));
  e->set_local(mr);
  e->set_remote(0, uint64_t(uintptr_t(remote)), remote_mr->rkey, false);
  fill_random(remote, 64, 9);
  uint64_t seq;
  bool pending;
  int rc;
  std::string why;
  ASSERT_TRUE(e->start_direct(OpKind::Read, {64, 0, mem}, &seq, &pending, &rc, &why));
  if (pending) rc = e->finish_direct(seq, Deadline::after_ms(5000), &why);
  ASSERT_EQ(0, rc) << why;
  EXPECT_EQ(0, memcmp(mem, remote, 64)) << "the pair works before the peer goes silent";

  ibv::break_qp(peer);
  auto t0 = Clock::now();
  ASSERT_TRUE(e->start_direct(OpKind::Read, {64, 0, mem}, &seq, &pending, &rc, &why));
  ASSERT_TRUE(pending) << "a silent peer cannot have answered: " << rc << " " << why;
  rc = e->finish_direct(seq, Deadline::after_ms(100), &why);
  double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_EQ(-ETIMEDOUT, rc) << why;
  EXPECT_NE(std::string::npos, why.find("deadline")) << why;
  // The device's retries would end it with -EIO after about 0.5 s, giving up on the flush after 3 s.
  EXPECT_LT(ms, 2000.0) << "the deadline must end it, and the reset must give the request back";
  EXPECT_FALSE(e->start_direct(OpKind::Read, {64, 0, mem}, &seq, &pending, &rc, &why)) << "the driver is broken";
  e->close(-ECONNABORTED, "test over");
  e.reset();
  ibv_destroy_qp(peer);
  ibv_destroy_cq(peer_cq);
  ibv_dereg_mr(remote_mr);
  mr.reset();
  munmap(mem, 2 * kSpace);
}

// Cancelling one operation among many unsignalled ones resets the queue pair. Requests still on
// the wire are flushed back with a completion each; those that had already completed unsignalled
// have none, and nothing signalled follows them any more — the driver's fence on the broken queue
// pair must still tell. Every other operation completes (done or failed), and recover starts clean.
TEST(Verbs, ACancelAmongUnsignalledRequestsFlushesEveryOperation) {
  NEED_VERBS();
  auto rig = make_rig("verbs", 4 << 20, 3, "poll,1;depth,64");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 4 << 20, reinterpret_cast<void **>(&buf)));
  constexpr int kOps = 60;
  std::vector<libd_op *> ops(kOps);
  for (int i = 0; i < kOps; i++)
    ASSERT_EQ(0, libd_trdma_write_async(rig.t, 65536, uint64_t(i % 32) * 65536, buf, &ops[size_t(i)])) << libd_last_error();
  int rc = libd_op_cancel(ops[kOps / 2]);
  EXPECT_TRUE(rc == 0 || rc == -ECANCELED) << rc;
  for (int i = 0; i < kOps; i++) {
    EXPECT_NE(-ETIMEDOUT, libd_op_wait(ops[size_t(i)], 5000)) << i << " never completed";
    libd_op_free(ops[size_t(i)]);
  }
  RecoverAndRoundTrip(rig.t, buf, 9);
}

// Inline writes (the data travels in the request) and, with inline,0, through the local key: the
// same bytes land either way, at every size around the inline limit.
TEST(Verbs, InlineAndRegisteredWritesLandTheSameBytes) {
  NEED_VERBS();
  for (const char *cfg : {"inline,128", "inline,0"}) {
    SCOPED_TRACE(cfg);
    auto rig = make_rig("verbs", 1 << 16, 3, cfg);
    char *buf = nullptr;
    ASSERT_EQ(0, libd_trdma_reg(rig.t, 1 << 16, reinterpret_cast<void **>(&buf)));
    for (size_t n : {1ul, 64ul, 127ul, 128ul, 129ul, 1000ul}) {
      fill_random(buf, n, n + 1);
      ASSERT_EQ(0, libd_trdma_write(rig.t, n, 7, buf)) << libd_last_error();
      std::memset(buf + 32768, 0, n);
      ASSERT_EQ(0, libd_trdma_read(rig.t, n, 7, buf + 32768)) << libd_last_error();
      ASSERT_EQ(0, memcmp(buf, buf + 32768, n)) << n;
    }
  }
}

TEST(Verbs, RevokeCutsTheClientOffAtOnce) {
  NEED_VERBS();
  for (const char *mw : {"1", "0"}) {
    SCOPED_TRACE(std::string("mw=") + mw);
    auto rig = make_rig(std::string(mw) == "1" ? "verbs" : "verbs_nomw", 1 << 16);
    char *buf = nullptr;
    ASSERT_EQ(0, libd_trdma_reg(rig.t, 4096, reinterpret_cast<void **>(&buf)));
    ASSERT_EQ(0, libd_trdma_write(rig.t, 8, 0, buf)) << libd_last_error();
    ASSERT_EQ(0, rig.server->revoke(rig.grant.id));
    ASSERT_EQ(LIBD_STATE_ERROR, libd_transport_wait_state(rig.t, LIBD_STATE_ERROR, 5000)) << "the client must notice the revoke";
    EXPECT_NE(0, libd_trdma_read(rig.t, 8, 0, buf));
    EXPECT_EQ(-EACCES, libd_transport_recover(rig.t)) << libd_last_error();
  }
}

// A queue pair pointed past its window (or at another client's key) gets a remote access error
// from the device itself: the key is scoped by the server, not only by our library.
TEST(Verbs, TheDeviceEnforcesTheKeysScope) {
  NEED_VERBS();
  for (const char *mw : {"1", "0"})
  for (auto setup : {ibv::Setup::kOob, ibv::Setup::kCm}) {
    SCOPED_TRACE(std::string("mw=") + mw + (setup == ibv::Setup::kCm ? " via rdma_cm" : " via the record exchange"));
    std::shared_ptr<ibv::Device> dev;
    ASSERT_EQ(0, ibv::Device::open(libd::Params(), &dev)) << libd_last_error();
    // rdma_cm needs an address on the device's network (it finds no route over loopback).
    std::string host = setup == ibv::Setup::kCm ? dev->ipv4() : "127.0.0.1";
    ASSERT_FALSE(host.empty()) << dev->describe() << " has no IPv4 GID";
    libd::MemoryServer server;
    libd::Params p;
    p.set("mw", mw);
    ASSERT_EQ(0, server.add_element("e1", 1 << 16));
    ASSERT_EQ(0, server.enable_verbs(p)) << libd_last_error();
    uint16_t port;
    ASSERT_EQ(0, server.listen_tcp(host, 0, &port));
    libd::Grant a, b;
    a.element = b.element = "e1";
    a.client = "A", b.client = "B";
    a.offset = 4096, a.length = 4096, a.rights = LIBD_RIGHT_READ;
    b.offset = 8192, b.length = 4096, b.rights = 3;
    ASSERT_EQ(0, server.grant(&a));
    ASSERT_EQ(0, server.grant(&b));

    ibv::QpDriver::Config cfg;
    auto connect = [&](const libd::Grant &g, ibv::Connected *c) {
      return ibv::connect_driver(dev, cfg, host, std::to_string(port), {g.id, g.secret, g.client},
                                   setup, Deadline::after_ms(5000), nullptr, c);
    };
    ibv::Connected ca, cb;
    ASSERT_EQ(0, connect(a, &ca)) << libd_last_error();
    ASSERT_EQ(0, connect(b, &cb)) << libd_last_error();
    EXPECT_EQ(std::string(mw) == "1", bool(ca.peer.flags & ibv::kRecordFlagMemoryWindow));
    EXPECT_EQ(setup == ibv::Setup::kCm, ca.via_cm) << ca.cm_skipped;
    void *mem = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    std::shared_ptr<ibv::Mr> mr;
    ASSERT_EQ(0, dev->mrs().acquire(mem, 8192, IBV_ACCESS_LOCAL_WRITE, &mr));
    auto stats = std::make_shared<libd::Stats>();
    auto op_on = [&](ibv::QpDriver &e, OpKind k, uint64_t raddr) {
      auto op = std::make_shared<Op>(k, std::vector<Segment>{{64, raddr, static_cast<char *>(mem)}},
                                     Deadline::after_ms(5000), stats);
      e.set_local(mr);
      e.post(op);
      op->wait_until(Clock::now() + std::chrono::seconds(6));
      return op->status();
    };
    // Inside the grant: fine.
    ASSERT_EQ(0, op_on(*ca.driver, OpKind::Read, 4096));
    // A's key, aimed 4 KiB past A's range (into B's): refused by the device.
    ca.driver->set_remote(4096, ca.peer.addr + 4096, ca.peer.rkey, false);
    EXPECT_EQ(-EACCES, op_on(*ca.driver, OpKind::Read, 4096));
    // A read-only key refuses a write.
    ibv::Connected ca2;
    ASSERT_EQ(0, connect(a, &ca2));
    EXPECT_EQ(-EACCES, op_on(*ca2.driver, OpKind::Write, 4096));
    if (std::string(mw) == "1") {
      // B's key on A's queue pair: a type-2 window answers only its own queue pair.
      ibv::Connected ca3;
      ASSERT_EQ(0, connect(a, &ca3));
      ca3.driver->set_remote(8192, cb.peer.addr, cb.peer.rkey, false);
      EXPECT_EQ(-EACCES, op_on(*ca3.driver, OpKind::Read, 8192));
      ca3.driver->close(-ECONNABORTED, "test over");
    }
    for (auto *c : {&ca, &ca2, &cb}) c->driver->close(-ECONNABORTED, "test over");
    mr.reset();
    munmap(mem, 8192);
  }
}

TEST(Verbs, ACancelledOperationResetsTheQueuePairAndRecoverRebuildsIt) {
  NEED_VERBS();
  auto rig = make_rig("verbs", 32 << 20);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 32 << 20, reinterpret_cast<void **>(&buf)));
  libd_op *op;
  ASSERT_EQ(0, libd_trdma_write_async(rig.t, 32 << 20, 0, buf, &op)) << libd_last_error();
  int rc = libd_op_cancel(op);
  libd_op_free(op);
  if (rc == -ECANCELED) {
    ASSERT_EQ(LIBD_STATE_ERROR, libd_transport_wait_state(rig.t, LIBD_STATE_ERROR, 5000));
    EXPECT_NE(std::string::npos, test::transport_error(rig.t).find("cancelled"));
  } else {
    ASSERT_EQ(0, rc) << "the write finished before the cancel";
  }
  RecoverAndRoundTrip(rig.t, buf, 1);
}

TEST(Verbs, AStoppedServerMovesTheClientToError) {
  NEED_VERBS();
  auto rig = make_rig("verbs", 1 << 16);
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 4096, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_write(rig.t, 8, 0, buf)) << libd_last_error();
  rig.server->stop();
  ASSERT_EQ(LIBD_STATE_ERROR, libd_transport_wait_state(rig.t, LIBD_STATE_ERROR, 5000));
  EXPECT_NE(std::string::npos, test::transport_error(rig.t).find("closed the connection"));
  EXPECT_NE(0, libd_trdma_read(rig.t, 8, 0, buf));
  EXPECT_NE(0, libd_transport_recover(rig.t)) << "nothing listens any more";
}

// rdma_cm set-up: a request whose ticket was not handed out on an authenticated control
// connection is rejected with the reason; set-up=auto falls back to the record exchange where
// rdma_cm has no route (loopback), and set-up=cm says why it cannot.
TEST(Verbs, RdmaCmRejectsAForgedTicket) {
  NEED_VERBS();
  std::shared_ptr<ibv::Device> dev;
  ASSERT_EQ(0, ibv::Device::open(libd::Params(), &dev)) << libd_last_error();
  std::string host = dev->ipv4();
  ASSERT_FALSE(host.empty()) << dev->describe();
  libd::MemoryServer server;
  ASSERT_EQ(0, server.add_element("e1", 1 << 16));
  ASSERT_EQ(0, server.enable_verbs(libd::Params())) << libd_last_error();
  uint16_t port;
  ASSERT_EQ(0, server.listen_tcp(host, 0, &port));
  ASSERT_NE(0, server.cm_port()) << server.verbs_description();
  std::shared_ptr<ibv::QpDriver> driver;
  ASSERT_EQ(0, ibv::QpDriver::create(dev, ibv::QpDriver::Config(), nullptr, &driver));
  std::unique_ptr<ibv::CmLink> link;
  ibv::Record peer;
  ibv::CmStage stage;
  int rc = ibv::cm_connect(*dev, driver->qp(), host, server.cm_port(), std::string(ibv::kTicketSize, 'x'),
                             Deadline::after_ms(5000), &link, &peer, &stage);
  EXPECT_EQ(-ECONNREFUSED, rc);
  EXPECT_EQ(ibv::CmStage::kConnect, stage);
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("unknown or spent ticket")) << libd_last_error();

  // The server is unharmed: a real client still connects through rdma_cm.
  libd::Grant g;
  g.element = "e1", g.client = "A", g.length = 4096, g.rights = 3;
  ASSERT_EQ(0, server.grant(&g));
  ibv::Connected c;
  ASSERT_EQ(0, ibv::connect_driver(dev, ibv::QpDriver::Config(), host, std::to_string(port), {g.id, g.secret, g.client},
                                     ibv::Setup::kCm, Deadline::after_ms(5000), nullptr, &c))
      << libd_last_error();
  EXPECT_TRUE(c.via_cm);
  c.driver->close(-ECONNABORTED, "test over");
}

TEST(Verbs, AutoSetupFallsBackWhereRdmaCmCannotGo) {
  NEED_VERBS();
  std::shared_ptr<ibv::Device> dev;
  ASSERT_EQ(0, ibv::Device::open(libd::Params(), &dev)) << libd_last_error();
  for (const char *cm : {"1", "0"}) {
    SCOPED_TRACE(std::string("server cm=") + cm);
    libd::MemoryServer server;
    libd::Params p;
    p.set("cm", cm);
    ASSERT_EQ(0, server.add_element("e1", 1 << 16));
    ASSERT_EQ(0, server.enable_verbs(p)) << libd_last_error();
    uint16_t port;
    ASSERT_EQ(0, server.listen_tcp("127.0.0.1", 0, &port));
    libd::Grant g;
    g.element = "e1", g.client = "A", g.length = 4096, g.rights = 3;
    ASSERT_EQ(0, server.grant(&g));
    auto connect = [&](ibv::Setup setup, ibv::Connected *c) {
      return ibv::connect_driver(dev, ibv::QpDriver::Config(), "127.0.0.1", std::to_string(port),
                                   {g.id, g.secret, g.client}, setup, Deadline::after_ms(5000), nullptr, c);
    };
    ibv::Connected c;
    ASSERT_EQ(0, connect(ibv::Setup::kAuto, &c)) << libd_last_error();
    EXPECT_FALSE(c.via_cm);
    EXPECT_FALSE(c.cm_skipped.empty());
    if (std::string(cm) == "0") {
      EXPECT_NE(std::string::npos, c.cm_skipped.find("cm,0")) << c.cm_skipped;
    }
    c.driver->close(-ECONNABORTED, "test over");
    ibv::Connected forced;
    EXPECT_NE(0, connect(ibv::Setup::kCm, &forced));
    EXPECT_NE(std::string::npos, std::string(libd_last_error()).find(std::string(cm) == "0" ? "offers no rdma_cm" : "rdma_cm to 127.0.0.1"))
        << libd_last_error();
  }
}

// The registration cache: a second transport registering the same buffer costs nothing, and a
// larger buffer mapped at an address that held a smaller registered one gets a fresh one.
TEST(Verbs, RegistrationCacheIsRangeAware) {
  NEED_VERBS();
  std::shared_ptr<ibv::Device> dev;
  ASSERT_EQ(0, ibv::Device::open(libd::Params(), &dev)) << libd_last_error();
  auto rig1 = make_rig("verbs", 1 << 20);
  auto rig2 = make_rig("verbs", 1 << 20);
  ASSERT_EQ(0, libd_transport_connect(rig1.t)) << libd_last_error();
  ASSERT_EQ(0, libd_transport_connect(rig2.t)) << libd_last_error();
  void *buf = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  auto before = dev->mrs().counters();
  ASSERT_EQ(0, libd_trdma_reg(rig1.t, 4096, &buf));
  ASSERT_EQ(0, libd_trdma_reg(rig2.t, 4096, &buf));
  auto after = dev->mrs().counters();
  EXPECT_EQ(before.misses + 1, after.misses);
  EXPECT_EQ(before.hits + 1, after.hits) << "the second registration of the same buffer is a cache hit";
  // Free the buffer (both transports move off it), map a larger one at the same address.
  void *other = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig1.t, 4096, &other));
  other = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig2.t, 4096, &other));
  munmap(buf, 1 << 16);
  void *again = mmap(buf, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
  ASSERT_EQ(buf, again);
  ASSERT_EQ(0, libd_trdma_reg(rig1.t, 1 << 16, &again));
  fill_random(static_cast<char *>(again), 1 << 16, 3);
  ASSERT_EQ(0, libd_trdma_write(rig1.t, 1 << 16, 0, again)) << libd_last_error();
  std::vector<char> expect(static_cast<char *>(again), static_cast<char *>(again) + (1 << 16));
  memset(again, 0, 1 << 16);
  ASSERT_EQ(0, libd_trdma_read(rig1.t, 1 << 16, 0, again)) << libd_last_error();
  EXPECT_EQ(0, memcmp(expect.data(), again, 1 << 16)) << "data must land in the new pages, not stale ones";
  auto end = dev->mrs().counters();
  EXPECT_EQ(after.misses + 3, end.misses) << "two fresh buffers and the larger one were each registered";
  munmap(again, 1 << 16);
}
