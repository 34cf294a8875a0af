// The transport base: identity, the state machine (INIT -> INITD -> READY, ERROR, TERMINATED),
// local buffer registration, bounds and rights checks, deadlines and counters. Implementations
// (local, shm, tcp, fake, verbs) override the do_* hooks, grouped below by stage, and declare what
// they can do once (caps()); every hook they leave out answers -EOPNOTSUPP instead of crashing.
// A transport that serves memory derives from ServerBase (core/server_base.h), which adds the
// rdma_server calls.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/fault_injector.h"
#include "core/io_gate.h"
#include "core/op.h"
#include "core/params.h"
#include "core/stats.h"
#include "libd.h"

struct libd_transport {
  virtual ~libd_transport() = default;
};

namespace libd {

class Transport;

struct ImplInfo {
  const char *name;                  // canonical, Scad's: "rdma_tcp"
  std::vector<std::string> aliases;  // short: "tcp"
  int kind;                          // LIBD_KIND_*
  std::unique_ptr<Transport> (*make)();
};

struct TransportSetup {
  std::string name;
  const ImplInfo *impl;
  Params params;  // action options overlaid by the durl's pairs
  std::string aid;
};

class Transport : public libd_transport {
 public:
  Transport() = default;
  ~Transport() override;
  Transport(const Transport &) = delete;
  Transport &operator=(const Transport &) = delete;

  // Called once by the action right after construction; runs init() if the durl already carries
  // a complete configuration.
  int setup(TransportSetup s);

  const std::string &name() const { return name_; }
  const char *impl_name() const { return impl_->name; }
  int kind() const { return impl_->kind; }
  const std::string &aid() const { return aid_; }

  // ---- state machine ----
  int state();
  int wait_state(unsigned mask, int timeout_ms);
  int wait_change(uint64_t *seq, int timeout_ms);
  int init();
  int connect();
  int recover();
  int terminate();
  int configure(const Params &extra);
  std::string error_message();
  int message(std::string *out);
  virtual int set(const std::string &key, const std::string &value);
  void stats(libd_stats *out) const { stats_->snapshot(out); }
  // -EOPNOTSUPP, saying which transport does not support `what`.
  int unsupported(const char *what);
  uint64_t busy_ns() const { return stats_->busy_ns(); }
  int64_t timeout_ms() const { return timeout_ms_; }

  // ---- rdma (client) ----
  int reg(size_t size, void **buf);
  int reg_ranges(const libd_range *ranges, int n);  // several buffers at once (libd_trdma_reg_ranges)
  int remote(uint64_t *size, unsigned *rights);
  // Validates, waits for READY (up to the deadline) and posts. *out is the running operation.
  int submit(OpKind kind, Segments segs, std::shared_ptr<Op> *out);
  // submit + wait; never longer than the deadline plus a grace period.
  int run(OpKind kind, Segments segs);
  // run() only if it cannot wait (see libd_trdma_read_nowait); -EAGAIN otherwise.
  int run_nowait(OpKind kind, Segment seg);
  // Tells the memory's owner this holder finished (status 0) or gave up (status < 0), after
  // every transfer the caller already saw complete. Waits for READY like an operation.
  // last: the holder is done with the grant (libd_trdma_notify_last).
  int notify(uint64_t value, int status, bool last = false);
  // The holder is done with the grant once what it started has been answered (its last transfer
  // is under way): on a shared connection the grant is let go of behind it, in the same write
  // when a SendBatch holds the request back (libd_trdma_read_async_last). The transport moves no
  // more data afterwards; what it started still completes.
  int let_go();
  // A mapping of the memory this transport reaches, for the caller to read (and, under a writable
  // grant, write) in place (libd_trdma_map). Connects first if it must.
  int map(void **addr, uint64_t *size);


