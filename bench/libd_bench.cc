// libd-bench: measures a libd transport through the public C API, and the two local baselines it
// is judged against — memcpy of the same access pattern, and a raw loopback TCP ping-pong — so
// that bench/run can print ratios from one run on one machine. Output: one JSON object a line.
//
//   libd-bench transport IMPL CONFIG [--sizes 64,4096,...] [--inflight 1,16] [--budget-ms 300]
//                                    [--ops read|write|both] [--count N]
//     CONFIG "-": the transport's configuration is the first line of standard input (it carries
//     the grant's secret, which has no place on a command line, where every user of the host sees it)
//   libd-bench memcpy [--sizes ...]
//   libd-bench pingpong [--busy-poll] [--size 64]
//
// Every figure is a median: latency is the median of per-operation times; bandwidth is the median
// of several timed batches.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

#include "libd.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Per-operation timing. A clock read through the kernel costs about 4 us in the Soft-RoCE guest
// (its only clocksources are an emulated HPET and the ACPI timer), a tenth of an operation there;
// the cycle counter costs next to nothing and is what perftest times each operation with. Ticks
// are turned into time with a rate measured against the steady clock over the same series.
uint64_t ticks() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count());
#endif
}

struct TickRate {
  Clock::time_point t0 = Clock::now();
  uint64_t c0 = ticks();
  // Microseconds per tick over the series so far.
  double us_per_tick() const {
    uint64_t dc = ticks() - c0;
    return dc ? seconds_since(t0) * 1e6 / double(dc) : 0;
  }
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::vector<uint64_t> parse_list(const std::string &s) {
  std::vector<uint64_t> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(',', start);
    out.push_back(std::stoull(s.substr(start, end - start)));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

// CPU time of the whole process (every thread), user and system, in microseconds.
struct CpuTime {
  double user_us = 0, sys_us = 0, wall_us = 0;
  static CpuTime now() {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    auto us = [](const timeval &tv) { return double(tv.tv_sec) * 1e6 + double(tv.tv_usec); };
    return CpuTime{us(ru.ru_utime), us(ru.ru_stime), seconds_since(Clock::time_point()) * 1e6};
  }
};

// cpu: the process's CPU time per operation over the timed part (where a slower transport spends
// it: in user space, or in the kernel's device path), or null for a peer that does not measure it.
void emit(const char *peer, const char *op, uint64_t size, int inflight, double gbps, double median_us,
          const CpuTime *cpu = nullptr, long ops = 0) {
  char extra[160] = "";
  if (cpu && ops > 0)
    snprintf(extra, sizeof extra, ", \"ops\": %ld, \"wall_us_per_op\": %.3f, \"user_us_per_op\": %.3f, \"sys_us_per_op\": %.3f",
             ops, cpu->wall_us / double(ops), cpu->user_us / double(ops), cpu->sys_us / double(ops));
  printf("{\"peer\": \"%s\", \"op\": \"%s\", \"size\": %llu, \"inflight\": %d, \"gbps\": %.6f, \"median_us\": %.3f%s}\n",
         peer, op, (unsigned long long)size, inflight, gbps, median_us, extra);
  fflush(stdout);
}

[[noreturn]] void die(const char *what, int rc) {
  fprintf(stderr, "libd-bench: %s: %s (%s)\n", what, libd_last_error(), libd_strerror(rc));
  exit(1);
}

// How many repetitions fit the budget, at least 3, at most `cap`.
int reps_for(double one_op_s, double budget_s, int cap) {
  int n = one_op_s > 0 ? int(budget_s / one_op_s) : cap;
  return std::max(3, std::min(n, cap));
}

constexpr uint64_t kSlotSpace = 256ull << 20;  // local buffer and remote space used for slots

// ---- libd transports ----

// --count: how many operations each timed series has (0: as many as fit the budget). For profiling
// a steady state of a known length.
long g_count = 0;

void bench_transport(const std::string &impl, const std::string &config, const std::vector<uint64_t> &sizes,
                     const std::vector<uint64_t> &inflights, double budget_s, const std::string &ops) {
  const char *aid = getenv("LIBD_ACTION_ID") ? getenv("LIBD_ACTION_ID") : "bench";
  libd_action *action = libd_action_init(aid, 0, nullptr);
  if (!action) die("action", -EINVAL);
  std::string durl = "mem;" + impl;
  if (int rc = libd_action_add_transport(action, durl.c_str())) die("add_transport", rc);
  if (int rc = libd_action_config_transport(action, "mem", config.c_str())) die("config_transport", rc);
  libd_transport *t = libd_action_get_transport(action, "mem");
  uint64_t remote = 0;
  if (int rc = libd_trdma_remote(t, &remote, nullptr)) die("connect", rc);
  char *buf = nullptr;
  // The space each run needs, rounded to 1 MiB: a registration far larger than what is touched
  // only costs set-up time (pinning, zeroing) here.
  uint64_t space = 0;
  for (uint64_t size : sizes)
    for (uint64_t want : inflights) space = std::max(space, size * std::max<uint64_t>(1, want));
  space = std::min(kSlotSpace, (space + (1 << 20) - 1) & ~uint64_t((1 << 20) - 1));
  if (int rc = libd_trdma_reg(t, space, reinterpret_cast<void **>(&buf))) die("reg", rc);
  memset(buf, 0x5a, space);  // touch every page before timing
  std::string peer = "scad-" + impl;

  for (uint64_t size : sizes) {
    for (uint64_t want : inflights) {
      int n = int(std::min<uint64_t>(want, std::max<uint64_t>(1, std::min(space, remote) / size)));
      if (n != int(want) && want != 1 && n == 1) continue;  // too big to have several in flight
      for (int is_read = 0; is_read < 2; is_read++) {
        if (ops != "both" && (ops == "read") != bool(is_read)) continue;
        // Warm-up: first touch of remote pages, connection set-up.
        for (int i = 0; i < n; i++) {
          int rc = is_read ? libd_trdma_read(t, size, uint64_t(i) * size, buf + uint64_t(i) * size)
                           : libd_trdma_write(t, size, uint64_t(i) * size, buf + uint64_t(i) * size);
          if (rc) die("warm-up", rc);
        }
        std::vector<double> lat_us, batch_gbps;
        auto t_start = Clock::now();
        CpuTime cpu0, cpu1;
        long timed_ops = 0;
        if (n == 1) {
          // One in flight: each operation timed on its own, and the median taken (perftest's
          // t_typical), so the figure is the usual operation's, not a mean pulled by the tail.
          auto t0 = Clock::now();
          for (int i = 0; i < 3; i++) {
            int rc = is_read ? libd_trdma_read(t, size, 0, buf) : libd_trdma_write(t, size, 0, buf);
            if (rc) die("op", rc);
          }
          int reps = g_count ? int(g_count) : reps_for(seconds_since(t0) / 3, budget_s, 20000);
          std::vector<uint64_t> took(size_t(reps), 0);
          TickRate rate;
          cpu0 = CpuTime::now();
          for (int i = 0; i < reps; i++) {
            uint64_t a = ticks();
            int rc = is_read ? libd_trdma_read(t, size, 0, buf) : libd_trdma_write(t, size, 0, buf);
            took[size_t(i)] = ticks() - a;
            if (rc) die("op", rc);
          }
          cpu1 = CpuTime::now();
          timed_ops = reps;
          double us = rate.us_per_tick();
          for (uint64_t c : took) {
            lat_us.push_back(double(c) * us);
            batch_gbps.push_back(double(size) / (double(c) * us * 1e-6) / 1e9);
          }
        } else {
          // Many in flight: a sliding window of n asynchronous operations — as soon as the oldest
          // completes, the next starts in its slot, as redis-benchmark's clients do. Like them
          // (they all use one key), every operation targets the same remote range, each from its
          // own local slot. Bandwidth is the median over 5 equal parts of the run; latency is
          // each operation's, from its start to its wait's return, in cycle-counter ticks.
          struct Slot { libd_op *op; uint64_t started; };
          std::vector<Slot> window(static_cast<size_t>(n), Slot{});
          std::vector<uint64_t> took;
          auto start = [&](int i) {
            uint64_t off = uint64_t(i) * size;
            window[size_t(i)].started = ticks();
            int rc = is_read ? libd_trdma_read_async(t, size, 0, buf + off, &window[size_t(i)].op)
                             : libd_trdma_write_async(t, size, 0, buf + off, &window[size_t(i)].op);
            if (rc) die("async op", rc);
          };
          auto finish = [&](int i) {
            if (int rc = libd_op_wait(window[size_t(i)].op, -1)) die("wait", rc);
            libd_op_free(window[size_t(i)].op);
            took.push_back(ticks() - window[size_t(i)].started);
          };
          for (int i = 0; i < n; i++) start(i);
          for (int i = 0; i < n; i++) finish(i);  // a first round to size the run
          double one = seconds_since(t_start) / n;
          took.clear();
          TickRate rate;
          long total = g_count ? std::max<long>(5L * n, g_count)
                               : std::max<long>(5L * n, std::min<long>(long(budget_s / std::max(one, 1e-7)), 200000));
          long part = std::max<long>(1, total / 5);
          cpu0 = CpuTime::now();
          for (int i = 0; i < n; i++) start(i);
          auto part_start = Clock::now();
          for (long k = 0; k < total; k++) {
            int i = int(k % n);
            finish(i);
            if (k + n < total) start(i);
            if ((k + 1) % part == 0) {
              batch_gbps.push_back(double(size) * double(part) / seconds_since(part_start) / 1e9);
              part_start = Clock::now();
            }
          }
          cpu1 = CpuTime::now();
          timed_ops = total;
          double us = rate.us_per_tick();
          for (uint64_t c : took) lat_us.push_back(double(c) * us);
        }
        CpuTime used{cpu1.user_us - cpu0.user_us, cpu1.sys_us - cpu0.sys_us, cpu1.wall_us - cpu0.wall_us};
        if (getenv("LIBD_BENCH_PERCENTILES") && !lat_us.empty()) {  // the shape of the latency distribution
          std::vector<double> v = lat_us;
          std::sort(v.begin(), v.end());
          auto at = [&](double p) { return v[std::min(v.size() - 1, size_t(p * double(v.size())))]; };
          fprintf(stderr, "latency us: min %.1f p10 %.1f p25 %.1f p50 %.1f p75 %.1f p90 %.1f p99 %.1f\n", v[0], at(0.1),
                  at(0.25), at(0.5), at(0.75), at(0.9), at(0.99));
        }
        emit(peer.c_str(), is_read ? "read" : "write", size, n, median(batch_gbps), median(lat_us), &used, timed_ops);
      }
    }
  }
  libd_action_free(action);
}

// ---- memcpy of the same pattern: local buffer <-> a separate region of the same size ----

void bench_memcpy(const std::vector<uint64_t> &sizes, double budget_s) {
  auto map = [](uint64_t n) {
    void *p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(p, 0x5a, n);
    return static_cast<char *>(p);
  };
  char *local = map(kSlotSpace), *region = map(kSlotSpace);
  for (uint64_t size : sizes) {
    for (int is_read = 0; is_read < 2; is_read++) {
      char *dst = is_read ? local : region, *src = is_read ? region : local;
      auto t0 = Clock::now();
      for (int i = 0; i < 3; i++) memcpy(dst, src, size);
      int reps = reps_for(seconds_since(t0) / 3, budget_s, 200000);
      std::vector<double> lat_us, gbps;
      for (int i = 0; i < reps; i++) {
        auto a = Clock::now();
        memcpy(dst, src, size);
        asm volatile("" ::"r"(dst) : "memory");  // the copy is not optimised away
        double s = seconds_since(a);
        lat_us.push_back(s * 1e6);
        gbps.push_back(double(size) / s / 1e9);
      }
      emit("memcpy", is_read ? "read" : "write", size, 1, median(gbps), median(lat_us));
    }
  }
}

// ---- raw loopback TCP ping-pong: the floor for a small remote read ----

bool io_exact(int fd, char *p, size_t n, bool sending, bool busy) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = sending ? send(fd, p + done, n - done, MSG_NOSIGNAL) : recv(fd, p + done, n - done, busy ? MSG_DONTWAIT : 0);
    if (r > 0) { done += size_t(r); continue; }
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    return false;
  }
  return true;
}

