#include "core/fault_injector.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "core/params.h"

namespace libd {

namespace {

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

}  // namespace

struct FaultInjector::Driver : OpDriver {
  explicit Driver(FaultInjector *f) : faults(f) {}
  void cancel(Op *op) override {
    std::unique_lock<std::mutex> lk(faults->mu_);  // the timer thread takes an operation under it
    for (auto it = faults->held_.begin(); it != faults->held_.end(); ++it)
      if (it->second.op.get() == op) {
        faults->held_.erase(it);
        return;
      }
    if (faults->posting_ != op) return;
    // Being handed to the engine: once it has it, the engine's cancel detaches it.
    faults->cv_.wait(lk, [&] { return faults->posting_ != op; });
    lk.unlock();
    auto engine = op->driver();
    if (engine && engine.get() != this) engine->cancel(op);
  }
  FaultInjector *faults;
};

FaultInjector::FaultInjector(Hooks hooks) : hooks_(std::move(hooks)), driver_(std::make_shared<Driver>(this)) {
  timer_ = std::thread([this] { timer_loop(); });
}

FaultInjector::~FaultInjector() { stop(); }

bool FaultInjector::is_knob(const std::string &key) {
  return key == "fault" || key == "delay_ms" || key == "errno" || key == "count";
}

int FaultInjector::set(const std::string &key, const std::string &value) {
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
  uint64_t v;  // count
  if (!parse_size(value, &v)) return set_error(-EINVAL, "count must be a non-negative integer");
  count_ = int64_t(v);
  return 0;
}

bool FaultInjector::take_locked(Fault f) {
  if (fault_ != f || count_ == 0) return false;
  if (count_ > 0 && --count_ == 0) fault_ = Fault::None;
  return true;
}

int FaultInjector::on_connect() {
  std::lock_guard<std::mutex> lk(mu_);
  if (take_locked(Fault::Refuse)) return set_error(-ECONNREFUSED, "connection refused (injected: fault=refuse)");
  return 0;
}

bool FaultInjector::intercept(const std::shared_ptr<Op> &op) {
  std::unique_lock<std::mutex> lk(mu_);
  if (take_locked(Fault::Error)) {
    int e = errno_;
    lk.unlock();
    op->complete(-e, std::string("injected error ") + errno_name(e));
    return true;
  }
  if (take_locked(Fault::Disconnect)) {
    lk.unlock();
    const char *why = "peer disconnected (injected: fault=disconnect)";
    hooks_.fail(-ECONNRESET, why);
    op->complete(-ECONNRESET, why);
    return true;
  }
  bool drop = take_locked(Fault::Drop), delay = !drop && take_locked(Fault::Delay);
  if (!drop && !delay) return false;
  uint64_t id = ++next_id_;
  op->set_driver(driver_, false);  // before the timer thread can see the operation
  held_[id] = Held{op, drop};
  due_.emplace(drop ? op->deadline().at() : Clock::now() + std::chrono::milliseconds(delay_ms_), id);
  cv_.notify_all();
  return true;
}

void FaultInjector::flush(int err, const std::string &why) {
  std::map<uint64_t, Held> held;
  {
    std::lock_guard<std::mutex> lk(mu_);
    held.swap(held_);
    due_.clear();
  }
  for (auto &[id, h] : held) h.op->complete(err, why);
}

void FaultInjector::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ && !timer_.joinable()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  flush(-ESHUTDOWN, "the transport was terminated");
}

void FaultInjector::timer_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    if (due_.empty()) { cv_.wait(lk); continue; }
    auto at = due_.begin()->first;
    if (Clock::now() < at) { cv_.wait_until(lk, at); continue; }
    uint64_t id = due_.begin()->second;
    due_.erase(due_.begin());
    auto it = held_.find(id);
    if (it == held_.end()) continue;  // cancelled, or flushed
    Held h = std::move(it->second);
    held_.erase(it);
    if (!h.drop) posting_ = h.op.get();
    lk.unlock();
    if (h.drop) {
      const char *why = "no answer within the deadline (injected: fault=drop)";
      hooks_.fail(-ETIMEDOUT, why);
      h.op->complete(-ETIMEDOUT, why);
    } else {
      hooks_.post(h.op);  // the engine's own post, late
    }
    lk.lock();
    posting_ = nullptr;
    cv_.notify_all();
  }
}

}  // namespace libd
