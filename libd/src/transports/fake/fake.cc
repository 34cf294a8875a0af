// fake: a local region whose faults a test sets with libd_transport_set(), to test the core and
// the bindings without a network. Knobs:
//   fault      none | delay | error | drop | disconnect | refuse
//   delay_ms   for delay (default 50)
//   errno      for error: a number or a name like EIO (default EIO)
//   count      how many operations the fault hits before it clears (default: all)
// delay completes operations late from a timer thread; error fails them and stays READY; drop
// never answers, so the operation ends by its deadline and the transport goes to ERROR (as a lost
// response does on a real network); disconnect fails the operation and moves to ERROR; refuse makes
// connect/recover fail with ECONNREFUSED. What the fake cannot prove: real wire framing, partial
// transfers, and kernel-level faults — the shm/tcp tests cover those.
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/transport.h"
#include "transports/local/region.h"

namespace libd {
namespace {

enum class Fault { None, Delay, Error, Drop, Disconnect, Refuse };

int parse_errno(const std::string &v, int *out) {
  static const struct { const char *n; int e; } names[] = {
      {"EIO", EIO}, {"EACCES", EACCES}, {"ERANGE", ERANGE}, {"ECONNRESET", ECONNRESET},
      {"ETIMEDOUT", ETIMEDOUT}, {"ENOMEM", ENOMEM}, {"EAGAIN", EAGAIN}, {"EPROTO", EPROTO}};
  for (auto &n : names)
    if (v == n.n) { *out = n.e; return 0; }
  char *end = nullptr;
  long x = strtol(v.c_str(), &end, 10);
  if (v.empty() || *end || x <= 0 || x > 4095) return set_error(-EINVAL, "errno must be a name like EIO or 1..4095");
  *out = int(x);
  return 0;
}

class FakeTransport : public Transport {
 public:
  int set(const std::string &key, const std::string &value) override {
    std::lock_guard<std::mutex> lk(mu_);
    if (key == "fault") {
      static const std::map<std::string, Fault> faults = {
          {"none", Fault::None}, {"delay", Fault::Delay}, {"error", Fault::Error},
          {"drop", Fault::Drop}, {"disconnect", Fault::Disconnect}, {"refuse", Fault::Refuse}};
      auto it = faults.find(value);
      if (it == faults.end()) return set_error(-EINVAL, "fault must be none, delay, error, drop, disconnect or refuse");
      fault_ = it->second;
      count_ = -1;
      return 0;
    }
    if (key == "delay_ms") {
      uint64_t v;
      if (!parse_size(value, &v) || v > 600000) return set_error(-EINVAL, "delay_ms must be 0..600000");
      delay_ms_ = int64_t(v);
      return 0;
    }
    if (key == "errno") return parse_errno(value, &errno_);
    if (key == "count") {
      uint64_t v;
      if (!parse_size(value, &v)) return set_error(-EINVAL, "count must be a non-negative integer");
      count_ = int64_t(v);
      return 0;
    }
    return Transport::set(key, value);
  }

 protected:
  bool configured() const override { return params_.has("size"); }

  int do_init() override {
    uint64_t size;
    if (int rc = params_.get_size("size", 0, &size)) return rc;
    if (size == 0) return set_error(-EINVAL, "parameter 'size' is required");
    return parse_rights(params_.get_or("rights", "rw"), &rights_);
  }

  int do_connect(Deadline) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (take(Fault::Refuse)) return set_error(-ECONNREFUSED, "fake: connection refused (fault=refuse)");
    }
    uint64_t size;
    params_.get_size("size", 0, &size);
    if (!region_) {  // the data survives reconnects, as a memory element's does
      if (int rc = Region::open("", size, &region_)) return rc;
    }
    set_remote(0, size, rights_);
    start_timer_thread();
    return 0;
  }

  void do_disconnect() override {
    std::map<uint64_t, std::shared_ptr<Op>> pending;
    {
      std::lock_guard<std::mutex> lk(mu_);
      pending.swap(pending_);
    }
    for (auto &[id, p] : pending) p->complete(-ECONNRESET, "fake: connection closed");
  }