// The algorithm libd gives a same-host connection whose default is BBR (docs/transports.md), so that
// the raw baseline runs as libd's connections do. Where cubic cannot be set, the host's default.
void like_libd_on_one_host(int fd) {
  char name[16] = {};
  socklen_t len = sizeof name;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) == 0 && std::strncmp(name, "bbr", 3) == 0)
    setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "cubic", 5);
}

void bench_pingpong(bool busy, size_t size, double budget_s) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  like_libd_on_one_host(lfd);  // the connection it accepts inherits it
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(lfd, reinterpret_cast<sockaddr *>(&sa), sizeof sa);
  socklen_t len = sizeof sa;
  getsockname(lfd, reinterpret_cast<sockaddr *>(&sa), &len);
  listen(lfd, 1);
  int one = 1;
  std::thread server([&] {
    int fd = accept(lfd, nullptr, nullptr);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::vector<char> b(size);
    while (io_exact(fd, b.data(), size, false, busy) && io_exact(fd, b.data(), size, true, busy)) {}
    close(fd);
  });
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  like_libd_on_one_host(fd);
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0) { perror("connect"); exit(1); }
  std::vector<char> b(size, 'p');
  std::vector<double> lat;
  auto t0 = Clock::now();
  for (int i = 0; i < 200; i++) { io_exact(fd, b.data(), size, true, busy); io_exact(fd, b.data(), size, false, busy); }
  int reps = reps_for(seconds_since(t0) / 200, budget_s, 20000);
  CpuTime cpu0 = CpuTime::now();
  for (int i = 0; i < reps; i++) {
    auto a = Clock::now();
    io_exact(fd, b.data(), size, true, busy);
    io_exact(fd, b.data(), size, false, busy);
    lat.push_back(seconds_since(a) * 1e6);
  }
  CpuTime cpu1 = CpuTime::now();
  // Both ends run in this process: its CPU time is the client's and the server's together.
  CpuTime used{cpu1.user_us - cpu0.user_us, cpu1.sys_us - cpu0.sys_us, cpu1.wall_us - cpu0.wall_us};
  close(fd);
  server.join();
  close(lfd);
  double m = median(lat);
  emit(busy ? "tcp-pingpong-busypoll" : "tcp-pingpong", "roundtrip", size, 1, double(size) / (m / 1e6) / 1e9, m, &used,
       reps);
}

}  // namespace

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: libd-bench transport IMPL CONFIG|- | memcpy | pingpong [--busy-poll] [options]\n");
    return 2;
  }
  std::string mode = argv[1];
  std::vector<uint64_t> sizes = {64, 4096, 65536, 1 << 20, 16 << 20, 64 << 20}, inflights = {1, 16};
  double budget_s = 0.3;
  bool busy = false;
  size_t pp_size = 64;
  std::string ops = "both";
  std::vector<std::string> pos;
  for (int i = 2; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--sizes" && i + 1 < argc) sizes = parse_list(argv[++i]);
    else if (a == "--inflight" && i + 1 < argc) inflights = parse_list(argv[++i]);
    else if (a == "--budget-ms" && i + 1 < argc) budget_s = atof(argv[++i]) / 1000;
    else if (a == "--ops" && i + 1 < argc) ops = argv[++i];
    else if (a == "--count" && i + 1 < argc) g_count = atol(argv[++i]);
    else if (a == "--busy-poll") busy = true;
    else if (a == "--size" && i + 1 < argc) pp_size = size_t(atol(argv[++i]));
    else pos.push_back(a);
  }
  if (mode == "transport" && pos.size() == 2 && pos[1] == "-") {
    if (!std::getline(std::cin, pos[1]) || pos[1].empty()) {
      fprintf(stderr, "libd-bench: CONFIG is '-' but standard input has no configuration line\n");
      return 2;
    }
    if (pos[1].back() == '\r') pos[1].pop_back();
  }
  if (mode == "transport" && pos.size() == 2) bench_transport(pos[0], pos[1], sizes, inflights, budget_s, ops);
  else if (mode == "memcpy") bench_memcpy(sizes, budget_s);
  else if (mode == "pingpong") bench_pingpong(busy, pp_size, budget_s);
  else {
    fprintf(stderr, "libd-bench: unknown mode or missing arguments\n");
    return 2;
  }
  return 0;
}
