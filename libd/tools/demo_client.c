/* libd-demo-client: the smallest useful libd program, in plain C against libd.h only.
 * Connects to a memory element with the configuration the control plane relayed, writes a
 * pattern, reads it back, verifies it and prints the bandwidth of each direction.
 *
 *   libd-demo-client IMPL CONFIG [SIZE_MIB] [ROUNDS]     e.g. libd-demo-client tcp "host,...;secret,..."
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "libd.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int check(int rc, const char *what) {
  if (rc < 0) fprintf(stderr, "libd-demo-client: %s failed: %s (%s)\n", what, libd_last_error(), libd_strerror(rc));
  return rc;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: libd-demo-client IMPL CONFIG [SIZE_MIB] [ROUNDS]\n");
    return 2;
  }
  const char *impl = argv[1], *config = argv[2];
  size_t size = (size_t)(argc > 3 ? atol(argv[3]) : 64) << 20;
  int rounds = argc > 4 ? atoi(argv[4]) : 5;
  const char *aid = getenv("LIBD_ACTION_ID") ? getenv("LIBD_ACTION_ID") : "demo-client";

  libd_action *action = libd_action_init(aid, 0, NULL);
  if (!action) return check(-1, "libd_action_init"), 1;
  char durl[256];
  snprintf(durl, sizeof durl, "mem1;%s", impl);
  if (check(libd_action_add_transport(action, durl), "add_transport") < 0) return 1;
  if (check(libd_action_config_transport(action, "mem1", config), "config_transport") < 0) return 1;
  libd_transport *t = libd_action_get_transport(action, "mem1");

  void *buf = NULL;
  if (check(libd_trdma_reg(t, 2 * size, &buf), "reg") < 0) return 1;
  unsigned char *src = buf, *dst = (unsigned char *)buf + size;
  uint64_t x = 88172645463325252ull; /* xorshift: cheap, not constant */
  for (size_t i = 0; i < size; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    src[i] = (unsigned char)x;
  }
  double wbest = 0, rbest = 0;
  for (int r = 0; r < rounds; r++) {
    double t0 = now_s();
    if (check(libd_trdma_write(t, size, 0, src), "write") < 0) return 1;
    double t1 = now_s();
    memset(dst, 0, size);
    double t2 = now_s();
    if (check(libd_trdma_read(t, size, 0, dst), "read") < 0) return 1;
    double t3 = now_s();
    if (memcmp(src, dst, size) != 0) {
      fprintf(stderr, "libd-demo-client: data read back differs from data written\n");
      return 1;
    }
    if (size / (t1 - t0) > wbest) wbest = size / (t1 - t0);
    if (size / (t3 - t2) > rbest) rbest = size / (t3 - t2);
  }
  printf("%-4s %4zu MiB x %d verified   write %6.2f GB/s   read %6.2f GB/s\n", impl, size >> 20, rounds,
         wbest / 1e9, rbest / 1e9);
  libd_action_free(action);
  return 0;
}
