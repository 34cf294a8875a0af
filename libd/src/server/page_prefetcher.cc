#include "server/page_prefetcher.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace libd {

void PagePrefetcher::Job::end() {
  if (map) munmap(map, size);
  close(fd);
}

void PagePrefetcher::add(int fd, uint64_t size, std::shared_ptr<const std::atomic<bool>> withdrawn) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!stopping_) {
      jobs_.push_back({fd, size, 0, nullptr, std::move(withdrawn)});
      if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
      work_cv_.notify_one();
      return;
    }
  }
  close(fd);
}

void PagePrefetcher::stop() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    work_cv_.notify_one();
    t = std::move(thread_);
  }
  if (t.joinable()) t.join();
  std::lock_guard<std::mutex> lk(mu_);
  for (auto &j : jobs_) j.end();
  jobs_.clear();
  idle_cv_.notify_all();
}

void PagePrefetcher::wait_idle() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return (jobs_.empty() && !busy_) || stopping_; });
}

void PagePrefetcher::run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
    if (stopping_) return;
    // Only this thread pops, and add() appends: the front stays this job while the lock is let go
    // (a deque keeps references to its elements across push_back).
    Job &job = jobs_.front();
    bool over = job.withdrawn->load(std::memory_order_acquire) || job.done >= job.size;
    if (!over) {
      busy_ = true;
      lk.unlock();  // add() and stop() never wait for a chunk
      if (!job.map) {
        void *p = mmap(nullptr, job.size, PROT_READ | PROT_WRITE, MAP_SHARED, job.fd, 0);
        job.map = p == MAP_FAILED ? nullptr : static_cast<char *>(p);
      }
      uint64_t len = std::min(kChunk, job.size - job.done);
      int rc = -1;
      if (job.map) {
        do rc = madvise(job.map + job.done, len, MADV_POPULATE_WRITE);
        while (rc != 0 && errno == EINTR);
      }
      lk.lock();
      busy_ = false;
      if (rc == 0) {
        job.done += len;
        allocated_.fetch_add(len, std::memory_order_relaxed);
      } else {
        // Out of memory, or a kernel without MADV_POPULATE_WRITE (before 5.14): the writer gets its
        // pages as before, one fault at a time, and meets any shortage there with its own error.
        over = true;
      }
      over = over || job.done >= job.size;
    }
    if (over) {
      job.end();
      jobs_.pop_front();
    }
    if (jobs_.empty()) idle_cv_.notify_all();
  }
}

}  // namespace libd
