// Core pieces of the operation path on their own: the I/O gate and the operation block cache.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include "core/io_gate.h"
#include "core/op_allocator.h"

using namespace std::chrono;
using libd::IoGate;

TEST(IoGate, ReadersShareAndAWriterExcludesThem) {
  IoGate gate;
  std::shared_lock<IoGate> r1(gate), r2(gate);  // two readers at once
  EXPECT_TRUE(r1.owns_lock() && r2.owns_lock());
  std::atomic<bool> writer_in{false};
  std::thread writer([&] {
    std::unique_lock<IoGate> w(gate);
    writer_in = true;
  });
  // Once the writer has announced itself new readers are refused; it still waits for both
  // readers inside.
  for (auto until = steady_clock::now() + seconds(10); steady_clock::now() < until; std::this_thread::yield()) {
    std::shared_lock<IoGate> probe(gate, std::try_to_lock);
    if (!probe.owns_lock()) break;
  }
  std::shared_lock<IoGate> refused(gate, std::try_to_lock);
  EXPECT_FALSE(refused.owns_lock());
  EXPECT_FALSE(writer_in.load());
  r1.unlock();
  EXPECT_FALSE(writer_in.load());
  r2.unlock();
  writer.join();
  EXPECT_TRUE(writer_in.load());
  std::shared_lock<IoGate> r3(gate, std::try_to_lock);
  EXPECT_TRUE(r3.owns_lock());
}

TEST(IoGate, TryLockSharedFailsWhileAWriterHoldsIt) {
  IoGate gate;
  std::unique_lock<IoGate> w(gate);
  std::thread t([&] {
    std::shared_lock<IoGate> r(gate, std::try_to_lock);
    EXPECT_FALSE(r.owns_lock());
  });
  t.join();
  w.unlock();
  std::shared_lock<IoGate> r(gate, std::try_to_lock);
  EXPECT_TRUE(r.owns_lock());
}

// Readers and writers hammer it: a writer never overlaps a reader or another writer, and
// everybody gets through (no lost wake-up leaves a thread asleep).
TEST(IoGate, ManyReadersAndWritersNeverOverlap) {
  IoGate gate;
  std::atomic<int> readers{0}, writers{0}, bad{0};
  std::atomic<long> reads{0}, writes{0};
  auto reader = [&] {
    for (int i = 0; i < 20000; i++) {
      std::shared_lock<IoGate> r(gate);
      readers++;
      if (writers.load()) bad++;
      readers--;
      reads++;
    }
  };
  auto writer = [&] {
    for (int i = 0; i < 300; i++) {
      std::unique_lock<IoGate> w(gate);
      if (writers.fetch_add(1) != 0 || readers.load()) bad++;
      std::this_thread::yield();
      writers--;
      writes++;
    }
  };
  std::vector<std::thread> ts;
  for (int i = 0; i < 3; i++) ts.emplace_back(reader);
  for (int i = 0; i < 2; i++) ts.emplace_back(writer);
  for (auto &t : ts) t.join();
  EXPECT_EQ(0, bad.load());
  EXPECT_EQ(3 * 20000, reads.load());
  EXPECT_EQ(2 * 300, writes.load());
}

struct Payload {
  long a[8];
};

#if LIBD_BLOCK_CACHE
TEST(BlockCache, AFreedBlockIsTheNextOneHandedOut) {
  libd::OpAllocator<Payload> alloc;
  Payload *first = nullptr;
  {
    auto p = std::allocate_shared<Payload>(alloc);
    first = p.get();
  }
  auto q = std::allocate_shared<Payload>(alloc);  // the same size: from the cache, not the heap
  EXPECT_EQ(first, q.get());
}
#endif

TEST(BlockCache, BlocksFreedOnAnotherThreadAreUsableEverywhere) {
  libd::OpAllocator<Payload> alloc;
  std::vector<std::shared_ptr<Payload>> made;
  for (int i = 0; i < 200; i++) made.push_back(std::allocate_shared<Payload>(alloc));
  for (size_t i = 0; i < made.size(); i++) made[i]->a[0] = long(i);
  std::thread t([&] { made.clear(); });  // freed there: that thread's cache, then its exit
  t.join();
  for (int i = 0; i < 200; i++) {
    auto p = std::allocate_shared<Payload>(alloc);
    p->a[7] = i;
    EXPECT_EQ(i, p->a[7]);
  }
}