  // What the implementation can do, declared once (valid from INITD on: it may depend on the
  // parameters). The core and the bindings read it instead of probing.
  struct Caps {
    bool inline_copy = false;   // do_post completes every operation before returning (a copy in
                                // place): the *_nowait forms can move data
    bool direct = false;        // do_run_direct runs a synchronous one-segment operation in the
                                // calling thread without an Op object
    bool notify = false;        // do_notify reaches the memory's owner
    bool lazy_connect = false;  // do_connect_lazy answers before the server's verdict (do_settle)
  };
  virtual Caps caps() const { return {}; }
  // caps() as libd_transport_caps reports it (LIBD_CAP_* bits), read under the I/O lock.
  unsigned cap_bits();

 protected:
  // The rights of the grant this transport holds (LIBD_RIGHT_*), once connected.
  unsigned remote_rights() const { return remote_rights_; }

  // ---- the hooks an implementation overrides, by stage; each one left out answers -EOPNOTSUPP
  //      (or does nothing where nothing is the right answer) ----

  // Set-up. do_init validates params_ (held stable while it runs); configured() says whether the
  // durl alone carries enough to init (else init waits for libd_action_config_transport).
  virtual int do_init() { return 0; }
  virtual bool configured() const { return true; }

  // Connection. do_connect establishes the connection before `deadline` and calls set_remote();
  // do_disconnect tears it down and must complete every pending operation; do_terminate is the
  // last word (servers stop here).
  virtual int do_connect(Deadline deadline) { (void)deadline; return unsupported("connect"); }
  // The connect an operation makes for itself (the transport was not READY yet). An engine that
  // can queue the operation behind its handshake (Caps::lazy_connect) answers before the server
  // has (READY at once) and gives the verdict to do_settle(); by default it is do_connect.
  virtual int do_connect_lazy(Deadline deadline) { return do_connect(deadline); }
  // Waits for a verdict do_connect_lazy left open; 0 once the grant is confirmed (set_remote
  // called), else the refusal (the transport then fails). Called by connect() and remote().
  virtual int do_settle(Deadline deadline) { (void)deadline; return 0; }
  // After a verdict settle() took, under the shared I/O lock (it may release `io`, as do_run may),
  // with the verdict's deadline: an engine may go on with the operations that rode the handshake.
  virtual void do_settled(std::shared_lock<IoGate> &io, Deadline deadline) { (void)io; (void)deadline; }
  virtual void do_disconnect() {}
  virtual void do_terminate() {}

  // Data. do_register sees the local buffer; do_post starts an operation (already validated)
  // and completes it now or later, under a shared I/O lock that do_disconnect excludes.
  virtual int do_register(char *buf, size_t size) { (void)buf, (void)size; return 0; }
  // Several buffers (reg_ranges): engines that register nothing accept any list.
  virtual int do_register_ranges(const std::vector<libd_range> &ranges) { (void)ranges; return 0; }
  virtual int do_post(const std::shared_ptr<Op> &op) { (void)op; return unsupported("read/write"); }
  // A synchronous operation: by default posted like any other. An engine that can drive progress
  // in the calling thread overrides it; it may release `io` once it holds what it needs.
  virtual int do_run(const std::shared_ptr<Op> &op, std::shared_lock<IoGate> &io) {
    (void)io;
    return do_post(op);
  }
  // The direct path (Caps::direct): a synchronous one-segment operation run without an Op object
  // (no allocation, no completion object), completed in the calling thread. kNotDirect: not
  // taken, nothing done, `io` still held (start() takes the general path); otherwise 0 or -errno
  // with *why. It may release `io` after posting.
  static constexpr int kNotDirect = 1;
  virtual int do_run_direct(OpKind kind, const Segment &seg, std::shared_lock<IoGate> &io, Deadline deadline,
                            std::string *why) {
    (void)kind, (void)seg, (void)io, (void)deadline, (void)why;
    return kNotDirect;
  }

  // A mapping of the grant's memory of the caller's own (libd_trdma_map): engines that map the
  // memory (shm over an element's memfd) make one; the others cannot.
  virtual int do_map(void **addr, uint64_t *size);
  // The holder's word (Caps::notify): sends the notification on the connection to the owner.
  // Called under the shared I/O lock, READY; it may release `io` as do_run may. `last`: the
  // holder is done with the grant (a shared connection lets go of it in the same write).
  virtual int do_notify(uint64_t value, int status, bool last, std::shared_lock<IoGate> &io, Deadline deadline) {
    (void)value, (void)status, (void)last, (void)io, (void)deadline;
    return unsupported("notify");
  }
  // let_go(): an engine whose connection the grant is attached to says so behind the requests
  // sent (tcp's shared connection); for the others terminate does all there is to do.
  virtual int do_let_go(std::shared_lock<IoGate> &io) {
    (void)io;
    return 0;
  }

