// A transport's I/O gate: operations pass it shared; connect, recover, reg and terminate hold it
// exclusively, so the buffer, the grant and the engine cannot change under an operation.
//
// It has std::shared_mutex's interface (std::shared_lock and std::unique_lock work on it), but the
// shared side, which every operation takes, is one atomic add to enter and one to leave. A pass
// through pthread_rwlock costs about 150 instructions, which shows at 64 bytes where the library
// runs under emulation (the Soft-RoCE guest). Exclusive holders are rare and may sleep: they
// announce themselves (new readers then wait), then wait for the readers inside to leave.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace libd {

class IoGate {
 public:
  void lock_shared() {
    while (!try_lock_shared()) wait_while_writer();
  }
  bool try_lock_shared() {
    if (state_.fetch_add(1, std::memory_order_acquire) & kWriter) {
      unlock_shared();
      return false;
    }
    return true;
  }
  void unlock_shared() {
    // The last reader out while a writer waits wakes it.
    if (state_.fetch_sub(1, std::memory_order_release) == (kWriter | 1)) notify();
  }

  void lock() {
    writers_.lock();  // one exclusive holder at a time
    state_.fetch_or(kWriter, std::memory_order_acquire);
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return state_.load(std::memory_order_acquire) == kWriter; });
  }
  void unlock() {
    {
      std::lock_guard<std::mutex> lk(mu_);  // a reader between its check and its wait holds mu_
      state_.fetch_and(~kWriter, std::memory_order_release);
    }
    cv_.notify_all();
    writers_.unlock();
  }

 private:
  static constexpr uint32_t kWriter = 1u << 31;  // below it: readers inside (or backing out)

  void wait_while_writer() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return !(state_.load(std::memory_order_acquire) & kWriter); });
  }
  void notify() {
    std::lock_guard<std::mutex> lk(mu_);  // the writer between its check and its wait holds mu_
    cv_.notify_all();
  }

  std::atomic<uint32_t> state_{0};
  std::mutex writers_;
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace libd
