#include "transports/verbs/qp_driver.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "io/ioloop.h"
#include "io/sockio.h"
#include "proto/frame.h"
#include "ibv/qp.h"

namespace libd::ibv {
namespace {
// A polling-mode tick skips while a waiter holds the driver, at most this many times in a row.
constexpr int kMaxBusyTicks = 4;
constexpr int64_t kFlushWaitMs = 3000;  // how long close() waits for the device to give requests back
constexpr int kPollBatch = 32;
// perftest signals 1 request in 100, UCX's rc transports 1 in 64 (tx_cq_moderation). Half the
// depth keeps slots turning (a completion frees half the ring while the other half is on the
// wire); a quarter, at most 16, cost 64 B reads at 128 in flight about 7 % (docs/benchmarks.md, paired A/B).
constexpr uint64_t kSignalEveryMax = 64;

std::string post_failure(int rc) { return std::string("posting to the send queue failed: ") + strerror(rc); }
}  // namespace

// The loop-side handles; freed by their close callbacks, so they may outlive the driver briefly.
struct QpDriver::Watch {
  uv_poll_t channel;
  uv_poll_t control;
  uv_timer_t timer;
  std::weak_ptr<QpDriver> driver;
  int open_handles = 0;
};

int QpDriver::create(std::shared_ptr<Device> dev, const Config &cfg, FailFn on_fail, std::shared_ptr<QpDriver> *out) {
  std::shared_ptr<QpDriver> e(new QpDriver());
  e->dev_ = std::move(dev);
  e->cfg_ = cfg;
  e->cfg_.max_sge = std::max(1, std::min(cfg.max_sge, kMaxSge));
  e->slots_.resize(size_t(cfg.depth));
  e->signal_every_ = std::max<uint64_t>(1, std::min<uint64_t>(kSignalEveryMax, uint64_t(cfg.depth) / 2));
  e->burst_.reserve(size_t(cfg.depth));
  e->on_fail_ = std::move(on_fail);
  e->channel_ = ibv_create_comp_channel(e->dev_->ctx());
  if (!e->channel_) return set_error(-errno, std::string("verbs: cannot create a completion channel: ") + strerror(errno));
  int fl = fcntl(e->channel_->fd, F_GETFL);
  fcntl(e->channel_->fd, F_SETFL, fl | O_NONBLOCK);
  e->cq_ = ibv_create_cq(e->dev_->ctx(), cfg.depth + 8, nullptr, e->channel_, 0);
  if (!e->cq_) return set_error(-ENOMEM, "verbs: cannot create a completion queue of " + std::to_string(cfg.depth + 8));
  QpShape shape;
  shape.send_depth = cfg.depth;
  shape.max_sge = e->cfg_.max_sge;
  shape.max_inline = cfg.max_inline;
  if (int rc = create_rc_qp(*e->dev_, e->cq_, shape, &e->qp_, &e->max_inline_)) return rc;
  *out = std::move(e);
  return 0;
}

QpDriver::~QpDriver() {
  if (qp_) ibv_destroy_qp(qp_);
  cm_.reset();  // disconnects the rdma_cm identifier, if set-up used one
  if (cq_) ibv_destroy_cq(cq_);
  if (channel_) ibv_destroy_comp_channel(channel_);
  if (control_fd_ >= 0) ::close(control_fd_);
}

uint64_t QpDriver::doorbells() {
  std::lock_guard<std::mutex> lk(mu_);
  return doorbells_;
}

void QpDriver::set_remote(uint64_t first, uint64_t va, uint32_t rkey, bool writable) {
  std::lock_guard<std::mutex> lk(mu_);
  remote_first_ = first, remote_va_ = va, rkey_ = rkey, writable_ = writable;
}

void QpDriver::attach_cm(std::unique_ptr<CmLink> link) { cm_ = std::move(link); }

void QpDriver::set_local(std::shared_ptr<Mr> mr) {
  std::lock_guard<std::mutex> lk(mu_);
  local_ = std::move(mr);
}

int QpDriver::notify(uint64_t value, int status, const Deadline &deadline) {
  char hdr[proto::kHeaderSize];
  proto::encode_notify(value, status, hdr);
  std::lock_guard<std::mutex> lk(notify_mu_);
  if (control_fd_ < 0) return set_error(-ENOTCONN, "the verbs connection has no control connection");
  if (int rc = send_all(control_fd_, hdr, proto::kHeaderSize, deadline))
    return set_error(rc == -ETIMEDOUT ? rc : -ECONNRESET, std::string("cannot tell the memory's owner: ") + strerror(-rc));
  return 0;
}

void QpDriver::start(int control_fd) {
  control_fd_ = control_fd;
  auto *w = new Watch();
  w->driver = shared_from_this();
  watch_ = w;
  IoLoop &loop = IoLoop::shared();
  loop.run_sync([&] {
    uv_poll_init(loop.loop(), &w->channel, channel_->fd);
    uv_poll_init_socket(loop.loop(), &w->control, control_fd);
    uv_timer_init(loop.loop(), &w->timer);
    w->channel.data = w->control.data = w->timer.data = w;
    w->open_handles = 3;
    uv_poll_start(&w->channel, UV_READABLE, [](uv_poll_t *h, int, int) {
      if (auto e = static_cast<Watch *>(h->data)->driver.lock()) e->on_channel();
    });
    uv_poll_start(&w->control, UV_READABLE | UV_DISCONNECT, [](uv_poll_t *h, int status, int events) {
      // The server sends nothing after VERBS_ACCEPT: any event is the connection ending.
      (void)status, (void)events;
      uv_poll_stop(h);
      if (auto e = static_cast<Watch *>(h->data)->driver.lock()) {
        {
          std::lock_guard<std::mutex> lk(e->mu_);
          e->breakdown_locked(-ECONNRESET, "the memory element closed the connection (grant revoked or server gone)");
        }
        e->progress(nullptr);
      }
    });
    uv_timer_start(&w->timer, [](uv_timer_t *t) {
      if (auto e = static_cast<Watch *>(t->data)->driver.lock()) e->on_tick();
    }, cfg_.tick_ms, cfg_.tick_ms);
  });
  if (!cfg_.poll_mode) arm();
}

// Asks for one event on the next completion. Armed once, it stays armed until that event: posts
// in between cost no system call for it.
void QpDriver::arm() {
  if (armed_.exchange(true)) return;
  ibv_req_notify_cq(cq_, 0);
}

// ---- building and posting -------------------------------------------------------------------

QpDriver::OpState *QpDriver::acquire_locked(const std::shared_ptr<Op> &op) {
  if (free_states_.empty()) {
    states_.push_back(std::make_unique<OpState>());
    free_states_.push_back(states_.back().get());
  }
  OpState *st = free_states_.back();
  free_states_.pop_back();
  st->op = op;
  op->set_driver_state(st);
  st->prev = nullptr;
  st->next = live_;
  if (live_) live_->prev = st;
  live_ = st;
  live_count_++;
  return st;
}

void QpDriver::retire_locked(OpState *st, DoneList *done) {
  if (st->prev) st->prev->next = st->next;
  else live_ = st->next;
  if (st->next) st->next->prev = st->prev;
  st->prev = nullptr;
  live_count_--;
  done->push(st);
}

ibv_send_wr &QpDriver::new_request_locked(Slot &slot, ibv_wr_opcode opcode) {
  ibv_send_wr &wr = slot.wr;
  wr = {};
  wr.wr_id = head_;
  wr.opcode = opcode;
  wr.sg_list = slot.sge;
  wr.wr.rdma.rkey = rkey_;
  return wr;
}

void QpDriver::build_locked(OpState *st, Slot &slot) {
  const auto &segs = st->op->segments();
  ibv_send_wr &wr = new_request_locked(slot, st->op->kind() == OpKind::Read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE);
  uint32_t len = 0;
  while (st->seg < segs.size()) {
    const Segment &s = segs[st->seg];
    if (st->seg_done == s.size) {  // finished, or empty
      st->seg++, st->seg_done = 0;
      continue;
    }
    uint64_t va = remote_va_ + (s.raddr + st->seg_done - remote_first_);
    if (wr.num_sge > 0 && (wr.wr.rdma.remote_addr + len != va || wr.num_sge == cfg_.max_sge || len >= cfg_.max_msg))
      break;  // not contiguous with this request, or it is full: the next one takes it
    if (wr.num_sge == 0) wr.wr.rdma.remote_addr = va;
    uint32_t piece = uint32_t(std::min<uint64_t>(s.size - st->seg_done, cfg_.max_msg - len));
    ibv_sge &sge = slot.sge[wr.num_sge++];
    sge.addr = uint64_t(uintptr_t(s.buf + st->seg_done));
    sge.length = piece;
    sge.lkey = local_->lkey();
    len += piece;
    st->seg_done += piece;
  }
  if (wr.opcode == IBV_WR_RDMA_WRITE && len <= uint32_t(max_inline_)) wr.send_flags = IBV_SEND_INLINE;
  slot.st = st;
  st->on_wire++;
  st->last_seq = head_++;
}

void QpDriver::pump_locked(DoneList *done) {
  if (!broken_ && !backlog_.empty() && free_slots_locked() > 0) {
    burst_.clear();
    uint64_t first = head_, covered_before = covered_;
    while (!backlog_.empty() && free_slots_locked() > 0) {
      OpState *st = backlog_.front();
      Slot &slot = slot_of(head_);
      build_locked(st, slot);
      bool ends_op = st->built();
      if (head_ - covered_ >= signal_every_ || free_slots_locked() == 0 ||
          (ends_op && (st->urgent || live_count_ < signal_every_))) {
        slot.wr.send_flags |= IBV_SEND_SIGNALED;
        covered_ = head_;
      }
      if (!burst_.empty()) burst_.back()->next = &slot.wr;
      burst_.push_back(&slot.wr);
      if (ends_op) backlog_.pop_front();  // its last piece is in a request
    }
    if (!cfg_.poll_mode && covered_ != head_) {  // nobody polls in event mode: the burst must end signalled
      burst_.back()->send_flags |= IBV_SEND_SIGNALED;
      covered_ = head_;
    }
    ibv_send_wr *bad = nullptr;
    doorbells_++;
    if (int rc = ibv_post_send(qp_, burst_.front(), &bad)) {
      // From `bad` on nothing reached the send queue: give those slots back (the newest ones).
      uint64_t unposted_from = bad ? bad->wr_id : first;
      for (uint64_t seq = unposted_from; seq < head_; seq++) {
        Slot &slot = slot_of(seq);
        OpState *st = slot.st;
        slot.st = nullptr;
        st->on_wire--;
        if (st->status == 0) st->status = -EIO, st->why = post_failure(rc);
        if (st->on_wire == 0 && st->built()) retire_locked(st, done);
      }
      head_ = unposted_from;
      // Coverage counts only what reached the queue: the last signalled request among those, or
      // what was covered before the burst. The break then fences whatever is left uncovered.
      covered_ = covered_before;
      for (uint64_t seq = unposted_from; seq > first; seq--)
        if (slot_of(seq - 1).wr.send_flags & IBV_SEND_SIGNALED) {
          covered_ = seq;
          break;
        }
      breakdown_locked(-EIO, post_failure(rc));
    }
  }
  if (broken_) {
    // Nothing will go out any more: what never reached the wire fails now.
    for (OpState *st : backlog_) {
      st->seg = st->op->segments().size();
      if (st->status == 0) st->status = broken_err_, st->why = broken_why_;
      if (st->on_wire == 0) retire_locked(st, done);
    }
    backlog_.clear();
  }
}

void QpDriver::fence_locked() {
  if (free_slots_locked() == 0) return;  // a full ring ends in a signalled request
  Slot &slot = slot_of(head_);
  slot.st = nullptr;
  // The operation the memory element's queue pair allows.
  ibv_send_wr &wr = new_request_locked(slot, writable_ ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ);
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.num_sge = 0;  // zero length: no key or address is checked (IBA C9-88)
  wr.wr.rdma.remote_addr = remote_va_;
  ibv_send_wr *bad = nullptr;
  head_++;
  doorbells_++;
  if (int rc = ibv_post_send(qp_, &wr, &bad)) {
    head_--;
    breakdown_locked(-EIO, post_failure(rc));
    return;
  }
  covered_ = head_;
}

void QpDriver::breakdown_locked(int err, const std::string &why) {
  if (broken_) return;
  broken_ = true;
  broken_err_ = err;
  broken_why_ = why;
  // Requests that completed unsignalled just before the break have no completion of their own,
  // and no later request will be signalled: a fence posted now, while the queue pair still
  // takes requests, completes (done or flushed) and stands for them. (If the device refuses it —
  // the queue pair may be in ERROR already — close() and cancel() give up on them at their
  // deadline.)
  if (covered_ < head_) fence_locked();
  break_qp(qp_);
  if (!closed_ && on_fail_) on_fail_(err, why);
}

bool QpDriver::coalesce_locked() const {
  uint64_t batch = uint64_t(std::max(cfg_.doorbell_batch, 0));
  return batch > 1 && head_ - tail_ >= batch && backlog_.size() < batch;
}

// Queues the operation's requests and posts what the depth allows (completing whatever that
// finished: a refused post). false if it completed at once (the queue pair was already broken or
// closed).
bool QpDriver::enqueue(const std::shared_ptr<Op> &op, bool urgent) {
  DoneList done;
  std::lock_guard<std::mutex> lk(mu_);
  OpState *st = acquire_locked(op);
  st->urgent = urgent;
  if (broken_ || closed_) {
    st->status = broken_ ? broken_err_ : -ECONNABORTED;
    st->why = broken_ ? broken_why_ : "the transport was closed";
    retire_locked(st, &done);
    finish_locked(done);
    return false;
  }
  backlog_.push_back(st);
  if (!urgent && coalesce_locked()) return true;  // the doorbell rings with later ones
  pump_locked(&done);
  // A synchronous caller in polling mode polls at once, in this hold of the lock: over rxe the
  // doorbell's system call has usually carried the request to its completion already.
  if (urgent && cfg_.poll_mode) drain_locked(&done, nullptr);
  finish_locked(done);
  return true;
}

void QpDriver::post(const std::shared_ptr<Op> &op) { submit(op, false); }

void QpDriver::submit(const std::shared_ptr<Op> &op, bool urgent) {
  // Polling mode: whoever waits for it drives progress; the loop still sees the channel as a
  // backstop. Event mode: a waiter looks once before it sleeps (over rxe the completion is often
  // in the queue already, and the loop thread's event would cost two wake-ups), and that look
  // rings for operations waiting for their doorbell too.
  op->set_driver(weak_from_this(), cfg_.poll_mode, true);
  bool queued = enqueue(op, urgent);
  // Polling mode asks for no events: an event per completion would wake the loop thread and cost
  // a system call to re-arm, for every operation. Waiters and libd_op_poll drive progress; the
  // deadline tick (Config::tick_ms) completes what nobody waits for.
  if (!queued || cfg_.poll_mode || armed_.load(std::memory_order_relaxed)) return;
  arm();
  progress(nullptr);  // a completion that landed before the arm raised no event: look once
}

void QpDriver::run(const std::shared_ptr<Op> &op) {
  if (!cfg_.poll_mode) {
    submit(op, true);
    return;
  }
  op->set_driver(weak_from_this(), true);
  enqueue(op, true);
  for (unsigned round = 1; !op->done(); round++) {
    progress(nullptr);
    if (op->done()) break;
    if (round % Op::kRoundsPerClockRead == 0 && op->deadline().expired()) {
      check_deadlines();
      break;
    }
  }
}

bool QpDriver::start_direct(OpKind kind, const Segment &seg, uint64_t *seq, bool *pending, int *rc, std::string *why) {
  std::lock_guard<std::mutex> lk(mu_);
  // Behind waiting operations it would overtake them (the general path rings for them first).
  if (!cfg_.poll_mode || direct_busy_ || broken_ || closed_ || !backlog_.empty() || free_slots_locked() == 0 ||
      seg.size > cfg_.max_msg || !local_)
    return false;
  Slot &slot = slot_of(head_);
  ibv_send_wr &wr = new_request_locked(slot, kind == OpKind::Read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE);
  wr.send_flags = IBV_SEND_SIGNALED;
  if (kind == OpKind::Write && seg.size <= uint64_t(max_inline_)) wr.send_flags |= IBV_SEND_INLINE;
  wr.num_sge = 1;
  slot.sge[0] = {uint64_t(uintptr_t(seg.buf)), uint32_t(seg.size), local_->lkey()};
  wr.wr.rdma.remote_addr = remote_va_ + (seg.raddr - remote_first_);
  slot.st = &direct_;
  direct_busy_ = true;
  direct_.on_wire = 1;
  direct_.status = 0;
  direct_.why.clear();
  uint64_t covered_before = covered_;
  *seq = head_++;
  covered_ = head_;
  doorbells_++;
  ibv_send_wr *bad = nullptr;
  if (int err = ibv_post_send(qp_, &wr, &bad)) {
    head_--;
    covered_ = covered_before;
    slot.st = nullptr;
    direct_.on_wire = 0;
    direct_busy_ = false;
    *why = post_failure(err);
    *rc = -EIO;
    *pending = false;
    breakdown_locked(-EIO, *why);
    return true;
  }
  // Over rxe the doorbell's system call has usually carried the request to its completion already.
  DoneList done;
  drain_locked(&done, nullptr);
  finish_locked(done);
  *pending = tail_ <= *seq;
  *rc = *pending ? 0 : direct_outcome_locked(why);
  return true;
}

int QpDriver::direct_outcome_locked(std::string *why) {
  int rc = direct_.status;
  if (rc) *why = std::move(direct_.why);
  direct_busy_ = false;
  return rc;
}

int QpDriver::finish_direct(uint64_t seq, Deadline deadline, std::string *why) {
  bool reset = false;
  Deadline flush_deadline = deadline;
  for (unsigned round = 1;; round++) {
    std::lock_guard<std::mutex> lk(mu_);
    if (tail_ <= seq) progress_locked(nullptr);
    // Given back: completed, flushed, or forgotten by close() (which set the status).
    if (tail_ > seq) return direct_outcome_locked(why);
    if (round % Op::kRoundsPerClockRead != 0) continue;
    if (!reset && deadline.expired()) {
      breakdown_locked(-ETIMEDOUT, "an operation did not complete within its deadline (the queue pair was reset)");
      reset = true;
      flush_deadline = Deadline::after_ms(kFlushWaitMs);
    } else if (reset && flush_deadline.expired()) {
      // The device never gave the request back: the direct state stays taken (later calls take
      // the general path) and the driver is broken; recover builds a new one.
      *why = "an operation did not complete within its deadline, and the device did not give it back after the reset";
      return -ETIMEDOUT;
    }
  }
}

void QpDriver::progress(Op *waiting) {
  std::lock_guard<std::mutex> lk(mu_);
  progress_locked(waiting);
}

void QpDriver::progress_locked(Op *waiting, Op *keep) {
  DoneList done;
  drain_locked(&done, waiting);
  finish_locked(done, keep);
}

// ---- completions ----------------------------------------------------------------------------

void QpDriver::drain_locked(DoneList *done, Op *waiting) {
  ibv_wc wc[kPollBatch];
  bool any = false;
  for (;;) {
    int n = ibv_poll_cq(cq_, kPollBatch, wc);
    if (n <= 0) break;
    any = true;
    for (int i = 0; i < n; i++) complete_through_locked(wc[i], done);
    if (n < kPollBatch) break;
  }
  if (!any && waiting) {
    // Nothing came: if the waiter's operation ended in a request that no signalled one follows,
    // no completion will ever say so. The state is checked to still be this operation's.
    auto *st = static_cast<OpState *>(waiting->driver_state());
    if (!broken_ && st && st->op.get() == waiting && st->built() && st->on_wire > 0 && !covered_locked(st))
      fence_locked();
  }
  pump_locked(done);
}

void QpDriver::complete_through_locked(const ibv_wc &wc, DoneList *done) {
  if (wc.wr_id < tail_ || wc.wr_id >= head_) return;  // given back by close() already
  for (uint64_t seq = tail_; seq <= wc.wr_id; seq++) {
    Slot &slot = slot_of(seq);
    OpState *st = slot.st;
    slot.st = nullptr;
    // Requests before the one completed succeeded: an error always completes, and first.
    if (seq == wc.wr_id && wc.status != IBV_WC_SUCCESS && (!st || st->status == 0)) {
      int err = broken_err_;
      std::string why = broken_why_;
      if (wc.status != IBV_WC_WR_FLUSH_ERR || !broken_) {
        // Access: the key does not cover the range, lacks the right, or was revoked. Invalid
        // request: the server's queue pair does not allow the operation at all (read-only).
        bool access = wc.status == IBV_WC_REM_ACCESS_ERR || wc.status == IBV_WC_REM_INV_REQ_ERR;
        err = access ? -EACCES : -EIO;
        why = std::string("work completion error: ") + ibv_wc_status_str(wc.status) +
              (access ? " (the memory element's key does not allow this range or operation, or was revoked)"
               : wc.status == IBV_WC_RETRY_EXC_ERR ? " (the peer stopped answering)" : "");
        breakdown_locked(err, why);  // a fence's error too: the device has broken the queue pair
      }
      if (st) st->status = err, st->why = std::move(why);
    }
    if (!st) continue;  // a fence
    if (st == &direct_) {  // its caller sees it given back (tail_ passes it)
      st->on_wire--;
      continue;
    }
    if (--st->on_wire == 0 && st->built()) retire_locked(st, done);
  }
  tail_ = wc.wr_id + 1;
}

// Completes what `done` holds (except `keep`, which Op::cancel completes) and returns the
// states to the free list. Completing is lock-free and calls nothing back (Op::complete), so it
// is done under mu_, in the same hold as the drain that found the completions.
void QpDriver::finish_locked(DoneList &done, Op *keep) {
  for (OpState *st = done.head, *next; st; st = next) {
    next = st->next;
    if (st->op.get() != keep) st->op->complete(st->status, std::move(st->why));
    recycle_locked(st);  // the operation may go with its state's reference
  }
  done = DoneList();
}

void QpDriver::recycle_locked(OpState *st) {
  st->op.reset();
  st->seg = 0, st->seg_done = 0, st->on_wire = 0, st->last_seq = 0;
  st->urgent = false;
  st->status = 0;
  st->why.clear();
  st->prev = st->next = nullptr;
  free_states_.push_back(st);
}

void QpDriver::on_channel() {
  ibv_cq *cq;
  void *ctx;
  while (ibv_get_cq_event(channel_, &cq, &ctx) == 0) {
    ibv_ack_cq_events(cq, 1);
    events_.fetch_add(1, std::memory_order_relaxed);
  }
  armed_.store(false);
  if (!cfg_.poll_mode) arm();  // polling mode: see post()
  progress(nullptr);
}

void QpDriver::check_deadlines() {
  std::lock_guard<std::mutex> lk(mu_);
  check_deadlines_locked();
}

void QpDriver::check_deadlines_locked() {
  // Operations nobody waits for: coalesced doorbells ring (in event mode the backstop, in polling
  // mode the only ringer), whatever ended unsignalled gets a fence (polling mode), and a tick for
  // its completion to come before its deadline is judged. Then a round of progress completes what
  // the fence or a break brought back.
  // Read before the pump: what the pump sends now counts as just sent, like what the fence covers.
  uint64_t covered_before = covered_;
  DoneList done;
  pump_locked(&done);
  if (cfg_.poll_mode && !broken_ && tail_ < head_ && covered_ < head_) fence_locked();
  for (OpState *st = live_; st; st = st->next) {
    bool just_fenced = st->built() && st->on_wire > 0 && st->last_seq >= covered_before;
    if (!just_fenced && st->op->deadline().expired()) {
      breakdown_locked(-ETIMEDOUT, "an operation did not complete within its deadline (the queue pair was reset)");
      break;
    }
  }
  drain_locked(&done, nullptr);
  finish_locked(done);
}

// The loop's timer. In polling mode a waiter may hold mu_ most of the time: it spins on the
// completion queue, and a post holds mu_ across the doorbell (a system call, with Soft-RoCE's
// whole request path in it). A tick that blocked there would queue the loop thread on mu_, and
// every unlock of the waiter's would then be a futex wake-up it pays for, a convoy that lasts
// until the loop thread happens to win. So a busy tick is skipped (the waiter is making progress,
// and checks its own deadline), though not more than kMaxBusyTicks times in a row: operations
// nobody waits for still get their fence and their deadline.
void QpDriver::on_tick() {
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock()) {
    if (cfg_.poll_mode && ++busy_ticks_ < kMaxBusyTicks) return;
    lk.lock();
  }
  busy_ticks_ = 0;
  check_deadlines_locked();
}

