// One reliable-connected queue pair and everything in flight on it.
//
// An operation becomes work requests: each segment is cut at the device's message limit (or the
// max_msg key), and remote-contiguous segments of a batch share one request as a gather/scatter
// list (up to the device's SGE limit). Up to `depth` requests are on the wire; the rest wait in
// order and go out as completions free their slots, each burst with one ibv_post_send (one
// doorbell). Every request is signalled, so a completion frees exactly its slot.
//
// Completions are event-driven: the completion channel's descriptor sits in the shared libuv
// loop, which re-arms the queue and polls it. In polling mode a synchronous caller spins on the
// completion queue itself instead — no thread hand-off, lowest latency, one core busy.
//
// Failures: a work completion in error, a refused post, the control connection closing (revoke,
// dead server) or an operation past its deadline break the queue pair (to ERROR: everything
// posted is flushed back) and report once through FailFn. A cancelled operation still on the
// wire does the same, as RDMA has no way to withdraw a posted request.
#pragma once
#include <infiniband/verbs.h>
#include <uv.h>

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/op.h"
#include "verbs/cm.h"
#include "verbs/device.h"

namespace libd::verbs {

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  struct Config {
    int depth = 64;
    uint32_t max_msg = 1u << 30;
    int max_sge = 16;
    bool poll_mode = false;
  };
  using FailFn = std::function<void(int err, const std::string &why)>;

  // Completion channel, completion queue and queue pair (RESET state). 0 or -errno + last_error.
  static int create(std::shared_ptr<Device> dev, const Config &cfg, FailFn on_fail, std::shared_ptr<Engine> *out);
  ~Engine();

  ibv_qp *qp() const { return qp_; }
  // Where the remote range is: element offset `first` is virtual address `va` under `rkey`.
  void set_remote(uint64_t first, uint64_t va, uint32_t rkey);
  void set_local(std::shared_ptr<Mr> mr);
  // The rdma_cm identifier the queue pair was connected with: it lives as long as the engine.
  void attach_cm(std::unique_ptr<CmLink> link);
  // Watches the completion channel and the control socket (whose closing means the grant or the
  // server is gone) on the shared loop; the engine closes control_fd when it is destroyed.
  void start(int control_fd);

  void post(const std::shared_ptr<Op> &op);
  // Synchronous: polling mode spins here until done or the deadline; event mode = post().
  void run(const std::shared_ptr<Op> &op);
  void cancel(Op *op);
  // Breaks the queue pair, waits (bounded) until the device gives every request back, fails what
  // is left with err/why and stops watching. Idempotent. Never called on the loop thread.
  void close(int err, const std::string &why);

 private:
  struct OpState {
    std::shared_ptr<Op> op;
    int wrs_left = 0;
    int status = 0;
    std::string why;
  };
  struct Wr {
    std::shared_ptr<OpState> st;
    uint64_t va = 0;
    uint32_t len = 0;
    std::vector<ibv_sge> sges;
  };
  struct Watch;

  Engine() = default;
  bool enqueue(const std::shared_ptr<Op> &op, std::vector<std::shared_ptr<OpState>> *done);
  void build_locked(const std::shared_ptr<OpState> &st);
  void pump_locked(std::vector<std::shared_ptr<OpState>> *done);
  void drain(std::vector<std::shared_ptr<OpState>> *done);
  void finish(std::vector<std::shared_ptr<OpState>> &done, Op *keep = nullptr);
  void await_flush(Deadline deadline, const std::function<bool()> &returned, Op *keep);
  void on_channel();
  void check_deadlines();
  void breakdown_locked(int err, const std::string &why);
  void arm();

  std::shared_ptr<Device> dev_;
  Config cfg_;
  FailFn on_fail_;
  ibv_comp_channel *channel_ = nullptr;
  ibv_cq *cq_ = nullptr;
  ibv_qp *qp_ = nullptr;
  int control_fd_ = -1;
  std::unique_ptr<CmLink> cm_;
  Watch *watch_ = nullptr;
  std::atomic<bool> armed_{false};

  std::mutex mu_;
  std::shared_ptr<Mr> local_;
  uint64_t remote_first_ = 0, remote_va_ = 0;
  uint32_t rkey_ = 0;
  uint64_t next_wr_id_ = 1;
  std::unordered_map<uint64_t, std::shared_ptr<OpState>> posted_;  // by wr_id
  std::deque<Wr> backlog_;
  std::vector<ibv_send_wr> post_scratch_;  // under mu_
  std::unordered_map<Op *, std::shared_ptr<OpState>> live_;  // not yet complete
  bool broken_ = false;
  int broken_err_ = 0;
  std::string broken_why_;
  bool closed_ = false;
};

}  // namespace libd::verbs
