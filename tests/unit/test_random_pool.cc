// The pool of random bytes grants and nonces are made from (proto/random_pool.h).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <atomic>
#include <thread>
#include <vector>

#include "proto/auth.h"
#include "proto/random_pool.h"

using namespace libd::proto;

TEST(RandomPool, HandsOutFreshBytesAcrossRefills) {
  // Several pages' worth of 40-byte slices (a grant's): none repeats, and the bytes are spread
  // (each value turns up), so no refill hands out the same page or a zeroed one.
  std::set<std::string> seen;
  size_t counts[256] = {};
  for (int i = 0; i < 1000; i++) {
    std::string s(40, '\0');
    ASSERT_TRUE(take_pooled_random(s.data(), s.size()));
    EXPECT_TRUE(seen.insert(s).second) << "slice " << i << " repeated";
    for (unsigned char c : s) counts[c]++;
  }
  for (int v = 0; v < 256; v++) EXPECT_GT(counts[v], 0u) << "byte value " << v << " never came out of 40000";
}

TEST(RandomPool, SaysNoToLargeRequestsAndRandomBytesStillServesThem) {
  std::string big(kRandomPoolSlice + 1, '\x5a');
  EXPECT_FALSE(take_pooled_random(big.data(), big.size()));
  EXPECT_EQ(big, std::string(kRandomPoolSlice + 1, '\x5a')) << "left untouched";
  std::string a = random_bytes(4096), b = random_bytes(4096);  // the kernel's, directly
  EXPECT_EQ(a.size(), 4096u);
  EXPECT_NE(a, b);
}

TEST(RandomPool, AForkedChildNeverHandsOutItsParentsBytes) {
  std::string before(32, '\0');
  ASSERT_TRUE(take_pooled_random(before.data(), before.size()));  // the pool is filled now
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(fds[0]);
    std::string s(32 * 8, '\0');
    bool ok = true;
    for (int i = 0; i < 8; i++) ok = take_pooled_random(&s[size_t(i) * 32], 32) && ok;
    ssize_t w = ok ? write(fds[1], s.data(), s.size()) : -1;
    _exit(w == ssize_t(s.size()) ? 0 : 1);
  }
  close(fds[1]);
  std::string child(32 * 8, '\0');
  size_t got = 0;
  while (got < child.size()) {
    ssize_t r = read(fds[0], &child[got], child.size() - got);
    ASSERT_GT(r, 0);
    got += size_t(r);
  }
  close(fds[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The parent's next slices: what a child sharing the page would have handed out as well.
  std::string mine(32 * 8, '\0');
  for (int i = 0; i < 8; i++) ASSERT_TRUE(take_pooled_random(&mine[size_t(i) * 32], 32));
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 8; j++)
      EXPECT_NE(child.substr(size_t(i) * 32, 32), mine.substr(size_t(j) * 32, 32)) << "child slice " << i;
}

TEST(RandomPool, AForkWhileAnotherThreadTakesBytesLeavesTheChildAPoolItCanUse) {
  // A thread of the parent may hold the pool's lock at the fork: the child's pool (wiped) must
  // not be locked for ever.
  std::atomic<bool> stop{false};
  std::thread taker([&] {
    char b[40];
    while (!stop.load()) take_pooled_random(b, sizeof b);
  });
  for (int round = 0; round < 20; round++) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(10);  // a child stuck on the lock dies of SIGALRM: the test fails, not hangs
      char b[40];
      _exit(take_pooled_random(b, sizeof b) ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "round " << round << " status " << status;
  }
  stop = true;
  taker.join();
}
