// libd-first-read-steps: the floor under a one-sided operation's transfer over tcp or shm. Each read
// is a new key's first and only: the transport made for it (over tcp on the process's shared
// connection to the owner's server, share,1; over shm the grant vouched for by the owner's grant
// table), the grant attached and the read sent in one write with the key let go
// of behind it (libd_trdma_read_async_last, as scad.rdma's and scad.tensor_transport's first
// transfer of a buffer make it), polled until the answer is in, and the transport freed. Timed
// step by step in libd's C API alone, so that the Python APIs' figures for the same step
// (bench/api_steps.py) can be set beside what libd itself needs.
//
//   libd-first-read-steps [--shm] [--write] [--reads N] [--size BYTES]  the steps, medians in µs
//       (--write: each key's first and only transfer writes, libd_trdma_write_async_last)
//   libd-first-read-steps --serve [--reads N] [--size BYTES]  only the owner: one configuration
//       line per grant on standard output, with the offset of its slice (offset,N), served until
//       standard input closes (for a Python peer's figures against the same server)
//
// The owner runs in a child process (a server thread that polls for a second after each request,
// as bench/transfer.py's plain-libd owner polls), lends one region and grants N slices of it, each
// to be read once. Nothing leaves 127.0.0.1.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "libd.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kWarmup = 200;
// The grants cycle over distinct slices of the lent region: up to 1000 of them, within 1 MiB, so
// that the bytes stay in the caches as an owner's lent array does (a region of 1000 64 KiB slices
// would measure memory, not libd).
uint64_t slices_for(uint64_t size) { return std::clamp<uint64_t>((1u << 20) / size, 1, 1000); }

long long now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

[[noreturn]] void die(const char *what) {
  fprintf(stderr, "libd-first-read-steps: %s: %s\n", what, libd_last_error());
  exit(1);
}

// The owner, in the child: serves one lent region, writes a grant's configuration a line each to
// `out`, then serves until `quit` closes.
// Over shm a grant must cover its whole element: each is on the whole region, and each read reads
// its slice of it.
int run_owner(int reads, uint64_t size, bool whole, FILE *out, int quit) {
  libd_action *a = libd_action_init("first-read-owner", 0, nullptr);
  std::string path = "/tmp/libd-first-read-" + std::to_string(getpid()) + ".sock";
  std::string durl = "srv;tcp_server;size,0;host,127.0.0.1;port,0;path," + path + ";busy_poll_us,1000000";
  if (!a || libd_action_add_transport(a, durl.c_str()) != 0) die("the owner's server");
  libd_transport *srv = libd_action_get_transport(a, "srv");
  if (libd_trdma_server_serve(srv) != 0) die("serve");
  const uint64_t slices = slices_for(size);
  std::vector<char> region(slices * size, 'x');
  if (libd_trdma_server_expose(srv, "region", region.data(), region.size()) != 0) die("expose");
  for (int i = 0; i < reads; i++) {
    libd_grant_spec spec = {"region", "*", (uint64_t(i) % slices) * size, size, LIBD_RIGHT_READ | LIBD_RIGHT_WRITE, 0};
    if (whole) spec.offset = 0, spec.length = region.size();
    char config[2048];
    if (libd_trdma_server_grant_ex(srv, &spec, config, sizeof config) <= 0) die("grant");
    fprintf(out, "%s\n", config);
  }
  fclose(out);
  char c;
  while (read(quit, &c, 1) > 0) {
  }
  libd_action_free(a);
  return 0;
}

// A peer's transport for one grant: the grant's configuration as the owner's server wrote it
// (where, and which key; tcp ignores the unix path in it), on the shared connection, polling
// while it waits.
constexpr const char *kTcpDurlHead = "d0;tcp;share,1;timeout_ms,30000;busy_poll_us,500;";
// Over shm: the grant checked in the owner's grant table, the bytes copied by process_vm_readv,
// on the shared connection (share,1), the owner's server not told (announce,0: scad.rdma's peers
// wait for no word from it).
constexpr const char *kShmDurlHead = "d0;shm;share,1;announce,0;timeout_ms,30000;";

double median_us(std::vector<long long> v) {
  std::nth_element(v.begin(), v.begin() + long(v.size() / 2), v.end());
  return double(v[v.size() / 2]) / 1e3;
}

}  // namespace