// Once the queue pair is in ERROR the device hands every posted request back as a flush
// completion: drain until `returned` (checked under mu_) holds or the deadline passes, completing
// what comes back — except `keep`, which Op::cancel completes.
void QpDriver::await_flush(Deadline deadline, const std::function<bool()> &returned, Op *keep) {
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      progress_locked(nullptr, keep);
      if (returned()) return;
    }
    if (deadline.expired()) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

QpDriver::OpState *QpDriver::state_of_locked(Op *op) const {
  auto *st = static_cast<OpState *>(op->driver_state());
  return st && st->op.get() == op ? st : nullptr;
}

// Requests not yet built are simply dropped; with none on the wire either, so is the operation.
bool QpDriver::withdraw_locked(OpState *st) {
  for (auto b = backlog_.begin(); b != backlog_.end(); ++b) {
    if (*b == st) {
      backlog_.erase(b);
      break;
    }
  }
  st->seg = st->op->segments().size();
  if (st->on_wire > 0) return false;
  DoneList dropped;
  retire_locked(st, &dropped);
  recycle_locked(st);
  return true;
}

void QpDriver::cancel(Op *op) {
  Deadline deadline = Deadline::after_ms(kFlushWaitMs);
  {
    // One that still waits for its doorbell (coalesced, or behind a full ring) has nothing on
    // the wire: withdrawn before the progress below would post it, only to reset the queue pair
    // under everything else.
    std::lock_guard<std::mutex> lk(mu_);
    OpState *st = state_of_locked(op);
    if (!st || (st->on_wire == 0 && withdraw_locked(st))) return;
  }
  progress(op);  // it may have finished on the wire already: then nothing needs resetting
  {
    std::lock_guard<std::mutex> lk(mu_);
    OpState *st = state_of_locked(op);
    if (!st || withdraw_locked(st)) return;
    breakdown_locked(-ECANCELED, "an operation was cancelled while on the wire (RDMA cannot withdraw a posted request; the queue pair was reset)");
  }
  // Wait until the device has given back every request of this operation.
  await_flush(deadline, [&] {
    for (uint64_t seq = tail_; seq < head_; seq++)
      if (OpState *st = slot_of(seq).st; st && st->op.get() == op) return false;
    return true;
  }, op);
}