  void do_terminate() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
    }
    timer_cv_.notify_all();
    if (timer_.joinable()) timer_.join();
    region_.reset();
  }

  int do_post(const std::shared_ptr<Op> &op) override {
    std::unique_lock<std::mutex> lk(mu_);
    if (take(Fault::Error)) {
      int e = errno_;
      lk.unlock();
      op->complete(-e, std::string("fake: injected error ") + errno_name(e));
      return 0;
    }
    if (take(Fault::Disconnect)) {
      lk.unlock();
      fail(-ECONNRESET, "fake: peer disconnected (fault=disconnect)");
      op->complete(-ECONNRESET, "fake: peer disconnected (fault=disconnect)");
      return 0;
    }
    bool drop = take(Fault::Drop), delay = !drop && take(Fault::Delay);
    if (!drop && !delay) {
      lk.unlock();
      execute(*op);
      op->complete(0);
      return 0;
    }
    uint64_t id = ++next_id_;
    op->set_driver(driver_, false);  // before the timer thread can see the operation
    pending_[id] = op;
    auto due = drop ? op->deadline().at() : Clock::now() + std::chrono::milliseconds(delay_ms_);
    timers_.emplace(due, Timer{id, drop});
    timer_cv_.notify_all();
    return 0;
  }

 private:
  struct Timer {
    uint64_t id;
    bool drop;
  };

  // The driver of its delayed and dropped operations: cancel takes one out before the timer thread
  // runs it. Shared, because an operation holds its driver weakly (it may outlive the transport).
  struct Driver : OpDriver {
    explicit Driver(FakeTransport *f) : fake(f) {}
    void cancel(Op *op) override {
      std::lock_guard<std::mutex> lk(fake->mu_);  // the timer thread copies under this lock
      for (auto it = fake->pending_.begin(); it != fake->pending_.end(); ++it)
        if (it->second.get() == op) {
          fake->pending_.erase(it);
          return;
        }
    }
    FakeTransport *fake;
  };

  // True if the fault is armed (and consumes one use of its count).
  bool take(Fault f) {
    if (fault_ != f || count_ == 0) return false;
    if (count_ > 0 && --count_ == 0) fault_ = Fault::None;
    return true;
  }

  void execute(const Op &op) {
    for (const auto &s : op.segments())
      copy_segment(region_->data(), op.kind() == OpKind::Read, s.size, s.raddr, s.buf);
  }

  void start_timer_thread() {
    std::lock_guard<std::mutex> lk(mu_);
    if (timer_.joinable()) return;
    timer_ = std::thread([this] { timer_loop(); });
  }

  void timer_loop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stopping_) {
      if (timers_.empty()) { timer_cv_.wait(lk); continue; }
      auto due = timers_.begin()->first;
      if (Clock::now() < due) { timer_cv_.wait_until(lk, due); continue; }
      Timer t = timers_.begin()->second;
      timers_.erase(timers_.begin());
      auto it = pending_.find(t.id);
      if (it == pending_.end()) continue;  // cancelled
      auto op = it->second;
      pending_.erase(it);
      if (t.drop) {
        lk.unlock();
        fail(-ETIMEDOUT, "fake: no answer within the deadline (fault=drop)");
        op->complete(-ETIMEDOUT, "fake: no answer within the deadline (fault=drop)");
      } else {
        execute(*op);  // under mu_, so a concurrent cancel waits for the copy to end
        lk.unlock();
        op->complete(0);
      }
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable timer_cv_;
  std::thread timer_;
  bool stopping_ = false;
  std::multimap<Clock::time_point, Timer> timers_;
  std::map<uint64_t, std::shared_ptr<Op>> pending_;
  std::shared_ptr<Driver> driver_ = std::make_shared<Driver>(this);
  uint64_t next_id_ = 0;
  Fault fault_ = Fault::None;
  int64_t count_ = -1;
  int64_t delay_ms_ = 50;
  int errno_ = EIO;
  unsigned rights_ = 0;
  std::shared_ptr<Region> region_;
};

}  // namespace

extern const ImplInfo kFakeImpl = {
    "fake", {}, LIBD_KIND_RDMA, [] { return std::unique_ptr<Transport>(new FakeTransport()); }};

}  // namespace libd
