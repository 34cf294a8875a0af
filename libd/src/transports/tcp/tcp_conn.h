// One authenticated tcp connection to a memory element.
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

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/op.h"
#include "io/ioloop.h"
#include "proto/auth.h"
#include "proto/client_handshake.h"
#include "proto/frame.h"

namespace libd {

using TcpCredentials = proto::Credentials;

class TcpConn : public proto::FrameReader::Handler, public OpDriver, public std::enable_shared_from_this<TcpConn> {
 public:
  using FailFn = std::function<void(int err, const std::string &why)>;

  // Connects and authenticates in the calling thread, before the deadline.
  static int open(const sockaddr *addr, socklen_t len, const TcpCredentials &creds, Deadline deadline,
                  FailFn on_fail, std::shared_ptr<TcpConn> *out, proto::GrantBody *grant);
  ~TcpConn() override;

  // Starts an operation; the loop completes it.
  void post(const std::shared_ptr<Op> &op);
  // Runs an operation to completion, leading progress in this thread when the connection is idle.
  void run(const std::shared_ptr<Op> &op);
  // Detaches an operation (cancel): on return the connection no longer touches its buffers.
  void cancel(Op *op) override;
  // Queues a NOTIFY behind everything sent so far (it has no answer). -ENOTCONN if closed.
  int notify(uint64_t value, int status);
  // Closes the connection; pending operations fail with err. Waits until the loop let go of it.
  void close(int err, const std::string &why);

  int on_header(const proto::Header &h, char **dest) override;
  int on_frame(const proto::Header &h) override;

 private:
  struct OpState {
    std::shared_ptr<Op> op;
    size_t segs_left = 0;
    int queued_sends = 0;  // chunks still in sendq_ (they point into the caller's buffer)
    int error = 0;
    std::string why;
    bool finished = false;
    bool detached = false;
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
  };
  enum class Reader { None, Leader, Loop };
  using Lock = std::unique_lock<std::mutex>;

  TcpConn(int fd, FailFn on_fail);
  void start_watch();
  std::shared_ptr<OpState> enqueue_locked(const std::shared_ptr<Op> &op);
  void queue_locked(const char *hdr, const char *data, size_t len, const std::shared_ptr<OpState> &st);
  bool flush_locked();  // true when sendq_ is empty
  void read_locked();   // consumes what the socket holds
  void maybe_finish_locked(const std::shared_ptr<OpState> &st);
  void op_error(const std::shared_ptr<OpState> &st, int err, std::string why);
  // notify: tell the transport (a failure found here), not when the transport closes us.
  void fail_locked(int err, const std::string &why, bool notify);
  void check_deadlines_locked();
  void want_loop_locked();  // asks the loop to (re)compute what it watches
  void update_watch();      // loop thread
  static void on_poll(uv_poll_t *h, int status, int events);

  int fd_;
  FailFn on_fail_;
  std::mutex mu_;
  std::condition_variable cv_;  // detach waits here for queued sends to drain
  bool closed_ = false;
  int close_err_ = 0;
  std::string close_why_;
  Reader reader_ = Reader::None;
  proto::FrameReader frames_;
  std::unordered_map<uint64_t, Pending> inflight_;
  uint64_t next_id_ = 0;
  uint64_t current_id_ = 0;  // the response whose payload is arriving
  std::deque<Chunk> sendq_;
  bool update_posted_ = false;
  // Loop side.
  uv_poll_t *poll_ = nullptr;
  uv_timer_t *timer_ = nullptr;
  int watching_ = 0;
  static constexpr size_t kStagingSize = 64 * 1024;
  char staging_[kStagingSize];
};

}  // namespace libd