int main(int argc, char **argv) {
  int reads = 3000;
  uint64_t size = 64;
  bool serve = false, shm = false, write = false;
  for (int i = 1; i < argc; i++) {
    std::string arg = argv[i];
    if (arg == "--serve") {
      serve = true;
    } else if (arg == "--shm") {
      shm = true;
    } else if (arg == "--write") {
      write = true;
    } else if (arg == "--reads" && i + 1 < argc) {
      reads = atoi(argv[++i]);
    } else if (arg == "--size" && i + 1 < argc) {
      size = strtoull(argv[++i], nullptr, 10);
    } else {
      fprintf(stderr, "usage: libd-first-read-steps [--serve] [--shm] [--write] [--reads N] [--size BYTES]\n");
      return 2;
    }
  }
  if (reads <= kWarmup || reads > 100000 || size == 0 || size > (1u << 20)) {
    fprintf(stderr, "libd-first-read-steps: --reads must be %d..100000 and --size 1..1048576\n", kWarmup + 1);
    return 2;
  }
  int configs[2], quit[2];
  if (pipe(configs) != 0 || pipe(quit) != 0) return 1;
  pid_t owner = fork();
  if (owner < 0) return 1;
  if (owner == 0) {
    close(configs[0]);
    close(quit[1]);
    return run_owner(reads, size, shm, fdopen(configs[1], "w"), quit[0]);
  }
  close(configs[1]);
  close(quit[0]);
  FILE *in = fdopen(configs[0], "r");
  std::vector<std::string> grants;
  char line[4096];
  while (fgets(line, sizeof line, in)) {
    line[strcspn(line, "\n")] = 0;
    grants.push_back(line);
  }
  fclose(in);
  int status = 0;
  if (int(grants.size()) != reads) {
    fprintf(stderr, "libd-first-read-steps: the owner made %zu grants of %d\n", grants.size(), reads);
    status = 1;
  } else if (serve) {
    // Each line with the offset its slice starts at, so that the reader need not know how the
    // grants cycle over the region.
    for (size_t i = 0; i < grants.size(); i++)
      printf("%s;offset,%llu\n", grants[i].c_str(), (unsigned long long)((i % slices_for(size)) * size));
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
  } else {
    const char *names[] = {"the transport made (action, durl)", "local memory registered",
                           write ? "grant attached, write sent, key let go" : "grant attached, read sent, key let go",
                           "the answer (polled)",
                           "operation and transport freed"};
    constexpr int kSteps = 5;
    std::vector<long long> steps[kSteps];
    std::vector<char> local(size);
    int failed = 0;
    libd_action *keeper = nullptr;
    for (int i = 0; i < reads; i++) {
      std::string durl = (shm ? kShmDurlHead : kTcpDurlHead) + grants[size_t(i)];
      long long t[kSteps + 1];
      t[0] = now_ns();
      libd_action *a = libd_action_init("first-read-peer", 0, nullptr);
      if (!a || libd_action_add_transport(a, durl.c_str()) != 0) die("the peer's transport");
      libd_transport *tr = libd_action_get_transport(a, "d0");
      t[1] = now_ns();
      local[0] = write ? 'x' : 0;  // the lent bytes are 'x': a read must bring them
      void *buf = local.data();
      if (libd_trdma_reg(tr, size, &buf) != 0) die("reg");
      t[2] = now_ns();
      libd_op *op = nullptr;
      uint64_t at = (uint64_t(i) % slices_for(size)) * size;
      if ((write ? libd_trdma_write_async_last(tr, size, at, buf, &op) : libd_trdma_read_async_last(tr, size, at, buf, &op)) != 0)
        die(write ? "write" : "read");
      t[3] = now_ns();
      int rc;
      while ((rc = libd_op_poll(op)) == -EINPROGRESS) {
      }
      t[4] = now_ns();
      if (rc != 0 || local[0] != 'x') failed++;
      libd_op_free(op);
      // The first read's transport is kept: it holds the process's shared connection to the
      // owner's server open (as a scad.rdma peer's first buffer does), which later ones ride.
      if (i == 0)
        keeper = a;
      else
        libd_action_free(a);
      t[5] = now_ns();
      if (i >= kWarmup)
        for (int k = 0; k < kSteps; k++) steps[k].push_back(t[k + 1] - t[k]);
    }
    libd_action_free(keeper);
    printf("a new key's first %llu-byte %s over %s, median µs of %d:\n", (unsigned long long)size,
           write ? "write" : "read", shm ? "shm" : "tcp (share,1)", reads - kWarmup);
    double total = 0;
    for (int k = 0; k < kSteps; k++) {
      double us = median_us(steps[k]);
      total += us;
      printf("  %-42s %7.2f\n", names[k], us);
    }
    printf("  %-42s %7.2f\n", "sum of the medians", total);
    if (failed) {
      fprintf(stderr, "libd-first-read-steps: %d reads failed or brought the wrong bytes\n", failed);
      status = 1;
    }
  }
  close(quit[1]);
  waitpid(owner, nullptr, 0);
  return status;
}
