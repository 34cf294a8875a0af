#include "io/ioloop.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

#include "core/error.h"

namespace libd {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

IoLoop::IoLoop() {
  uv_loop_init(&loop_);
  uv_async_init(&loop_, &wake_, [](uv_async_t *a) { static_cast<IoLoop *>(a->data)->drain(); });
  wake_.data = this;
  thread_ = std::thread([this] { run_thread(); });
  // Returns once the loop's thread holds the loop: a progress() caller then always finds it
  // there and asks it to park, and never has the thread take the loop from between two of its
  // calls (as a thread started late would, on a loaded host).
  std::unique_lock<std::mutex> parked(park_mu_);
  parked_cv_.wait(parked, [this] { return driver_.load(std::memory_order_acquire) != std::thread::id(); });
}

void IoLoop::run_thread() {
  std::unique_lock<std::mutex> drive(drive_mu_);
  driver_.store(std::this_thread::get_id(), std::memory_order_release);
  {
    std::lock_guard<std::mutex> parked(park_mu_);  // the constructor waits for this, on park_mu_
  }
  parked_cv_.notify_all();
  // One pass blocks until something happens; then, when busy polling is on, passes that do not
  // block follow until busy_poll_us pass with no bytes moved, so that the next request (or the
  // next chunk of a long one), if it comes that soon, finds the thread awake (no wake-up, which
  // costs tens of microseconds on a busy host).
  for (;;) {
    if (leased()) {
      park(drive);
      continue;
    }
    park_asked_.store(false, std::memory_order_relaxed);
    if (uv_run(&loop_, UV_RUN_ONCE) == 0) break;
    uint32_t spin = busy_poll_us_.load(std::memory_order_relaxed);
    if (spin == 0) continue;
    active_.store(false, std::memory_order_relaxed);
    auto window = std::chrono::microseconds(spin);
    auto end = std::chrono::steady_clock::now() + window;
    bool alive = true;
    for (;;) {
      auto now = std::chrono::steady_clock::now();
      if (active_.exchange(false, std::memory_order_relaxed)) end = now + window;  // polls on after the last bytes
      if (!alive || leased() || now >= end) break;
      alive = uv_run(&loop_, UV_RUN_NOWAIT) != 0;
      sched_yield();
    }
    if (!alive) break;
  }
  driver_.store(std::thread::id(), std::memory_order_release);
}

int64_t IoLoop::next_look_ns(int64_t until, int64_t parked_since, int64_t now) {
  // The first look comes as the lease ends. A holder that keeps calling renews it before then,
  // and a thread that looked at every lease's end would be woken once a lease (1 ms, say) for as
  // long as the holder drives: on a host whose cores the holder and its peer keep busy, each of
  // those wake-ups takes a core from one of them. So the longer the loop has been leased, the
  // later the thread looks: a quarter of the time parked so far past the lease's end, at most
  // kMaxParkedSlackNs. A holder that stops calling (without release()) thus delays the loop by
  // its lease and that slack; release() still wakes the thread at once.
  return until + std::min((now - parked_since) / 4, kMaxParkedSlackNs);
}

bool IoLoop::leased() const {
  int64_t until = lease_until_ns_.load(std::memory_order_acquire);
  return until != 0 && now_ns() < until;
}

void IoLoop::park(std::unique_lock<std::mutex> &drive) {
  driver_.store(std::thread::id(), std::memory_order_release);
  drive.unlock();  // the lease holder runs the loop meanwhile
  {
    // A mutex of its own, which release() takes before it signals: a release that comes between
    // a look at the lease and the wait is not lost (drive_mu_ may be held by a lease holder).
    std::unique_lock<std::mutex> parked(park_mu_);
    const int64_t since = now_ns();
    for (;;) {
      int64_t until = lease_until_ns_.load(std::memory_order_acquire);
      int64_t now = now_ns();
      if (until == 0 || now >= until) break;
      parked_cv_.wait_until(parked, std::chrono::steady_clock::time_point(std::chrono::nanoseconds(
                                        next_look_ns(until, since, now))));
    }
  }
  drive.lock();
  driver_.store(std::this_thread::get_id(), std::memory_order_release);
}

// The calling thread runs the loop (it holds drive_mu_) for as long as this lives: it is the
// loop's thread meanwhile, and what the loop's work records as an error is not the caller's.
struct IoLoop::Driving {
  IoLoop &loop;
  std::string saved = last_error();
  explicit Driving(IoLoop &l) : loop(l) { loop.driver_.store(std::this_thread::get_id(), std::memory_order_release); }
  ~Driving() {
    loop.driver_.store(std::thread::id(), std::memory_order_release);
    if (saved != last_error()) set_error(0, std::move(saved));
  }
};

void IoLoop::ask_to_park() {
  // The loop's thread holds the loop, probably asleep in epoll: wake it once per lease; it parks.
  if (!park_asked_.exchange(true, std::memory_order_relaxed)) uv_async_send(&wake_);
}

bool IoLoop::progress(uint32_t lease_us, const std::function<bool()> &unfinished) {
  return progress(lease_us, unfinished, ProgressLimits{});
}

bool IoLoop::progress(uint32_t lease_us, const std::function<bool()> &unfinished, ProgressLimits limits) {
  if (on_loop_thread()) return false;  // called back from the loop itself: it runs already
  const int64_t lease_ns = int64_t(lease_us) * 1000;
  int64_t until = now_ns() + lease_ns;
  // A lease shorter than the one running replaces it: the parked thread, waiting out the old
  // one, must look again (once this call is over: until then the caller runs the loop), or a
  // holder that leased for a minute and then for a millisecond would keep the loop for the minute.
  const bool shortened = lease_until_ns_.exchange(until, std::memory_order_acq_rel) > until;
  std::unique_lock<std::mutex> drive(drive_mu_, std::try_to_lock);
  if (!drive.owns_lock()) {
    if (shortened) wake_parked();
    ask_to_park();
    return false;
  }
  {
    Driving here(*this);
    const int64_t start = now_ns();
    active_.store(false, std::memory_order_relaxed);
    uv_run(&loop_, UV_RUN_NOWAIT);
    if (unfinished) {
      const int64_t budget = std::min(lease_ns, limits.max_ns);
      int64_t moved = start;  // when bytes last moved
      bool passed = false;
      for (;;) {
        if (!unfinished()) break;
        int64_t now = now_ns();
        if (active_.exchange(false, std::memory_order_relaxed)) moved = now;
        if (now - moved >= limits.idle_ns || now - start >= budget) break;
        // Released meanwhile (the owner is stopping, say), or leased anew by another caller:
        // the loop is theirs to decide about.
        if (lease_until_ns_.load(std::memory_order_acquire) != until) break;
        uv_run(&loop_, UV_RUN_NOWAIT);
        passed = true;
      }
      // The lease runs from the end of the call, as from one that returned at once; one
      // released meanwhile stays released.
      if (passed) lease_until_ns_.compare_exchange_strong(until, now_ns() + lease_ns, std::memory_order_acq_rel);
    }
  }
  drive.unlock();
  if (shortened) wake_parked();
  return true;
}

void IoLoop::release() {
  if (lease_until_ns_.exchange(0, std::memory_order_acq_rel) == 0) return;
  wake_parked();
}

void IoLoop::wake_parked() {
  // The parked thread looks at the lease holding park_mu_ and waits releasing it: once this
  // has had it, the thread either sees the lease changed or is waiting, and the signal wakes it.
  { std::lock_guard<std::mutex> parked(park_mu_); }
  parked_cv_.notify_one();
}

IoLoop::~IoLoop() {
  release();
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
  // During a lease the loop's thread is parked: rather than wait for the lease holder's next
  // call, run it here as soon as nobody runs the loop (the loop's thread parking, or the holder
  // between calls), after the work queued before it.
  while (leased()) {
    std::unique_lock<std::mutex> drive(drive_mu_, std::try_to_lock);
    if (!drive.owns_lock()) {
      ask_to_park();
      std::this_thread::yield();
      continue;
    }
    Driving here(*this);
    drain();
    fn();
    // A pass of the loop after it, as on the loop's thread: the close callbacks of handles closed
    // until now run before this returns (a server's stop() counts on it).
    uv_run(&loop_, UV_RUN_NOWAIT);
    return;
  }
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
