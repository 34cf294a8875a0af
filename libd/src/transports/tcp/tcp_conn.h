// One authenticated tcp connection to a memory element, living on the shared client loop.
// All members are touched on the loop thread only; other threads call in through IoLoop.
#pragma once
#include <uv.h>

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "core/op.h"
#include "io/ioloop.h"
#include "proto/auth.h"
#include "proto/frame.h"

namespace libd {

struct TcpCredentials {
  std::string grant_id;
  std::string secret;
  std::string client_id;
};

// The outcome of connect + handshake, waited for by the connecting thread.
struct ConnectResult {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int rc = 0;
  std::string why;
  proto::GrantBody grant;
  void finish(int r, std::string w, proto::GrantBody g = {});
};

class TcpConn : public proto::FrameReader::Handler {
 public:
  using FailFn = std::function<void(int err, const std::string &why)>;

  // Loop thread. The connection keeps itself alive until its handles are closed.
  static std::shared_ptr<TcpConn> start(IoLoop *loop, const sockaddr *addr, TcpCredentials creds, int64_t timeout_ms,
                        std::shared_ptr<ConnectResult> result, FailFn on_fail);

  // Loop thread: post one operation.
  void submit(const std::shared_ptr<Op> &op);
  // Loop thread: close, failing what is in flight with err. done runs once handles are closed.
  void close(int err, const std::string &why, std::function<void()> done = nullptr);
  // Loop thread: detach an operation (cancel). drained runs when no write of it is queued.
  void detach(Op *op, std::function<void()> drained);

  int on_header(const proto::Header &h, char **dest) override;
  int on_frame(const proto::Header &h) override;

 private:
  struct OpState {
    std::shared_ptr<Op> op;
    size_t segs_left = 0;
    int writes_left = 0;
    int error = 0;
    std::string why;
    bool finished = false;
    std::function<void()> drained;
  };
  struct Pending {
    std::shared_ptr<OpState> st;
    size_t seg;
  };
  struct WriteReq {
    uv_write_t req;
    char hdr[proto::kHeaderSize];
    std::string body;
    std::shared_ptr<OpState> st;
    TcpConn *conn;
  };
  enum class Phase { Connecting, AwaitChallenge, AwaitAuthOk, Ready, Closed };

  TcpConn(IoLoop *loop, TcpCredentials creds, int64_t timeout_ms, std::shared_ptr<ConnectResult> result,
          FailFn on_fail);
  void send(WriteReq *w, uv_buf_t *bufs, unsigned n);
  void maybe_finish(const std::shared_ptr<OpState> &st);
  void set_error(const std::shared_ptr<OpState> &st, int err, std::string why);
  void fail(int err, const std::string &why);
  void on_tick();
  static void on_alloc(uv_handle_t *h, size_t, uv_buf_t *buf);
  static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf);

  uv_tcp_t tcp_;
  uv_connect_t creq_;
  uv_timer_t timer_;
  proto::FrameReader reader_;
  TcpCredentials creds_;
  int64_t timeout_ms_;
  std::shared_ptr<ConnectResult> result_;
  FailFn on_fail_;
  Phase phase_ = Phase::Connecting;
  Clock::time_point connect_deadline_;
  std::string ctl_;
  proto::GrantBody grant_;
  std::unordered_map<uint64_t, Pending> inflight_;
  uint64_t next_id_ = 0;
  uint64_t current_id_ = 0;  // the response whose payload is being received
  int closes_left_ = 0;
  std::shared_ptr<TcpConn> self_;
  std::function<void()> closed_;
  static constexpr size_t kStagingSize = 64 * 1024;
  char staging_[kStagingSize];
};

}  // namespace libd
