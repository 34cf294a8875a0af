// The transport base: identity, the state machine (INIT -> INITD -> READY, ERROR, TERMINATED),
// local buffer registration, bounds and rights checks, deadlines and counters. Implementations
// (local, shm, tcp, fake, verbs, servers) override the do_* hooks; every hook they leave out
// answers -EOPNOTSUPP instead of crashing.
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
  uint64_t busy_ns() const { return stats_->busy_ns(); }
  int64_t timeout_ms() const { return timeout_ms_; }

  // ---- rdma (client) ----
  int reg(size_t size, void **buf);
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

  // ---- rdma_server ----
  virtual int serve() { return unsupported("serve"); }
  virtual int stop() { return unsupported("stop"); }
  virtual int grant(const std::string &client, uint64_t offset, uint64_t length, unsigned rights,
                    std::string *config) {
    (void)client, (void)offset, (void)length, (void)rights, (void)config;
    return unsupported("grant");
  }
  virtual int revoke(const std::string &grant_id) { (void)grant_id; return unsupported("revoke"); }
  // Caller-owned memory served in place, grants with an element and an expiry, and the owner's
  // side of notify() (see libd.h: libd_trdma_server_expose and what follows it).
  virtual int expose(const std::string &element, void *base, uint64_t size) {
    (void)element, (void)base, (void)size;
    return unsupported("expose");
  }
  virtual int withdraw(const std::string &element) { (void)element; return unsupported("withdraw"); }
  struct GrantSpec {
    std::string element;  // "" : the transport's own element
    std::string client;
    uint64_t offset = 0, length = 0;
    unsigned rights = 0;
    uint64_t ttl_ms = 0;
    std::string id, secret;  // "": made by the server (given: a grant restored after a restart)
  };
  virtual int grant_spec(const GrantSpec &spec, std::string *config) {
    (void)spec, (void)config;
    return unsupported("grant");
  }
  // Memory hosting: elements of the server's own, and what it serves (libd_trdma_server_add_element
  // and libd_trdma_server_query).
  virtual int add_element(const std::string &element, uint64_t size) {
    (void)element, (void)size;
    return unsupported("add_element");
  }
  struct ServerSummary {
    uint64_t used_bytes = 0, capacity = UINT64_MAX, connections = 0;
    bool verbs = false;
    std::string verbs_device;
  };
  virtual int query(ServerSummary *out) { (void)out; return unsupported("query"); }
  virtual int wait_notify(const std::string &grant_id, uint64_t *value, int *status, int timeout_ms) {
    (void)grant_id, (void)value, (void)status, (void)timeout_ms;
    return unsupported("wait_notify");
  }
  virtual int watch_notify(const std::string &grant_id, int fd, bool add) {
    (void)grant_id, (void)fd, (void)add;
    return unsupported("watch_notify");
  }
  int serve_blocking();

 protected:
  // Hooks. do_init validates params_ (held stable while it runs). do_connect establishes the
  // connection before `deadline` and calls set_remote(). do_disconnect tears it down and must
  // complete every pending operation. do_post starts an operation (already validated) and
  // completes it now or later; it runs under a shared I/O lock that do_disconnect excludes.
  virtual int do_init() { return 0; }
  virtual bool configured() const { return true; }  // enough params to init without config?
  virtual int do_connect(Deadline deadline) { (void)deadline; return unsupported("connect"); }
  // The connect an operation makes for itself (the transport was not READY yet). An engine that
  // can queue the operation behind its handshake answers before the server has (READY at once)
  // and gives the verdict to do_settle(); by default it is do_connect.
  virtual int do_connect_lazy(Deadline deadline) { return do_connect(deadline); }
  // Waits for a verdict do_connect_lazy left open; 0 once the grant is confirmed (set_remote
  // called), else the refusal (the transport then fails). Called by connect() and remote().
  virtual int do_settle(Deadline deadline) { (void)deadline; return 0; }
  virtual void do_disconnect() {}
  virtual int do_post(const std::shared_ptr<Op> &op) { (void)op; return unsupported("read/write"); }
  // A synchronous operation: by default posted like any other. An engine that can drive progress
  // in the calling thread overrides it; it may release `io` once it holds what it needs.
  virtual int do_run(const std::shared_ptr<Op> &op, std::shared_lock<IoGate> &io) {
    (void)io;
    return do_post(op);
  }
  // The direct path: a synchronous one-segment operation run without an Op object (no
  // allocation, no completion object), by an engine that completes it in the calling thread.
  // Asked only if runs_direct(). kNotDirect: not taken, nothing done, `io` still held (start()
  // takes the general path); otherwise 0 or -errno with *why. It may release `io` after posting.
  static constexpr int kNotDirect = 1;
  virtual bool runs_direct() const { return false; }
  virtual int do_run_direct(OpKind kind, const Segment &seg, std::shared_lock<IoGate> &io, Deadline deadline,
                            std::string *why) {
    (void)kind, (void)seg, (void)io, (void)deadline, (void)why;
    return kNotDirect;
  }
  virtual int do_register(char *buf, size_t size) { (void)buf, (void)size; return 0; }
  // True if do_post completes every operation before returning, without waiting (a copy).
  virtual bool completes_inline() const { return false; }
  virtual void do_terminate() {}  // servers stop here
  // Sends the notification on the connection to the owner. Called under the shared I/O lock,
  // READY; the implementation may release `io` as do_run may.
  // `last`: the holder is done with the grant (a shared connection lets go of it in the same write).
  virtual int do_notify(uint64_t value, int status, bool last, std::shared_lock<IoGate> &io, Deadline deadline) {
    (void)value, (void)status, (void)last, (void)io, (void)deadline;
    return unsupported("notify");
  }

  // For implementations: a failure found at run time (peer gone, protocol error).
  void fail(int err, const std::string &why);
  void set_message(std::string msg);
  void set_remote(uint64_t base, uint64_t length, unsigned rights);
  int unsupported(const char *what);
  // The deadline a new operation or connect gets.
  Deadline op_deadline() const { return Deadline::after_ms(timeout_ms_); }

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

  std::shared_ptr<Stats> stats_ = std::make_shared<Stats>();
};

inline Transport *from_handle(libd_transport *t) { return static_cast<Transport *>(t); }

}  // namespace libd