void QpDriver::close(int err, const std::string &why) {
  Deadline deadline = Deadline::after_ms(kFlushWaitMs);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    breakdown_locked(err, why);
    closed_ = true;
  }
  await_flush(deadline, [&] { return tail_ == head_; }, nullptr);
  DoneList rest;
  {
    std::lock_guard<std::mutex> lk(mu_);
    // What the device did not give back in time: its slots are forgotten, its operations fail.
    backlog_.clear();
    for (Slot &s : slots_) s.st = nullptr;
    tail_ = covered_ = head_;  // a late completion of theirs is ignored (wr_id < tail_)
    if (direct_.on_wire > 0) {
      direct_.on_wire = 0;
      if (direct_.status == 0) direct_.status = err, direct_.why = why;
    }
    while (OpState *st = live_) {
      if (st->status == 0) st->status = err, st->why = why;
      retire_locked(st, &rest);
    }
    finish_locked(rest);
  }
  if (Watch *w = watch_) {
    watch_ = nullptr;
    IoLoop::shared().run_sync([w] {
      auto done = [](uv_handle_t *h) {
        auto *w = static_cast<Watch *>(h->data);
        if (--w->open_handles == 0) delete w;
      };
      w->driver.reset();
      uv_close(reinterpret_cast<uv_handle_t *>(&w->channel), done);
      uv_close(reinterpret_cast<uv_handle_t *>(&w->control), done);
      uv_close(reinterpret_cast<uv_handle_t *>(&w->timer), done);
    });
  }
  // Events raised but not yet taken must be acknowledged before the CQ can be destroyed.
  ibv_cq *cq;
  void *ctx;
  while (ibv_get_cq_event(channel_, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
}

}  // namespace libd::ibv
