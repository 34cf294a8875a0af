// shm over a memory element's pages: libd_trdma_map maps them into the caller to read (and, under
// a writable grant, write) in place, and transports that move bytes on request refuse it; large
// writes reach the pages through the element's descriptor the first time and through the mapping
// after.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "harness.h"

TEST(ShmPages, AShmMappingShowsTheElementAndOutlivesTheTransport) {
  auto rig = test::make_rig("shm", 1 << 20, LIBD_RIGHT_READ | LIBD_RIGHT_WRITE);
  std::vector<char> src(4096);
  test::fill_random(src.data(), src.size(), 1);
  void *buf = src.data();
  ASSERT_EQ(0, libd_trdma_reg(rig.t, src.size(), &buf)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_write(rig.t, src.size(), 8192, src.data())) << libd_last_error();
  void *addr = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(0, libd_trdma_map(rig.t, &addr, &size)) << libd_last_error();
  ASSERT_EQ(uint64_t(1 << 20), size);
  const char *m = static_cast<const char *>(addr);
  EXPECT_EQ(0, memcmp(m + 8192, src.data(), src.size())) << "the mapping shows what the transport wrote";
  // It is the element's pages, not a copy: a later write through the transport shows, and a
  // write through the mapping (a writable grant) is what the next read finds.
  src[0] ^= 1;
  ASSERT_EQ(0, libd_trdma_write(rig.t, 1, 8192, src.data())) << libd_last_error();
  EXPECT_EQ(src[0], m[8192]);
  static_cast<char *>(addr)[100] = 42;
  char back = 0;
  void *into = &back;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 1, &into)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_read(rig.t, 1, 100, &back)) << libd_last_error();
  EXPECT_EQ(42, back);
  // The caller's mapping stays valid after the transport is gone.
  ASSERT_EQ(0, libd_transport_terminate(rig.t));
  EXPECT_EQ(src[0], m[8192]);
  EXPECT_EQ(0, munmap(addr, size));
}

TEST(ShmPages, AReadOnlyGrantMapsReadOnlyMemory) {
  auto rig = test::make_rig("shm", 1 << 16, LIBD_RIGHT_READ);
  void *addr = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(0, libd_trdma_map(rig.t, &addr, &size)) << libd_last_error();
  // The kernel itself refuses write access: the descriptor behind the pages is read-only.
  EXPECT_NE(0, mprotect(addr, size, PROT_READ | PROT_WRITE));
  EXPECT_EQ(EACCES, errno);
  EXPECT_EQ(0, munmap(addr, size));
}

TEST(ShmPages, AWriteOnlyGrantMapsNothing) {
  auto rig = test::make_rig("shm", 1 << 16, LIBD_RIGHT_WRITE);
  void *addr = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(-EACCES, libd_trdma_map(rig.t, &addr, &size)) << "a holder that may not read must not see the pages";
}

TEST(ShmPages, TransportsThatMoveBytesOnRequestRefuseAndSayWhy) {
  auto rig = test::make_rig("tcp", 1 << 16);
  void *addr = nullptr;
  uint64_t size = 0;
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_map(rig.t, &addr, &size));
  EXPECT_NE(std::string(libd_last_error()).find("read/write"), std::string::npos) << libd_last_error();
  EXPECT_EQ(-EINVAL, libd_trdma_map(rig.t, nullptr, &size));
}

TEST(ShmPages, LargeWritesLandWholeTheFirstTimeAndAfter) {
  constexpr size_t kSize = 8 << 20;
  auto rig = test::make_rig("shm", kSize);
  std::vector<char> a(3 << 20), b(3 << 20), back(3 << 20);
  test::fill_random(a.data(), a.size(), 3);
  test::fill_random(b.data(), b.size(), 4);
  libd_range mine[3] = {{a.data(), a.size()}, {b.data(), b.size()}, {back.data(), back.size()}};
  ASSERT_EQ(0, libd_trdma_reg_ranges(rig.t, mine, 3)) << libd_last_error();
  const uint64_t at = (1 << 20) + 5;  // not page-aligned
  // The first time through the element's descriptor, the second through the mapping, the third
  // through the mapping with its pages in place: each lands whole.
  for (const std::vector<char> *src : {&a, &b, &a}) {
    ASSERT_EQ(0, libd_trdma_write(rig.t, src->size(), at, src->data())) << libd_last_error();
    ASSERT_EQ(0, libd_trdma_read(rig.t, back.size(), at, back.data())) << libd_last_error();
    ASSERT_EQ(0, memcmp(back.data(), src->data(), back.size()));
  }
  // Another holder, mapping the element's pages, finds it there and nothing around it.
  libd::Grant g;
  g.element = "e1";
  g.client = "client-1";
  g.rights = LIBD_RIGHT_READ;
  ASSERT_EQ(0, rig.server->grant(&g)) << libd_last_error();
  std::string durl = "other;shm;" + rig.server->client_config(g);
  ASSERT_EQ(0, libd_action_add_transport(rig.action.get(), durl.c_str())) << libd_last_error();
  void *addr = nullptr;
  uint64_t size = 0;
  ASSERT_EQ(0, libd_trdma_map(libd_action_get_transport(rig.action.get(), "other"), &addr, &size)) << libd_last_error();
  const char *element = static_cast<const char *>(addr);
  EXPECT_EQ(0, memcmp(element + at, a.data(), a.size()));
  EXPECT_EQ(0, element[at - 1]) << "nothing before the range was written";
  EXPECT_EQ(0, element[at + a.size()]) << "nothing after it";
  munmap(addr, size);
}

TEST(ShmPages, LargeWritesSideBySideEachLandWhole) {
  // Writes that share a part of the element at their edges (a stream of chunks with a header
  // between them): each lands whole whichever way it goes.
  constexpr size_t kChunk = (300 << 10) + 3, kStride = kChunk + 4096 + 8;
  auto rig = test::make_rig("shm", 16 * kStride);
  std::vector<char> chunks(16 * kChunk), back(16 * kChunk);
  test::fill_random(chunks.data(), chunks.size(), 5);
  libd_range mine[2] = {{chunks.data(), chunks.size()}, {back.data(), back.size()}};
  ASSERT_EQ(0, libd_trdma_reg_ranges(rig.t, mine, 2)) << libd_last_error();
  for (size_t c = 0; c < 16; c++)
    ASSERT_EQ(0, libd_trdma_write(rig.t, kChunk, c * kStride + 8, chunks.data() + c * kChunk)) << libd_last_error();
  for (size_t c = 0; c < 16; c++) {
    ASSERT_EQ(0, libd_trdma_read(rig.t, kChunk, c * kStride + 8, back.data() + c * kChunk)) << libd_last_error();
    ASSERT_EQ(0, memcmp(back.data() + c * kChunk, chunks.data() + c * kChunk, kChunk)) << "chunk " << c;
  }
}
