// One authenticated tcp connection to a memory element.
//
// A connection is either one transport's own (its grant only) or a session shared by every
// transport of the process that reaches the same server with share,1 (proto/frame.h, "Shared
// connections"): each such transport is an attachment, with a handle its requests carry. A
// session opens with the first transport's grant (handle 0); attach() adds one more in one round
// trip, detach() lets one go; the connection stays for the next.
//
// Progress follows the leader/follower model of UCX and most RPC stacks: a synchronous caller
// that finds the connection idle sends its request and reads the answer on the socket itself, so
// a small remote read costs what a raw TCP round trip costs — no hand-off to another thread and
// back. Everything else (asynchronous operations, concurrent callers, the rest of a send the
// kernel could not take at once, a peer that hangs up while idle, deadlines) is driven by the
// shared libuv loop through a uv_poll on the same socket. One mutex guards the state; syscalls
// made under it never block (the socket is non-blocking), waits happen outside it.
#pragma once
#include <sys/socket.h>
#include <sys/uio.h>
#include <uv.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/op.h"
#include "core/send_batch.h"
#include "io/ioloop.h"
#include "proto/auth.h"
#include "proto/client_handshake.h"
#include "proto/frame.h"

namespace libd {

using TcpCredentials = proto::Credentials;

class TcpConn : public proto::FrameReader::Handler,
                public OpDriver,
                public BatchedSender,
                public std::enable_shared_from_this<TcpConn> {
 public:
  using FailFn = std::function<void(int err, const std::string &why)>;

  // Connects and authenticates in the calling thread, before the deadline. session: a shared
  // connection, whose first attachment (handle 0) is `creds`' grant; on_fail is then null and
  // the opener adds itself with add_user(0, ...).
  static int open(const sockaddr *addr, socklen_t len, const TcpCredentials &creds, Deadline deadline,
                  FailFn on_fail, std::shared_ptr<TcpConn> *out, proto::GrantBody *grant, bool session = false);
  ~TcpConn() override;

  // Starts an operation; the loop completes it. `handle`: its attachment on a session.
  void post(const std::shared_ptr<Op> &op, uint32_t handle = 0);
  // Runs an operation to completion, leading progress in this thread when the connection is idle.
  // spin_us: how long the leader polls the socket without sleeping before it blocks (a sleeper's
  // wake-up costs more than a small answer's round trip on a loaded host).
  void run(const std::shared_ptr<Op> &op, uint32_t handle = 0, uint32_t spin_us = 0);
  // Detaches an operation (cancel): on return the connection no longer touches its buffers.
  void cancel(Op *op) override;
  // The end of a SendBatch that held this connection's sends back: they go now.
  void flush_batched() override;
  // A waiter that polls (libd_op_poll) reads what the socket holds itself when nobody else is
  // reading right now: its answer is taken without the loop's thread being woken for it.
  void progress(Op *waiting) override;
  // A caller polling in a loop also runs the process's shared client loop, leased (its thread
  // parked, out of epoll_wait), so the answers it polls for wake no thread (IoLoop::progress);
  // polling_stopped gives the loop back.
  void poll_progress(Op *waiting) override;
  void polling_stopped() override;
  // A poller's look at an operation already finished counts as a look, and takes and runs the
  // loop as poll_progress does: the poller's next answers are its own to read.
  void looked(Op *op) override;
  // A polling wait returns: if an operation still running on this connection has a waiter that
  // sleeps, the loop's thread takes the loop back for it; else the lease stays (the caller's next
  // wait or poll takes it on), and lapses.
  void wait_polled(Op *op) override;
  // How long the lease lasts after a polling caller's last look (default 1 ms); set for tests.
  static void set_poll_lease_us(uint32_t us);
  static uint32_t poll_lease_us();
  // Queues a NOTIFY behind everything sent so far (it has no answer). -ENOTCONN if closed.
  // detach: and the DETACH of `handle` in the same write (its operations are all done).
  int notify(uint64_t value, int status, uint32_t handle = 0, bool detach = false);
  // Queues the DETACH of `handle` behind everything sent so far: the server lets go of the grant
  // once it has answered the handle's requests, which still complete here.
  int let_go(uint32_t handle);
  // The verdict on `handle`'s ATTACH will not be asked for (its transport ended unsettled after
  // letting go of the grant): its record goes.
  void forget_attach(uint32_t handle);
  // Closes the connection; pending operations fail with err. Waits until the loop let go of it.
  void close(int err, const std::string &why);

  // ---- sessions ----
  // One more grant on this session, before the deadline: 0 with *handle and *grant, or the
  // memory element's refusal (the session goes on). on_fail hears of the attachment's end: the
  // owner cut it (DETACHED) or the connection failed.
  int attach(const TcpCredentials &creds, Deadline deadline, FailFn on_fail, uint32_t *handle, proto::GrantBody *grant);
  // The same without waiting: the ATTACH is queued and the caller's requests may follow it at
  // once (the server takes them in order). verdict() waits for the answer; a refusal ends the
  // attachment (its requests fail with the refusal) whether or not anyone asks.
  int attach_async(const TcpCredentials &creds, FailFn on_fail, uint32_t *handle);
  // spin_us: as run()'s, when this thread reads the answer itself.
  int verdict(uint32_t handle, Deadline deadline, proto::GrantBody *grant, uint32_t spin_us = 0);
  // After the verdict, a caller that polls reads on, for spin_us at most, until the attachment's
  // operations are answered (it waits for them next): left to the loop, the rest of a large
  // transfer would wake the loop's thread in the middle of it. Nothing if another caller leads.
  void read_on(uint32_t handle, Deadline deadline, uint32_t spin_us);
  void add_user(uint32_t handle, FailFn on_fail);
  // Lets an attachment go: its operations still running end with -ECONNABORTED (on return the
  // connection no longer touches their buffers), and the server is told (DETACH).
  void detach(uint32_t handle);
  // Runs (on the shared loop) once the connection has failed: a pool forgets it.
  void set_on_dead(std::function<void()> fn);
  bool closed() const { return closed_flag_.load(std::memory_order_acquire); }
  // Every handle a session can name is used: it serves its attachments to the end, and the next
  // transport opens a new session (handles are never reused: a late answer would reach the wrong one).
  bool spent() const { return spent_flag_.load(std::memory_order_acquire); }

  int on_header(const proto::Header &h, char **dest) override;
  int on_frame(const proto::Header &h) override;

 private:
  struct OpState {
    std::shared_ptr<Op> op;
    uint32_t handle = 0;  // its attachment (sessions)
    size_t segs_left = 0;
    int queued_sends = 0;  // chunks still in sendq_ (they point into the caller's buffer)
    int error = 0;
    std::string why;
    bool finished = false;
    bool detached = false;
    Clock::time_point posted;  // when it went out: a session's liveness is judged from it
  };
  struct Pending {
    std::shared_ptr<OpState> st;
    size_t seg;
  };
  // What the kernel did not take at once, in order.
  struct Chunk {
    char hdr[proto::kHeaderSize];
    size_t hdr_off = 0;
    const char *data = nullptr;
    size_t len = 0, off = 0;
    std::shared_ptr<OpState> st;
    std::string owned;  // a control body the chunk carries itself (ATTACH)
  };
  struct Attaching {  // an ATTACH waiting for its ATTACH_OK
    bool done = false;
    int status = 0;
    std::string body;
    bool async = false;  // attach_async: the attachment runs already; the verdict is kept for verdict()
    Clock::time_point sent;
  };
  uint32_t queue_attach_locked(const TcpCredentials &creds, bool flush);  // ATTACH queued (sent if flush); its handle
  enum class Reader { None, Leader, Loop };
  using Lock = std::unique_lock<std::mutex>;

  TcpConn(int fd, FailFn on_fail);
  void start_watch();
  std::shared_ptr<OpState> enqueue_locked(const std::shared_ptr<Op> &op, uint32_t handle);
  // Leads progress in the calling thread until done() or the connection closes (deadline: fails it).
  // false if the deadline passed first (the caller decides what ends: see expire_locked).
  // keep_for: an attachment whose operations this caller goes on to read itself (it polls next):
  // if they are all that is left, the lease is kept (given back, it would wake the loop's thread
  // only for the caller to take the loop from it again).
  template <class Done>
  bool lead_locked(Lock &lk, Done done, Deadline deadline, uint32_t spin_us = 0, const uint32_t *keep_for = nullptr);
  bool idle_locked() const { return inflight_.empty() && attaching_ == 0; }
  // Whether operations of this attachment wait for answers or for their bytes to go out.
  bool handle_busy_locked(uint32_t handle) const { return unfinished_.count(handle) > 0; }
  bool refused_locked(uint32_t handle, const std::shared_ptr<Op> &op);  // the owner ended the handle
  void cut_handle_locked(uint32_t handle, int reason);                 // DETACHED
  void queue_locked(const char *hdr, const char *data, size_t len, const std::shared_ptr<OpState> &st);
  void queue_detach_locked(uint32_t handle, const std::shared_ptr<OpState> &st);  // a DETACH frame, not flushed
  // The handle let go of behind what it sent (its operations go on): a DETACH queued, not flushed.
  void detach_behind_locked(uint32_t handle, const std::shared_ptr<OpState> &st);
  bool flush_locked();  // true when sendq_ is empty
  void read_locked();   // consumes what the socket holds
  void maybe_finish_locked(const std::shared_ptr<OpState> &st);
  void op_error(const std::shared_ptr<OpState> &st, int err, std::string why);
  // notify: tell the transport (a failure found here), not when the transport closes us.
  void fail_locked(int err, const std::string &why, bool notify);
  void check_deadlines_locked();
  // An operation outlived its deadline. A connection of one transport's own ends (as before);
  // a session is shared, so only that operation ends, unless the connection itself is stuck:
  // its bytes still wait for the kernel, or the server has said nothing since it was sent.
  void expire_locked(const std::shared_ptr<OpState> &st);
  // An ATTACH got no answer in time: on a session only that attachment is given up (its answer,
  // when it comes, is dropped, and a DETACH follows it), unless the server is silent.
  void abandon_attach_locked(uint32_t handle, Clock::time_point sent);
  // The server owes an answer sent at t and has said nothing since, for long enough that it is
  // not merely slow (a holder with a short deadline must not end everyone's session).
  bool silent_since_locked(Clock::time_point t) const {
    return !session_ || (last_rx_ < t && Clock::now() - t >= std::chrono::milliseconds(kSilentSessionMs));
  }
  static constexpr int kSilentSessionMs = 1000;
  void want_loop_locked();  // asks the loop to (re)compute what it watches
  void update_watch();      // loop thread
  static void on_poll(uv_poll_t *h, int status, int events);

  int fd_;
  FailFn on_fail_;
  // Sessions.
  bool session_ = false;
  std::string nonce_;  // the server's challenge: ATTACHes are signed over it
  uint32_t next_handle_ = 1;
  std::unordered_map<uint32_t, FailFn> users_;        // live attachments
  std::unordered_map<uint32_t, std::pair<int, std::string>> ended_;  // handles the owner ended (or refused), how and why
  std::unordered_map<uint32_t, Attaching> attaches_;  // ATTACHes in flight
  int attaching_ = 0;
  std::function<void()> on_dead_;
  std::atomic<bool> closed_flag_{false};
  std::atomic<bool> spent_flag_{false};
  bool handles_left_locked();  // false (and spent) once the handles ran out
  std::mutex mu_;
  // The loop's callbacks take mu_ through lock_on_loop, which counts them while they wait for it:
  // a polling caller, which takes it look after look, leaves it to them meanwhile.
  Lock lock_on_loop();
  std::atomic<int> loop_waiting_{0};
  std::condition_variable cv_;  // detach waits here for queued sends to drain
  bool closed_ = false;
  int close_err_ = 0;
  std::string close_why_;
  Reader reader_ = Reader::None;
  proto::FrameReader frames_;
  std::unordered_map<uint64_t, Pending> inflight_;
  std::unordered_map<uint32_t, uint32_t> unfinished_;  // operations not finished yet, by attachment
  uint64_t next_id_ = 0;
  uint64_t current_id_ = 0;  // the response whose payload is arriving
  Clock::time_point last_rx_{};  // when bytes last came from the server
  std::deque<Chunk> sendq_;
  bool update_posted_ = false;
  // Loop side.
  uv_poll_t *poll_ = nullptr;
  uv_timer_t *timer_ = nullptr;
  int watching_ = 0;
  bool ticking_ = false;  // the deadline tick runs (loop thread starts it; it stops itself when idle)
  // Headers and small payloads; what is left of a large payload is read straight into place, so the
  // smaller this is, the less of a large one is copied (8 KiB: a 64 KiB write's own read 3 µs
  // faster than with 64 KiB, a stream of small frames still several to a read).
  static constexpr size_t kStagingSize = 8 * 1024;
  char staging_[kStagingSize];
};

}  // namespace libd
