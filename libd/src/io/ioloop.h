// A libuv loop on its own thread. Other threads hand it work with post(); run_sync() also waits
// for the work to finish. Clients share one loop per process (IoLoop::shared()); each memory
// server runs its own.
//
// A thread that is waiting anyway (busy polling for a peer's word) may drive the loop itself with
// progress(), as an application drives UCX's worker with ucp_worker_progress: a request that
// arrives meanwhile is served on that thread, with no thread woken. The loop's own thread parks
// while such a lease lasts and takes the loop back when the lease is released or lapses, so a
// driver that stops calling (or dies in user code) delays the loop by its lease, and by at most
// a quarter of the time it held the loop beyond (10 ms at most: next_look_ns).
#pragma once
#include <uv.h>

#include <atomic>
#include <cstdint>
#include <condition_variable>
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
  // True on the thread running the loop now: its own, or a progress() caller inside the loop.
  bool on_loop_thread() const { return driver_.load(std::memory_order_acquire) == std::this_thread::get_id(); }
  void post(std::function<void()> fn);
  // Runs fn on the loop and waits for it (inline when already on the loop thread).
  void run_sync(const std::function<void()> &fn);
  // After each wake-up, and after the last bytes its work moved (note_activity), the thread keeps
  // polling (without sleeping) for this long: a server's progress mode, as UCX's and NIXL's
  // busy-polling workers. 0 (the default): sleep at once.
  void set_busy_poll_us(uint32_t us) { busy_poll_us_.store(us, std::memory_order_relaxed); }
  // Called by the loop's work when it moved bytes (a read, a finished write): a thread polling
  // after a wake-up polls busy_poll_us from now on, not from the wake-up. Without it a transfer
  // that outlasts the window (a large write arriving chunk by chunk) would put the thread to
  // sleep between its chunks, and every chunk, and the next request, would pay a wake-up.
  void note_activity() { active_.store(true, std::memory_order_relaxed); }

  // Runs the loop once without blocking on the calling thread, and leases it for lease_us more:
  // until then the loop's thread stays parked and requests wait for the caller's next call. The
  // first call of a lease only asks the loop's thread to park (false: nothing was run; call
  // again). Any thread may call; one runs the loop at a time. A call's lease replaces the one
  // running, also when it is shorter: the loop's thread then takes the loop back at the new end.
  //
  // unfinished (called on the loop, between passes): whether a transfer is still part way (a
  // large payload arriving, an answer not all sent). While it is, passes follow the first, until
  // it is done, no bytes have moved for kProgressIdleNs, kProgressMaxNs (or lease_us, if less)
  // have passed, or the lease was released: one pass moves what the socket holds at that moment,
  // and a caller that does other work between its calls would otherwise stretch a large transfer
  // by that work once per socket-full. The lease then runs from the end of the call.
  static constexpr int64_t kProgressIdleNs = 50'000;
  static constexpr int64_t kProgressMaxNs = 500'000;
  // When a call with a transfer part way gives up: no bytes for idle_ns, or max_ns in all. The
  // defaults are what servers use; a caller that counts passes rather than time (a test) sets its own.
  struct ProgressLimits {
    int64_t idle_ns = kProgressIdleNs;
    int64_t max_ns = kProgressMaxNs;
  };
  bool progress(uint32_t lease_us, const std::function<bool()> &unfinished = {});
  bool progress(uint32_t lease_us, const std::function<bool()> &unfinished, ProgressLimits limits);
  // Ends the caller's lease: the loop's thread takes the loop back at once.
  void release();

  // When a thread parked since `parked_since` looks at a lease that lasts `until` next (steady
  // clock, ns): past the lease's end by a quarter of the time parked so far, at most
  // kMaxParkedSlackNs, so that a lease its holder keeps renewing does not wake the thread once a
  // lease.
  static constexpr int64_t kMaxParkedSlackNs = 10'000'000;
  static int64_t next_look_ns(int64_t until, int64_t parked_since, int64_t now);

 private:
  void drain();
  void run_thread();
  bool leased() const;
  void park(std::unique_lock<std::mutex> &drive);
  void ask_to_park();
  void wake_parked();  // has the parked thread look at the lease again

  uv_loop_t loop_;
  uv_async_t wake_;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::function<void()>> queue_;
  bool stopping_ = false;
  std::atomic<uint32_t> busy_poll_us_{0};
  std::atomic<bool> active_{false};  // note_activity since the polling thread last looked

  struct Driving;
  std::mutex drive_mu_;  // held by whichever thread runs the loop
  std::mutex park_mu_;   // orders release() with the parked thread's look at the lease
  std::condition_variable parked_cv_;  // the loop's thread, parked during a lease (and the constructor, until it runs)
  std::atomic<std::thread::id> driver_{};
  std::atomic<int64_t> lease_until_ns_{0};  // steady clock; 0: no lease
  std::atomic<bool> park_asked_{false};
};

}  // namespace libd
