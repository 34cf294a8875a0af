#include "io/ioloop.h"

#include <sched.h>

#include <chrono>
#include <condition_variable>

namespace libd {

IoLoop::IoLoop() {
  uv_loop_init(&loop_);
  uv_async_init(&loop_, &wake_, [](uv_async_t *a) { static_cast<IoLoop *>(a->data)->drain(); });
  wake_.data = this;
  thread_ = std::thread([this] {
    // One pass blocks until something happens; then, when busy polling is on, passes that do not
    // block follow for busy_poll_us, so that the next request, if it comes that soon, finds the
    // thread awake (no wake-up, which costs tens of microseconds on a busy host).
    while (uv_run(&loop_, UV_RUN_ONCE) != 0) {
      uint32_t spin = busy_poll_us_.load(std::memory_order_relaxed);
      if (spin == 0) continue;
      auto end = std::chrono::steady_clock::now() + std::chrono::microseconds(spin);
      bool alive = true;
      while (alive && std::chrono::steady_clock::now() < end) {
        alive = uv_run(&loop_, UV_RUN_NOWAIT) != 0;
        sched_yield();
      }
      if (!alive) break;
    }
  });
}

IoLoop::~IoLoop() {
  post([this] {
    stopping_ = true;
    // Close every handle left (owners were expected to close theirs first).
    uv_walk(&loop_, [](uv_handle_t *h, void *) { if (!uv_is_closing(h)) uv_close(h, nullptr); }, nullptr);
  });
  thread_.join();
  uv_loop_close(&loop_);
}

IoLoop &IoLoop::shared() {
  // Never destroyed: transports may be torn down by other static destructors at exit.
  static IoLoop *loop = new IoLoop();
  return *loop;
}

void IoLoop::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    queue_.push_back(std::move(fn));
  }
  uv_async_send(&wake_);
}

void IoLoop::run_sync(const std::function<void()> &fn) {
  if (on_loop_thread()) { fn(); return; }
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  post([&] {
    fn();
    std::lock_guard<std::mutex> lk(m);
    done = true;
    cv.notify_one();
  });
  std::unique_lock<std::mutex> lk(m);
  cv.wait(lk, [&] { return done; });
}

void IoLoop::drain() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lk(mu_);
    work.swap(queue_);
  }
  for (auto &fn : work) fn();
}

}  // namespace libd
