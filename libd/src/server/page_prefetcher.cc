#include "server/page_prefetcher.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

namespace libd {

void PagePrefetcher::Job::end() {
  if (map) munmap(map, size);
  close(fd);
}

int PagePrefetcher::add(int fd, uint64_t size, std::shared_ptr<const std::atomic<bool>> withdrawn) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) {
    close(fd);
    return -ESHUTDOWN;
  }
  if (!thread_.joinable()) {
    try {
      thread_ = std::thread([this] { run(); });
    } catch (const std::system_error &) {  // no thread to be had: the element works without
      close(fd);
      return -EAGAIN;
    }
  }
  jobs_.push_back({fd, size, 0, nullptr, std::move(withdrawn)});
  work_cv_.notify_one();
  return 0;
}

void PagePrefetcher::hold(bool held) {
  std::lock_guard<std::mutex> lk(mu_);
  held_ = held;
  work_cv_.notify_one();
}

void PagePrefetcher::stop() {
  std::lock_guard<std::mutex> once(stop_mu_);  // a second stop waits for the first's join
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

void PagePrefetcher::drop_withdrawn_locked() {
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    if (it->withdrawn->load(std::memory_order_acquire) || it->done >= it->size) {
      it->end();  // the pages its writers had go back now, not when the jobs before it end
      it = jobs_.erase(it);
    } else {
      ++it;
    }
  }
}

void PagePrefetcher::run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stopping_ || (!held_ && !jobs_.empty()); });
    if (stopping_) return;
    drop_withdrawn_locked();  // before every chunk: what was withdrawn or finished meanwhile
    if (jobs_.empty()) {
      idle_cv_.notify_all();
      continue;
    }
    // Only this thread removes jobs, and add() appends: the front stays this job while the lock
    // is let go (a deque keeps references to its elements across push_back).
    Job &job = jobs_.front();
    busy_ = true;
    lk.unlock();  // add(), hold() and stop() never wait for a chunk
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
      job.done = job.size;
    }
  }
}

}  // namespace libd
