#include "core/send_batch.h"

#include <algorithm>

namespace libd {

namespace {
thread_local SendBatch *open_batch = nullptr;
}  // namespace

SendBatch::SendBatch() : outer_(open_batch) { open_batch = this; }

SendBatch::~SendBatch() {
  open_batch = outer_;  // a flush below writes at once
  for (auto &sender : held_) sender->flush_batched();
}

bool SendBatch::defer(const std::shared_ptr<BatchedSender> &sender) {
  SendBatch *batch = open_batch;
  if (batch == nullptr) return false;
  if (std::find(batch->held_.begin(), batch->held_.end(), sender) == batch->held_.end()) batch->held_.push_back(sender);
  return true;
}

}  // namespace libd