  // faults,1 is on for every transport of this implementation (`fake`: local memory with faults).
  bool faults_always_ = false;

  // For implementations: a failure found at run time (peer gone, protocol error).
  void fail(int err, const std::string &why);
  void set_message(std::string msg);
  void set_remote(uint64_t base, uint64_t length, unsigned rights);
  // The deadline a new operation or connect gets.
  Deadline op_deadline() const { return Deadline::after_ms(timeout_ms_); }
  // Blocks until the transport is stopped (TERMINATED) or back to INITD: a server's run.
  void wait_stopped();
  bool terminated();

  Params params_;
  std::string aid_;

 private:
  void transition_locked(int to);
  int ensure_ready(Deadline deadline, bool lazy = false);
  // do_run_direct with the operation counted and (when sampled) timed as an Op would be.
  int run_direct(OpKind kind, const Segment &seg, std::shared_lock<IoGate> &io, Deadline deadline);
  int connect_locked(std::unique_lock<std::mutex> &lk, Deadline deadline, bool recovering, bool lazy = false);
  int settle(Deadline deadline);  // do_settle under the I/O lock; a refusal fails the transport
  int error_locked();
  // Runs fn(io) under the shared I/O lock once the transport is READY (connecting it first if it
  // must, within the deadline).
  template <typename Fn>
  int when_ready(Deadline deadline, Fn &&fn);
  // Checks, creates and posts an operation (sync: through do_run). On success *out is set; it
  // may also be set, already completed with the error, when the post itself failed.
  int start(OpKind kind, Segments segs, bool sync, std::shared_ptr<Op> *out);
  int check_local(const Segments &segs);
  // Rights and bounds against the grant. Under the shared I/O lock (do_connect sets the grant
  // under the exclusive one).
  int check_remote(OpKind kind, const Segments &segs);
  bool grant_allows(OpKind kind) const;
  bool fits(OpKind kind, const Segments &segs) const;
  bool within_grant(const Segment &s) const;
  bool within_local(const Segment &s) const;  // inside the registered buffer
  // A new operation, counted in flight (stats_) until it completes.
  std::shared_ptr<Op> new_op(OpKind kind, Segments segs, Deadline deadline);
  void free_owned_buffer();
  void disconnect_io();  // do_disconnect, after the injected faults' held operations end
  void post_late(const std::shared_ptr<Op> &op);  // a delayed operation reaches the engine
  bool faulty() const { return faults_ != nullptr; }

  std::string name_;
  const ImplInfo *impl_ = nullptr;
  int64_t timeout_ms_ = 10000;

  std::mutex mu_;
  std::condition_variable cv_;
  int state_ = LIBD_STATE_INIT;
  std::atomic<int> state_now_{LIBD_STATE_INIT};  // state_, readable without mu_ (the operation fast path)
  uint64_t seq_ = 0;
  bool busy_ = false;  // a thread is connecting / recovering / terminating
  int error_code_ = 0;
  std::string error_msg_;
  std::string message_;

  // Remote grant, set at connect.
  uint64_t remote_base_ = 0, remote_len_ = 0;
  unsigned remote_rights_ = 0;

  // Local buffer.
  IoGate io_mu_;
  char *lbuf_ = nullptr;
  size_t lsize_ = 0;
  bool lowned_ = false;
  // reg_ranges: the buffers, by address (lbuf_, lsize_ then name the first); empty otherwise.
  std::vector<libd_range> lranges_;

  std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
  std::unique_ptr<FaultInjector> faults_;  // faults,1: between the core and the engine
};

inline Transport *from_handle(libd_transport *t) { return static_cast<Transport *>(t); }

}  // namespace libd
