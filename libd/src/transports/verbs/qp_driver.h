// One reliable-connected queue pair and everything in flight on it.
//
// An operation becomes work requests: each segment is cut at the device's message limit (or the
// max_msg key), and remote-contiguous segments of a batch share one request as a gather/scatter
// list (up to the device's SGE limit). Requests are built straight into the send slots, up to
// `depth` of them on the wire; operations that do not fit wait in order and are built as
// completions free slots, each burst posted with one ibv_post_send (one doorbell). Writes up to
// the queue pair's inline size travel in the request itself (IBV_SEND_INLINE): no local key
// lookup and no DMA read of the buffer.
//
// Selective signalling, as perftest and UCX do: a reliable connection completes its send queue in
// order, so one completion stands for every request posted before it, and only some requests ask
// for one. The slots are therefore a ring in posting order (request n in slot n % depth) and a
// completion gives back every slot up to its own. A request is signalled when it is the
// `signal_every`-th since the last signalled one, when it takes the last free slot, when it ends
// an operation someone waits on synchronously or one of only a few live ones, and (event mode)
// when it ends a burst, since no one polls there. A waiter whose operation ended in an unsignalled
// request that nothing signalled follows yet posts a zero-length signalled request (a fence);
// the deadline tick does the same for operations nobody waits for. A request in error, and every
// request flushed after it, completes whether signalled or not.
//
// The per-operation path allocates nothing: slots are preallocated, an operation's state comes
// from a free list, and the live and finished sets are lists through those states. At 64 bytes
// the device's own path is a few microseconds, so every allocation and map lookup shows.
//
// Doorbell coalescing: over rxe a doorbell is a system call, and each one that carries a READ
// also wakes ksoftirqd for nothing (the request's softirq has already run inline by the time the
// call returns): two context switches per doorbell. So when the caller is clearly pipelining (at
// least `doorbell_batch` requests on the wire), a new asynchronous operation waits in the backlog
// and the doorbell rings for `doorbell_batch` of them at once, or sooner at the next progress: a
// waiter (in event mode it looks once before it sleeps), libd_op_poll, a synchronous call, the
// loop's next completion event (event mode: requests on the wire always end signalled, so one is
// coming) or the deadline tick (the backstop, and in polling mode the only one). A request queued
// behind that many others would mostly wait on the wire anyway; libfabric's FI_MORE and
// perftest's --post_list batch the same way. Synchronous calls ring at once.
//
// The direct path: a blocking one-segment call in polling mode builds its request straight into
// a slot, marked as the driver's one direct operation, and spins for it: no Op, no shared
// pointers, no live list. Over rxe the time between the doorbell's system call returning and the
// next one is spent mostly on the code and data pages the path touches (each a translation and
// TLB refill under TCG), so fewer structures is lower latency (measured: docs/benchmarks.md).
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
#include <vector>

#include "core/op.h"
#include "ibv/cm.h"
#include "ibv/device.h"

namespace libd::ibv {

class QpDriver : public OpDriver, public std::enable_shared_from_this<QpDriver> {
 public:
  struct Config {
    int depth = 64;
    uint32_t max_msg = 1u << 30;
    int max_sge = 16;
    int max_inline = 128;  // asked of the device; it may grant less (see inline_size())
    bool poll_mode = false;
    // With at least this many requests on the wire, a new asynchronous operation's doorbell waits
    // until this many operations are waiting or something drives progress. 0 or 1: off.
    int doorbell_batch = 16;
    // How often the loop checks deadlines, fences what nobody waits for and rings waiting doorbells.
    uint64_t tick_ms = 50;
  };
  using FailFn = std::function<void(int err, const std::string &why)>;

  // Completion channel, completion queue and queue pair (RESET state). 0 or -errno + last_error.
  static int create(std::shared_ptr<Device> dev, const Config &cfg, FailFn on_fail, std::shared_ptr<QpDriver> *out);
  ~QpDriver() override;

