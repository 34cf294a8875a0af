// An element's pages had ahead of its writers (PagePrefetcher, libd_trdma_server_prefetch): all of
// them allocated, what was written before kept, a withdrawn element dropped wherever it waits,
// stop with work queued, and the C API's refusals.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "harness.h"
#include "libd.h"
#include "server/memory_server.h"
#include "server/page_prefetcher.h"

using test::make_action;

namespace {

uint64_t allocated(int fd) {
  struct stat st;
  EXPECT_EQ(0, fstat(fd, &st));
  return uint64_t(st.st_blocks) * 512;
}

int new_memfd(uint64_t size) {
  int fd = memfd_create("prefetch-test", MFD_CLOEXEC);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(0, ftruncate(fd, off_t(size)));
  return fd;
}

}  // namespace

TEST(PagePrefetcher, AllocatesEveryPageAndKeepsWhatWasWritten) {
  const uint64_t size = 3 * libd::PagePrefetcher::kChunk + 12345;  // not a whole number of chunks
  int fd = new_memfd(size);
  const char text[] = "written before the prefetch";
  ASSERT_EQ(ssize_t(sizeof text), pwrite(fd, text, sizeof text, off_t(libd::PagePrefetcher::kChunk + 7)));
  EXPECT_LT(allocated(fd), size);
  libd::PagePrefetcher p;
  ASSERT_EQ(0, p.add(dup(fd), size, std::make_shared<std::atomic<bool>>(false)));
  p.wait_idle();
  EXPECT_GE(allocated(fd), size);
  EXPECT_EQ(3 * libd::PagePrefetcher::kChunk + 12345, p.allocated_bytes());
  char back[sizeof text] = {};
  ASSERT_EQ(ssize_t(sizeof text), pread(fd, back, sizeof back, off_t(libd::PagePrefetcher::kChunk + 7)));
  EXPECT_STREQ(text, back);
  char zero[64], none[64] = {};
  ASSERT_EQ(ssize_t(sizeof zero), pread(fd, zero, sizeof zero, off_t(size - sizeof zero)));
  EXPECT_EQ(0, memcmp(zero, none, sizeof zero)) << "new pages read as zeros";
  close(fd);
}

TEST(PagePrefetcher, AWithdrawnElementIsDroppedWhereverItWaits) {
  const uint64_t chunk = libd::PagePrefetcher::kChunk;
  int first = new_memfd(2 * chunk), queued = new_memfd(8 * chunk), last = new_memfd(chunk);
  libd::PagePrefetcher p;
  p.hold(true);  // the order of work fixed: nothing runs until the withdrawal is in
  ASSERT_EQ(0, p.add(dup(first), 2 * chunk, std::make_shared<std::atomic<bool>>(false)));
  auto withdrawn = std::make_shared<std::atomic<bool>>(false);
  ASSERT_EQ(0, p.add(dup(queued), 8 * chunk, withdrawn));
  ASSERT_EQ(0, p.add(dup(last), chunk, std::make_shared<std::atomic<bool>>(false)));
  withdrawn->store(true);  // withdrawn behind another element's request
  p.hold(false);
  p.wait_idle();
  EXPECT_EQ(0u, allocated(queued));
  EXPECT_GE(allocated(first), 2 * chunk);
  EXPECT_GE(allocated(last), chunk);
  EXPECT_EQ(3 * chunk, p.allocated_bytes()) << "the requests around it were served";
  close(first);
  close(queued);
  close(last);
}

TEST(PagePrefetcher, StopDropsWhatIsQueuedAndRefusesMore) {
  libd::PagePrefetcher p;
  const uint64_t size = 4 * libd::PagePrefetcher::kChunk;
  int fd = new_memfd(size);
  p.hold(true);
  for (int i = 0; i < 4; i++) ASSERT_EQ(0, p.add(dup(fd), size, std::make_shared<std::atomic<bool>>(false)));
  p.stop();  // with four requests queued and none begun
  p.wait_idle();
  EXPECT_EQ(0u, p.allocated_bytes());
  EXPECT_EQ(0u, allocated(fd));
  EXPECT_EQ(-ESHUTDOWN, p.add(dup(fd), size, std::make_shared<std::atomic<bool>>(false)));
  p.stop();  // a second stop is harmless
  close(fd);
}

TEST(ServerPrefetch, TheCApiPrefetchesOwnElementsOnly) {
  auto action = make_action("prefetch-host");
  std::string durl = "pool;tcp_server;size,0;path," + test::unique_socket_path("prefetch");
  ASSERT_EQ(0, libd_action_add_transport(action.get(), durl.c_str())) << libd_last_error();
  libd_transport *server = libd_action_get_transport(action.get(), "pool");
  EXPECT_EQ(-ENOTCONN, libd_trdma_server_prefetch(server, "big"));
  ASSERT_EQ(0, libd_trdma_server_serve(server)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_server_add_element(server, "big", 16 << 20)) << libd_last_error();
  EXPECT_EQ(0, libd_trdma_server_prefetch(server, "big")) << libd_last_error();
  EXPECT_EQ(0, libd_trdma_server_prefetch(server, "big")) << "asking twice is harmless";
  libd_server_attr attr;
  ASSERT_EQ(0, libd_trdma_server_query(server, &attr));
  EXPECT_EQ(uint64_t(16) << 20, attr.used_bytes) << "prefetch takes no more than the element's size";
  EXPECT_EQ(-ENOENT, libd_trdma_server_prefetch(server, "nowhere"));
  EXPECT_NE(std::string(libd_last_error()).find("no element 'nowhere'"), std::string::npos) << libd_last_error();
  EXPECT_EQ(-EINVAL, libd_trdma_server_prefetch(server, ""));
  static char lent[4096];
  ASSERT_EQ(0, libd_trdma_server_expose(server, "lent", lent, sizeof lent)) << libd_last_error();
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_server_prefetch(server, "lent"));
  // Withdrawn while its pages are being had: nothing waits on it, nothing is left behind.
  ASSERT_EQ(0, libd_trdma_server_add_element(server, "gone", 256 << 20)) << libd_last_error();
  EXPECT_EQ(0, libd_trdma_server_prefetch(server, "gone"));
  EXPECT_EQ(0, libd_trdma_server_withdraw(server, "gone")) << libd_last_error();
  EXPECT_EQ(0, libd_trdma_server_withdraw(server, "lent")) << libd_last_error();
}
