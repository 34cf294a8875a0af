// A libuv loop on its own thread. Other threads hand it work with post(); run_sync() also waits
// for the work to finish. Clients share one loop per process (IoLoop::shared()); each memory
// server runs its own.
#pragma once
#include <uv.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace libd {

class IoLoop {
 public:
  IoLoop();
  ~IoLoop();
  IoLoop(const IoLoop &) = delete;
  IoLoop &operator=(const IoLoop &) = delete;

  static IoLoop &shared();

  uv_loop_t *loop() { return &loop_; }
  bool on_loop_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  void post(std::function<void()> fn);
  // Runs fn on the loop and waits for it (inline when already on the loop thread).
  void run_sync(const std::function<void()> &fn);
  // After each wake-up the thread keeps polling (without sleeping) for this long: a server's
  // progress mode, as UCX's and NIXL's busy-polling workers. 0 (the default): sleep at once.
  void set_busy_poll_us(uint32_t us) { busy_poll_us_.store(us, std::memory_order_relaxed); }

 private:
  void drain();

  uv_loop_t loop_;
  uv_async_t wake_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::function<void()>> queue_;
  bool stopping_ = false;
  std::atomic<uint32_t> busy_poll_us_{0};
};

}  // namespace libd
