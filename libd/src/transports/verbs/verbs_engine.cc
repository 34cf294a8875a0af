#include "transports/verbs/verbs_engine.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "io/ioloop.h"
#include "verbs/qp.h"

namespace libd::verbs {
namespace {
constexpr uint64_t kDeadlineTickMs = 50;
constexpr int64_t kFlushWaitMs = 3000;  // how long close() waits for the device to give requests back
constexpr int kPollBatch = 32;
}  // namespace

// The loop-side handles; freed by their close callbacks, so they may outlive the engine briefly.
struct Engine::Watch {
  uv_poll_t channel;
  uv_poll_t control;
  uv_timer_t timer;
  std::weak_ptr<Engine> engine;
  int open_handles = 0;
};

int Engine::create(std::shared_ptr<Device> dev, const Config &cfg, FailFn on_fail, std::shared_ptr<Engine> *out) {
  std::shared_ptr<Engine> e(new Engine());
  e->dev_ = std::move(dev);
  e->cfg_ = cfg;
  e->on_fail_ = std::move(on_fail);
  e->channel_ = ibv_create_comp_channel(e->dev_->ctx());
  if (!e->channel_) return set_error(-errno, std::string("verbs: cannot create a completion channel: ") + strerror(errno));
  int fl = fcntl(e->channel_->fd, F_GETFL);
  fcntl(e->channel_->fd, F_SETFL, fl | O_NONBLOCK);
  e->cq_ = ibv_create_cq(e->dev_->ctx(), cfg.depth + 8, nullptr, e->channel_, 0);
  if (!e->cq_) return set_error(-ENOMEM, "verbs: cannot create a completion queue of " + std::to_string(cfg.depth + 8));
  QpShape shape;
  shape.send_depth = cfg.depth;
  shape.max_sge = cfg.max_sge;
  if (int rc = create_rc_qp(*e->dev_, e->cq_, shape, &e->qp_)) return rc;
  *out = std::move(e);
  return 0;
}

Engine::~Engine() {
  if (qp_) ibv_destroy_qp(qp_);
  cm_.reset();  // disconnects the rdma_cm identifier, if set-up used one
  if (cq_) ibv_destroy_cq(cq_);
  if (channel_) ibv_destroy_comp_channel(channel_);
  if (control_fd_ >= 0) ::close(control_fd_);
}

void Engine::set_remote(uint64_t first, uint64_t va, uint32_t rkey) {
  std::lock_guard<std::mutex> lk(mu_);
  remote_first_ = first, remote_va_ = va, rkey_ = rkey;
}

void Engine::attach_cm(std::unique_ptr<CmLink> link) { cm_ = std::move(link); }

void Engine::set_local(std::shared_ptr<Mr> mr) {
  std::lock_guard<std::mutex> lk(mu_);
  local_ = std::move(mr);
}

void Engine::start(int control_fd) {
  control_fd_ = control_fd;
  auto *w = new Watch();
  w->engine = shared_from_this();
  watch_ = w;
  IoLoop &loop = IoLoop::shared();
  loop.run_sync([&] {
    uv_poll_init(loop.loop(), &w->channel, channel_->fd);
    uv_poll_init_socket(loop.loop(), &w->control, control_fd);
    uv_timer_init(loop.loop(), &w->timer);
    w->channel.data = w->control.data = w->timer.data = w;
    w->open_handles = 3;
    uv_poll_start(&w->channel, UV_READABLE, [](uv_poll_t *h, int, int) {
      if (auto e = static_cast<Watch *>(h->data)->engine.lock()) e->on_channel();
    });
    uv_poll_start(&w->control, UV_READABLE | UV_DISCONNECT, [](uv_poll_t *h, int status, int events) {
      // The server sends nothing after VERBS_ACCEPT: any event is the connection ending.
      (void)status, (void)events;
      uv_poll_stop(h);
      if (auto e = static_cast<Watch *>(h->data)->engine.lock()) {
        std::vector<std::shared_ptr<OpState>> done;
        {
          std::lock_guard<std::mutex> lk(e->mu_);
          e->breakdown_locked(-ECONNRESET, "the memory element closed the connection (grant revoked or server gone)");
        }
        e->drain(&done);
        e->finish(done);
      }
    });
    uv_timer_start(&w->timer, [](uv_timer_t *t) {
      if (auto e = static_cast<Watch *>(t->data)->engine.lock()) e->check_deadlines();
    }, kDeadlineTickMs, kDeadlineTickMs);
  });
  if (!cfg_.poll_mode) arm();
}

// Asks for one event on the next completion. Armed once, it stays armed until that event: posts
// in between cost no system call for it.
void Engine::arm() {
  if (armed_.exchange(true)) return;
  ibv_req_notify_cq(cq_, 0);
}

// ---- building and posting -------------------------------------------------------------------

void Engine::build_locked(const std::shared_ptr<OpState> &st) {
  const auto &segs = st->op->segments();
  Wr cur;
  auto flush = [&] {
    if (cur.sges.empty()) return;
    cur.st = st;
    st->wrs_left++;
    backlog_.push_back(std::move(cur));
    cur = Wr();
  };
  for (const Segment &s : segs) {
    uint64_t done = 0;
    while (done < s.size) {
      uint64_t raddr = s.raddr + done;
      uint64_t va = remote_va_ + (raddr - remote_first_);
      bool contiguous = !cur.sges.empty() && cur.va + cur.len == va && int(cur.sges.size()) < cfg_.max_sge;
      if (!contiguous || cur.len >= cfg_.max_msg) flush();
      if (cur.sges.empty()) cur.va = va;
      uint64_t room = cfg_.max_msg - cur.len;
      uint32_t piece = uint32_t(std::min<uint64_t>(s.size - done, room));
      ibv_sge sge;
      sge.addr = uint64_t(uintptr_t(s.buf + done));
      sge.length = piece;
      sge.lkey = local_->lkey();
      cur.sges.push_back(sge);
      cur.len += piece;
      done += piece;
    }
  }
  flush();
}

void Engine::pump_locked(std::vector<std::shared_ptr<OpState>> *done) {
  while (!broken_ && !backlog_.empty() && int(posted_.size()) < cfg_.depth) {
    size_t n = std::min(backlog_.size(), size_t(cfg_.depth) - posted_.size());
    std::vector<ibv_send_wr> &wrs = post_scratch_;  // reused: no allocation per post
    wrs.resize(n);
    for (size_t i = 0; i < n; i++) {
      Wr &w = backlog_[i];
      ibv_send_wr &r = wrs[i];
      r = {};
      r.wr_id = next_wr_id_++;
      r.opcode = w.st->op->kind() == OpKind::Read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
      r.send_flags = IBV_SEND_SIGNALED;
      r.sg_list = w.sges.data();
      r.num_sge = int(w.sges.size());
      r.wr.rdma.remote_addr = w.va;
      r.wr.rdma.rkey = rkey_;
      r.next = i + 1 < n ? &wrs[i + 1] : nullptr;
    }
    ibv_send_wr *bad = nullptr;
    int rc = ibv_post_send(qp_, wrs.data(), &bad);
    size_t posted = rc ? size_t(bad - wrs.data()) : n;
    for (size_t i = 0; i < posted; i++) posted_[wrs[i].wr_id] = backlog_[i].st;
    backlog_.erase(backlog_.begin(), backlog_.begin() + long(posted));
    if (rc) {
      breakdown_locked(-EIO, std::string("posting to the send queue failed: ") + strerror(rc));
      break;
    }
  }
  if (broken_) {
    // Nothing will go out any more: what never reached the wire fails now.
    for (Wr &w : backlog_) {
      if (w.st->status == 0) w.st->status = broken_err_, w.st->why = broken_why_;
      if (--w.st->wrs_left == 0) done->push_back(w.st);
    }
    backlog_.clear();
  }
}

void Engine::breakdown_locked(int err, const std::string &why) {
  if (broken_) return;
  broken_ = true;
  broken_err_ = err;
  broken_why_ = why;
  break_qp(qp_);
  if (!closed_ && on_fail_) on_fail_(err, why);
}

// Queues the operation's requests and posts what the depth allows. false if it completed at
// once (the queue pair was already broken or closed).
bool Engine::enqueue(const std::shared_ptr<Op> &op, std::vector<std::shared_ptr<OpState>> *done) {
  std::lock_guard<std::mutex> lk(mu_);
  auto st = std::make_shared<OpState>();
  st->op = op;
  if (broken_ || closed_) {
    st->status = broken_ ? broken_err_ : -ECONNABORTED;
    st->why = broken_ ? broken_why_ : "the transport was closed";
    done->push_back(st);
    return false;
  }
  live_[op.get()] = st;
  build_locked(st);
  pump_locked(done);
  return true;
}

void Engine::post(const std::shared_ptr<Op> &op) {
  std::vector<std::shared_ptr<OpState>> done;
  if (cfg_.poll_mode) {
    // Whoever waits for it drives progress; the loop still sees the channel as a backstop.
    std::weak_ptr<Engine> weak = weak_from_this();
    op->set_progress([weak] {
      if (auto e = weak.lock()) {
        std::vector<std::shared_ptr<OpState>> d;
        e->drain(&d);
        e->finish(d);
      }
    });
  }
  bool queued = enqueue(op, &done);
  finish(done);
  // Polling mode asks for no events: an event per completion would wake the loop thread and cost
  // a system call to re-arm, for every operation. Waiters and libd_op_poll drive progress; the
  // deadline tick (kDeadlineTickMs) completes what nobody waits for.
  if (!queued || cfg_.poll_mode || armed_.load(std::memory_order_relaxed)) return;
  arm();
  // A completion that landed before the arm raised no event: look once.
  drain(&done);
  finish(done);
}

void Engine::run(const std::shared_ptr<Op> &op) {
  if (!cfg_.poll_mode) {
    post(op);
    return;
  }
  std::vector<std::shared_ptr<OpState>> done;
  enqueue(op, &done);
  finish(done);
  for (unsigned round = 1; !op->done(); round++) {
    drain(&done);
    finish(done);
    if (op->done()) break;
    if (round % Op::kRoundsPerClockRead == 0 && op->deadline().expired()) {
      check_deadlines();
      break;
    }
  }
}

// ---- completions ----------------------------------------------------------------------------

void Engine::drain(std::vector<std::shared_ptr<OpState>> *done) {
  ibv_wc wc[kPollBatch];
  std::lock_guard<std::mutex> lk(mu_);
  for (;;) {
    int n = ibv_poll_cq(cq_, kPollBatch, wc);
    if (n <= 0) break;
    for (int i = 0; i < n; i++) {
      auto it = posted_.find(wc[i].wr_id);
      if (it == posted_.end()) continue;
      std::shared_ptr<OpState> st = std::move(it->second);
      posted_.erase(it);
      if (wc[i].status != IBV_WC_SUCCESS && st->status == 0) {
        if (wc[i].status == IBV_WC_WR_FLUSH_ERR && broken_) {
          st->status = broken_err_, st->why = broken_why_;
        } else {
          // Access: the key does not cover the range, lacks the right, or was revoked. Invalid
          // request: the server's queue pair does not allow the operation at all (read-only).
          bool access = wc[i].status == IBV_WC_REM_ACCESS_ERR || wc[i].status == IBV_WC_REM_INV_REQ_ERR;
          st->status = access ? -EACCES : -EIO;
          st->why = std::string("work completion error: ") + ibv_wc_status_str(wc[i].status) +
                    (access ? " (the memory element's key does not allow this range or operation, or was revoked)"
                     : wc[i].status == IBV_WC_RETRY_EXC_ERR ? " (the peer stopped answering)" : "");
          breakdown_locked(st->status, st->why);
        }
      }
      if (--st->wrs_left == 0) done->push_back(st);
    }
    if (n < kPollBatch) break;
  }
  pump_locked(done);
}

void Engine::finish(std::vector<std::shared_ptr<OpState>> &done, Op *keep) {
  if (done.empty()) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto &st : done) live_.erase(st->op.get());
  }
  for (auto &st : done)
    if (st->op.get() != keep) st->op->complete(st->status, st->why);
  done.clear();
}