  ibv_qp *qp() const { return qp_; }
  bool poll_mode() const { return cfg_.poll_mode; }
  // ibv_post_send calls so far (each a doorbell; on rxe, a system call), fences included.
  uint64_t doorbells();
  // Completion events the loop has taken from the channel so far (event mode).
  uint64_t events() const { return events_.load(std::memory_order_relaxed); }
  // Where the remote range is: element offset `first` is virtual address `va` under `rkey`;
  // `writable`: the grant allows writes (a fence is then a zero-length write, else a read).
  void set_remote(uint64_t first, uint64_t va, uint32_t rkey, bool writable);
  // Bytes of a write that travel inline, as the device granted.
  int inline_size() const { return max_inline_; }
  void set_local(std::shared_ptr<Mr> mr);
  // The rdma_cm identifier the queue pair was connected with: it lives as long as the driver.
  void attach_cm(std::unique_ptr<CmLink> link);
  // Watches the completion channel and the control socket (whose closing means the grant or the
  // server is gone) on the shared loop; the driver closes control_fd when it is destroyed.
  void start(int control_fd);

  // NOTIFY on the control connection (proto/frame.h): the owner learns this holder finished.
  // The caller has seen its transfers complete; on RC that means they are placed at the peer.
  int notify(uint64_t value, int status, const Deadline &deadline);

  void post(const std::shared_ptr<Op> &op);
  // Synchronous: polling mode spins here until done or the deadline; event mode = post().
  void run(const std::shared_ptr<Op> &op);
  // The direct path (polling mode): a synchronous one-segment operation that fits one request
  // runs without an Op object, its state in the driver (one at a time). start_direct posts it
  // signalled and polls once; false if it is not taken (another direct one runs, operations wait
  // in the backlog, the ring is full, the driver is broken, or it needs splitting): the general
  // path runs it. If that one poll found it given back, *pending is false and *rc its outcome
  // (0 or -errno with *why); otherwise finish_direct spins until the request is
  // given back, or resets the queue pair at `deadline` and waits (bounded) for the flush.
  bool start_direct(OpKind kind, const Segment &seg, uint64_t *seq, bool *pending, int *rc, std::string *why);
  int finish_direct(uint64_t seq, Deadline deadline, std::string *why);
  void cancel(Op *op) override;
  // One round of caller-driven progress (polling mode): completions in, waiting requests out,
  // and a fence if `waiting` ended in an unsignalled request nothing signalled follows.
  void progress(Op *waiting) override;
  // Breaks the queue pair, waits (bounded) until the device gives every request back, fails what
  // is left with err/why and stops watching. Idempotent. Never called on the loop thread.
  void close(int err, const std::string &why);

 private:
  static constexpr int kMaxSge = 16;
  struct OpState {
    std::shared_ptr<Op> op;
    size_t seg = 0;         // building: the next segment to put in a request
    uint64_t seg_done = 0;  //   and how much of it is already in one
    int on_wire = 0;        // requests posted and not yet completed
    uint64_t last_seq = 0;  // the sequence number of its latest request
    bool urgent = false;    // a synchronous caller waits: its last request is signalled
    int status = 0;
    std::string why;
    OpState *prev = nullptr, *next = nullptr;  // the live list while running, the done list after
    bool built() const { return seg == op->segments().size(); }
  };
  struct Slot {  // one send-queue entry; wr_id is the request's sequence number
    OpState *st = nullptr;  // null for a fence
    ibv_send_wr wr;
    ibv_sge sge[kMaxSge];
  };
  struct DoneList {  // finished states, in order, through `next`
    OpState *head = nullptr;
    OpState **tail = &head;
    void push(OpState *st) {
      st->next = nullptr;
      *tail = st;
      tail = &st->next;
    }
  };
  struct Watch;

