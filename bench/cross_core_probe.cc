// How dear it is, right now, to hand memory from one core to another: two threads, pinned to
// two different CPUs, pass a 64 KiB buffer back and forth (each writes it whole, the other reads
// it whole), and the median round trip is printed in microseconds.
//
//     libd-cross-core-probe [rounds]      (prints one number; "-" when fewer than two CPUs are allowed)
//
// bench/transfer.py runs it before every cell it measures. On the two-CPU virtual machine the
// benchmarks run on, it is about 5 µs most of the time and twice that in spells of seconds to
// minutes, the host's doing (nothing else runs in the machine then; from inside, which of the
// host's cores the two virtual CPUs sit on cannot be seen), and every transfer between two
// processes that run on different CPUs and poll slows with it: the probe tells a slow round from
// a slow API. No libd code is in it.
#include <sched.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr size_t kBytes = 64 * 1024;
constexpr int kWarmup = 20;

// Whose turn it is to touch the buffer (0: the first thread, 1: the second; 2: stop). Its own
// cache line, away from the buffer.
alignas(64) std::atomic<int> turn{0};

bool pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set) == 0;
}

int wait_for(int who) {
  int t;
  while ((t = turn.load(std::memory_order_acquire)) != who && t != 2) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  return t;
}

}  // namespace

int main(int argc, char **argv) {
  int rounds = argc > 1 ? std::atoi(argv[1]) : 200;
  if (rounds < 1 || rounds > 1000000) {
    std::fprintf(stderr, "usage: %s [rounds 1..1000000]\n", argv[0]);
    return 2;
  }
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 1;
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE && cpus.size() < 2; c++)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  if (cpus.size() < 2) {
    std::puts("-");
    return 0;
  }
  // Each thread writes the shared buffer whole and reads the other's writing into a buffer of
  // its own: the bytes cross between the two cores' caches twice a round trip.
  std::vector<unsigned char> shared(kBytes, 1), mine(kBytes), theirs(kBytes);
  std::thread other([&] {
    pin_to(cpus[1]);
    for (unsigned char v = 0; wait_for(1) == 1; v++) {
      std::memcpy(theirs.data(), shared.data(), kBytes);
      std::memset(shared.data(), v, kBytes);
      turn.store(0, std::memory_order_release);
    }
  });
  pin_to(cpus[0]);
  std::vector<double> us;
  us.reserve(rounds);
  for (int i = 0; i < kWarmup + rounds; i++) {
    auto t0 = std::chrono::steady_clock::now();
    std::memset(shared.data(), i, kBytes);
    turn.store(1, std::memory_order_release);
    wait_for(0);
    std::memcpy(mine.data(), shared.data(), kBytes);
    auto t1 = std::chrono::steady_clock::now();
    if (i >= kWarmup) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  turn.store(2, std::memory_order_release);
  other.join();
  std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
  std::printf("%.1f\n", us[us.size() / 2]);
  return 0;
}
