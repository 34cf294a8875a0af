// SendBatch (core/send_batch.h): sends held back on the thread that opened a batch go when it ends.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/send_batch.h"

namespace {

struct Recorder : libd::BatchedSender {
  std::string name;
  std::vector<std::string> *log;
  Recorder(std::string n, std::vector<std::string> *l) : name(std::move(n)), log(l) {}
  void flush_batched() override { log->push_back(name); }
};

}  // namespace

TEST(SendBatch, WithoutABatchNothingIsHeldBack) {
  std::vector<std::string> log;
  auto a = std::make_shared<Recorder>("a", &log);
  EXPECT_FALSE(libd::SendBatch::defer(a));
  EXPECT_TRUE(log.empty());
}

TEST(SendBatch, EachSenderIsFlushedOnceWhenTheBatchEndsInTheOrderItWasHeld) {
  std::vector<std::string> log;
  auto a = std::make_shared<Recorder>("a", &log);
  auto b = std::make_shared<Recorder>("b", &log);
  {
    libd::SendBatch batch;
    EXPECT_TRUE(libd::SendBatch::defer(b));
    EXPECT_TRUE(libd::SendBatch::defer(a));
    EXPECT_TRUE(libd::SendBatch::defer(b));
    EXPECT_TRUE(log.empty()) << "nothing goes before the batch ends";
  }
  EXPECT_EQ((std::vector<std::string>{"b", "a"}), log);
  EXPECT_FALSE(libd::SendBatch::defer(a)) << "the batch is closed";
}

TEST(SendBatch, AnInnerBatchFlushesItsOwnAtItsEnd) {
  std::vector<std::string> log;
  auto a = std::make_shared<Recorder>("a", &log);
  auto b = std::make_shared<Recorder>("b", &log);
  {
    libd::SendBatch outer;
    EXPECT_TRUE(libd::SendBatch::defer(a));
    {
      libd::SendBatch inner;
      EXPECT_TRUE(libd::SendBatch::defer(b));
    }
    EXPECT_EQ((std::vector<std::string>{"b"}), log);
  }
  EXPECT_EQ((std::vector<std::string>{"b", "a"}), log);
}

TEST(SendBatch, ABatchHoldsBackOnlyItsOwnThreadsSends) {
  std::vector<std::string> log;
  auto a = std::make_shared<Recorder>("a", &log);
  libd::SendBatch batch;
  bool held_elsewhere = true;
  std::thread([&] { held_elsewhere = libd::SendBatch::defer(a); }).join();
  EXPECT_FALSE(held_elsewhere);
}