  QpDriver() = default;
  // An operation's state from the free list, linked into the live list. Under mu_.
  OpState *acquire_locked(const std::shared_ptr<Op> &op);
  // Off the live list and onto `done`. Under mu_.
  void retire_locked(OpState *st, DoneList *done);
  // Cleared and back on the free list. Under mu_.
  void recycle_locked(OpState *st);
  // Its state, if `op` is live on this driver. Under mu_.
  OpState *state_of_locked(Op *op) const;
  // Drops what of `st` is not yet built; true if nothing of it was on the wire either and the
  // state went back (the caller completes the operation). Under mu_.
  bool withdraw_locked(OpState *st);
  // The direct operation's outcome, once tail_ has passed it; frees the direct state. Under mu_.
  int direct_outcome_locked(std::string *why);
  bool enqueue(const std::shared_ptr<Op> &op, bool urgent);
  void submit(const std::shared_ptr<Op> &op, bool urgent);
  // Whether a new asynchronous operation's doorbell waits (see doorbell coalescing). Under mu_.
  bool coalesce_locked() const;
  // The slot's request, cleared and numbered head_, with `opcode`, the slot's SGE list and the
  // remote key; the caller fills in the rest. Under mu_.
  ibv_send_wr &new_request_locked(Slot &slot, ibv_wr_opcode opcode);
  // Fills one free slot with the next request of `st`. Under mu_.
  void build_locked(OpState *st, Slot &slot);
  void pump_locked(DoneList *done);
  // Gives back the slots of requests [tail_, seq], which completed (the last with `wc`). Under mu_.
  void complete_through_locked(const ibv_wc &wc, DoneList *done);
  // Posts a zero-length signalled request so that everything before it completes. Under mu_.
  void fence_locked();
  bool covered_locked(const OpState *st) const { return st->last_seq < covered_; }
  size_t free_slots_locked() const { return slots_.size() - size_t(head_ - tail_); }
  Slot &slot_of(uint64_t seq) { return slots_[size_t(seq % slots_.size())]; }
  void drain_locked(DoneList *done, Op *waiting);
  // progress() under mu_: drain, then finish what it found (except `keep`).
  void progress_locked(Op *waiting, Op *keep = nullptr);
  void finish_locked(DoneList &done, Op *keep = nullptr);
  void await_flush(Deadline deadline, const std::function<bool()> &returned, Op *keep);
  void on_channel();
  void check_deadlines();
  void check_deadlines_locked();
  void on_tick();
  void breakdown_locked(int err, const std::string &why);
  void arm();

  std::shared_ptr<Device> dev_;
  Config cfg_;
  FailFn on_fail_;
  ibv_comp_channel *channel_ = nullptr;
  ibv_cq *cq_ = nullptr;
  ibv_qp *qp_ = nullptr;
  int control_fd_ = -1;
  std::mutex notify_mu_;  // one NOTIFY at a time on control_fd_
  std::unique_ptr<CmLink> cm_;
  Watch *watch_ = nullptr;
  std::atomic<bool> armed_{false};
  std::atomic<uint64_t> events_{0};
  int busy_ticks_ = 0;  // polling-mode ticks in a row that found mu_ taken (the loop thread's)

  std::mutex mu_;
  std::shared_ptr<Mr> local_;
  uint64_t remote_first_ = 0, remote_va_ = 0;
  uint32_t rkey_ = 0;
  bool writable_ = false;
  int max_inline_ = 0;                   // as granted by the device
  uint64_t signal_every_ = 1;
  std::vector<Slot> slots_;              // a ring of depth slots, in posting order
  uint64_t head_ = 0;                    // sequence number of the next request
  uint64_t tail_ = 0;                    //   and of the oldest one not given back
  uint64_t covered_ = 0;                 // requests before this one have a signalled one after them
  uint64_t doorbells_ = 0;
  std::vector<ibv_send_wr *> burst_;     // the requests of one post, in order; reused
  std::deque<OpState *> backlog_;        // not fully built yet, in order
  std::vector<std::unique_ptr<OpState>> states_;  // every state ever made
  std::vector<OpState *> free_states_;
  OpState direct_;                       // the direct operation's (op stays null)
  bool direct_busy_ = false;             //   taken, until its caller has its outcome
  OpState *live_ = nullptr;              // not yet complete
  size_t live_count_ = 0;
  bool broken_ = false;
  int broken_err_ = 0;
  std::string broken_why_;
  bool closed_ = false;
};

}  // namespace libd::ibv