void Engine::on_channel() {
  ibv_cq *cq;
  void *ctx;
  while (ibv_get_cq_event(channel_, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
  armed_.store(false);
  bool rearm;
  {
    std::lock_guard<std::mutex> lk(mu_);
    rearm = !cfg_.poll_mode;  // polling mode: see post()
  }
  if (rearm) arm();
  std::vector<std::shared_ptr<OpState>> done;
  drain(&done);
  finish(done);
}

void Engine::check_deadlines() {
  std::vector<std::shared_ptr<OpState>> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto &[op, st] : live_) {
      if (st->op->deadline().expired()) {
        breakdown_locked(-ETIMEDOUT, "an operation did not complete within its deadline (the queue pair was reset)");
        break;
      }
    }
  }
  drain(&done);
  finish(done);
}

// Once the queue pair is in ERROR the device hands every posted request back as a flush
// completion: drain until `returned` (checked under mu_) holds or the deadline passes, completing
// what comes back — except `keep`, which its canceller completes.
void Engine::await_flush(Deadline deadline, const std::function<bool()> &returned, Op *keep) {
  for (;;) {
    std::vector<std::shared_ptr<OpState>> done;
    drain(&done);
    finish(done, keep);
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (returned()) return;
    }
    if (deadline.expired()) return;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void Engine::cancel(Op *op) {
  Deadline deadline = Deadline::after_ms(kFlushWaitMs);
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(op);
    if (it == live_.end()) return;
    std::shared_ptr<OpState> st = it->second;
    // Requests not yet on the wire are simply dropped.
    for (auto b = backlog_.begin(); b != backlog_.end();) {
      if (b->st == st) {
        b = backlog_.erase(b);
        st->wrs_left--;
      } else {
        ++b;
      }
    }
    bool on_wire = false;
    for (auto &[id, p] : posted_) on_wire |= p == st;
    if (!on_wire) {
      live_.erase(it);
      return;
    }
    breakdown_locked(-ECANCELED, "an operation was cancelled while on the wire (RDMA cannot withdraw a posted request; the queue pair was reset)");
  }
  // Wait until the device has given back every request of this operation.
  await_flush(deadline, [&] {
    for (auto &[id, p] : posted_)
      if (p->op.get() == op) return false;
    return true;
  }, op);
}

void Engine::close(int err, const std::string &why) {
  Deadline deadline = Deadline::after_ms(kFlushWaitMs);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    breakdown_locked(err, why);
    closed_ = true;
  }
  await_flush(deadline, [&] { return posted_.empty(); }, nullptr);
  std::vector<std::shared_ptr<OpState>> rest;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto &[op, st] : live_) {
      if (st->status == 0) st->status = err, st->why = why;
      rest.push_back(st);
    }
    live_.clear();
    posted_.clear();
  }
  for (auto &st : rest) st->op->complete(st->status, st->why);
  if (Watch *w = watch_) {
    watch_ = nullptr;
    IoLoop::shared().run_sync([w] {
      auto done = [](uv_handle_t *h) {
        auto *w = static_cast<Watch *>(h->data);
        if (--w->open_handles == 0) delete w;
      };
      w->engine.reset();
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

}  // namespace libd::verbs
