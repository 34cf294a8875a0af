// Has a memory element's pages before its writers need them. A new element is a memfd with no
// pages: the kernel allocates and zeroes each page when it is first written, and on a virtual
// machine the host may have to back it first, so a large first write runs at a fraction of the
// speed of a rewrite. An owner that knows it will fill an element asks for its pages ahead
// (libd_trdma_server_prefetch, as ibv_advise_mr's PREFETCH_WRITE advice or MAP_POPULATE), and one
// thread of the server's has them, a MiB at a time from the start, while the owner goes on.
// It faults them in through a mapping of its own (MADV_POPULATE_WRITE), which leaves a page that
// exists as it is and takes no lock a writer's pwrite waits for: fallocate holds the file's lock
// for its whole range, and writers racing it stalled for milliseconds.
// A withdrawn element is dropped at the next chunk; requests are served oldest first.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace libd {

class PagePrefetcher {
 public:
  static constexpr uint64_t kChunk = 1ull << 20;  // short: the server's mappings wait for no more

  PagePrefetcher() = default;
  PagePrefetcher(const PagePrefetcher &) = delete;
  PagePrefetcher &operator=(const PagePrefetcher &) = delete;
  ~PagePrefetcher() { stop(); }

  // Takes `fd` (a descriptor of its own: closed when the job ends) and has the pages of [0, size)
  // of it unless `withdrawn` turns true first: a withdrawn job is dropped (its descriptor closed)
  // at the next chunk, wherever it is in the queue. 0, or -ESHUTDOWN after stop() and -EAGAIN when
  // no thread could be started (the descriptor closed either way).
  int add(int fd, uint64_t size, std::shared_ptr<const std::atomic<bool>> withdrawn);
  // Holds the thread before its next chunk (true) or lets it go on (false).
  void hold(bool held);
  // Ends the thread after its current chunk and drops what is queued; later adds are refused.
  void stop();
  // Waits until no request is left (or stop()).
  void wait_idle();
  uint64_t allocated_bytes() const { return allocated_.load(std::memory_order_relaxed); }

 private:
  struct Job {
    int fd;
    uint64_t size, done;
    char *map;  // the whole file, mapped on the first chunk
    std::shared_ptr<const std::atomic<bool>> withdrawn;
    void end();  // unmaps and closes
  };
  void run();
  void drop_withdrawn_locked();  // ends the jobs withdrawn or done

  std::mutex mu_, stop_mu_;
  std::condition_variable work_cv_, idle_cv_;
  std::deque<Job> jobs_;
  bool busy_ = false, stopping_ = false, held_ = false;
  std::thread thread_;
  std::atomic<uint64_t> allocated_{0};
};

}  // namespace libd
