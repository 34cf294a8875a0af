// Faults injected around any client transport (durl key faults,1; always on for `fake`, which is
// local memory with them), set at run time with libd_transport_set — the model is Mooncake's
// FaultProxyTransport: the engine below is the real one, only what reaches it changes. Knobs:
//   fault      none | delay | error | drop | disconnect | refuse
//   delay_ms   for delay (default 50)
//   errno      for error: a number or a name like EIO (default EIO)
//   count      how many operations (or connects) the fault hits before it clears (default: all)
// error fails the operation and the transport stays READY; disconnect fails it and moves the
// transport to ERROR; drop never hands it to the engine, so it ends at its deadline and the
// transport goes to ERROR (as a lost response does on a network); delay hands it to the engine
// late; refuse makes connect/recover fail with ECONNREFUSED. While faults are on, the transport
// declares no in-place copies and no direct path (its caps), so every operation passes here.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/clock.h"
#include "core/op.h"

namespace libd {

class FaultInjector {
 public:
  struct Hooks {
    std::function<void(const std::shared_ptr<Op> &)> post;  // the engine's post, when a delay ends
    std::function<void(int, const std::string &)> fail;     // moves the transport to ERROR
  };
  explicit FaultInjector(Hooks hooks);
  ~FaultInjector();

  static bool is_knob(const std::string &key);
  int set(const std::string &key, const std::string &value);
  // Before the engine connects: -ECONNREFUSED (reason set) while refuse is armed, else 0.
  int on_connect();
  // Before the engine sees an operation. false: the engine gets it now. true: the injector took
  // it (completed it with the fault, or holds it for a delay or a drop).
  bool intercept(const std::shared_ptr<Op> &op);
  // The transport disconnects: held operations end with err.
  void flush(int err, const std::string &why);
  // Ends the timer thread (held operations end with -ESHUTDOWN). Before the engine goes away.
  void stop();

 private:
  enum class Fault { None, Delay, Error, Drop, Disconnect, Refuse };
  struct Held {
    std::shared_ptr<Op> op;
    bool drop;
  };
  struct Driver;  // cancel takes a held operation back
  bool take_locked(Fault f);
  void timer_loop();

  Hooks hooks_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread timer_;
  bool stopping_ = false;
  std::multimap<Clock::time_point, uint64_t> due_;
  std::map<uint64_t, Held> held_;
  Op *posting_ = nullptr;  // being handed to the engine by the timer thread (a cancel waits for it)
  std::shared_ptr<Driver> driver_;
  uint64_t next_id_ = 0;
  Fault fault_ = Fault::None;
  int64_t count_ = -1;
  int64_t delay_ms_ = 50;
  int errno_ = 5;  // EIO
};

}  // namespace libd
