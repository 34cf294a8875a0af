// A batch of sends on the calling thread: while one is open, an engine that would write a request
// at once (TcpConn) leaves it queued and is flushed when the batch ends, so that requests made
// back to back (an operation and the holder's word behind it) leave in one system call and reach
// the server in one read.
#pragma once

#include <memory>
#include <vector>

namespace libd {

// An engine whose queued sends a batch holds back: written when the batch ends.
class BatchedSender {
 public:
  virtual ~BatchedSender() = default;
  virtual void flush_batched() = 0;
};

class SendBatch {
 public:
  SendBatch();
  ~SendBatch();  // flushes every sender held back, in the order they were first held
  SendBatch(const SendBatch &) = delete;
  SendBatch &operator=(const SendBatch &) = delete;

  // If a batch is open on this thread: `sender` is flushed at its end (once) and true is
  // returned; the caller then writes nothing now. Otherwise false: write as usual.
  static bool defer(const std::shared_ptr<BatchedSender> &sender);

 private:
  std::vector<std::shared_ptr<BatchedSender>> held_;
  SendBatch *outer_;
};

}  // namespace libd
