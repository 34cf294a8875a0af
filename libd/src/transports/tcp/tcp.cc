// rdma_tcp (tcp): one-sided reads and writes to a memory element over tcp. Config keys (from the
// memory element's grant): host, port, grant, secret; optional timeout_ms (per-request deadline,
// default 10000) and share (1: use the process's shared connection to that server, see below).
// See tcp_conn.h for how progress is made.
//
// With share,1 every transport of the process that reaches the same host and port rides one
// connection (a session, proto/frame.h): the first opens it with its grant, the next attach
// theirs in one round trip instead of a connection and a handshake each, and terminating a
// transport detaches its grant and leaves the connection for the next. What each transport may
// reach is its own grant's, checked by the server per request exactly as on a connection of its
// own; a grant the owner revokes (or lets expire) ends that transport alone (ERROR,
// -ECONNRESET), not the connection. Failures of the connection itself reach every transport on it.
#include <netdb.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/transport.h"
#include "transports/session_registry.h"
#include "transports/tcp/tcp_conn.h"

namespace libd {
namespace {

using TcpSessions = SessionRegistry<TcpConn>;

class TcpTransport : public Transport {
 public:
  Caps caps() const override { return {.notify = true, .lazy_connect = params_.get_or("share", "0") == "1"}; }

 protected:
  bool configured() const override {
    return params_.has("host") && params_.has("port") && params_.has("grant") && params_.has("secret");
  }

  int do_init() override {
    if (!configured()) return set_error(-EINVAL, "needs host, port, grant and secret");
    uint64_t port;
    if (int rc = params_.get_u64("port", 0, &port)) return rc;
    if (port == 0 || port > 65535) return set_error(-EINVAL, "parameter 'port' must be 1..65535");
    if (params_.get_or("secret", "").size() < 32) return set_error(-EINVAL, "parameter 'secret' is too short");
    std::string share = params_.get_or("share", "0");
    if (share != "0" && share != "1") return set_error(-EINVAL, "parameter 'share' must be 0 or 1");
    uint64_t spin;
    if (int rc = params_.get_u64("busy_poll_us", 0, &spin)) return rc;
    if (spin > 1000000) return set_error(-EINVAL, "parameter 'busy_poll_us' must be at most 1000000");
    spin_us_ = uint32_t(spin);
    return 0;
  }

  int do_connect(Deadline deadline) override {
    detached_ = false;
    std::string host = params_.get_or("host", "");
    std::string port = params_.get_or("port", "");
    struct sockaddr_storage addr;
    socklen_t len;
    if (int rc = proto::resolve(host, port, &addr, &len)) return rc;
    TcpCredentials creds{params_.get_or("grant", ""), params_.get_or("secret", ""), aid()};
    proto::GrantBody grant;
    auto on_fail = [this](int err, const std::string &why) { fail(err, why); };
    shared_ = params_.get_or("share", "0") == "1";
    handle_ = 0;
    if (shared_) {
      std::string key = host + "|" + port;
      for (int tries = 0; tries < 2; tries++) {
        auto conn = TcpSessions::get().find(key);
        if (!conn) break;
        int rc = conn->attach(creds, deadline, on_fail, &handle_, &grant);
        if (rc == 0) {
          conn_ = std::move(conn);
          set_remote(grant.offset, grant.length, grant.rights);
          return 0;
        }
        if (!conn->closed() && !conn->spent()) return set_error(rc, last_error() + " (" + host + ":" + port + ")");
        // The connection failed under us: open a new one.
      }
      int rc = TcpConn::open(reinterpret_cast<sockaddr *>(&addr), len, creds, deadline, nullptr, &conn_, &grant, true);
      if (rc) return set_error(rc, last_error() + " (" + host + ":" + port + ")");
      conn_->add_user(0, on_fail);
      TcpSessions::get().put(key, conn_);
      set_remote(grant.offset, grant.length, grant.rights);
      return 0;
    }
    int rc = TcpConn::open(reinterpret_cast<sockaddr *>(&addr), len, creds, deadline, on_fail, &conn_, &grant);
    if (rc) return set_error(rc, last_error() + " (" + host + ":" + port + ")");
    set_remote(grant.offset, grant.length, grant.rights);
    return 0;
  }

  // An operation's own connect, on a shared connection: the ATTACH goes out and the operation
  // right behind it, without waiting for the answer (one round trip for both); the verdict is
  // do_settle's, and a refusal fails the operation with it anyway. Until then the client checks
  // nothing the server does not check again per request.
  int do_connect_lazy(Deadline deadline) override {
    shared_ = params_.get_or("share", "0") == "1";
    if (!shared_) return do_connect(deadline);
    std::string key = params_.get_or("host", "") + "|" + params_.get_or("port", "");
    auto conn = TcpSessions::get().find(key);
    if (!conn) return do_connect(deadline);  // the first to this server opens the session (AUTH)
    TcpCredentials creds{params_.get_or("grant", ""), params_.get_or("secret", ""), aid()};
    if (conn->attach_async(creds, [this](int err, const std::string &why) { fail(err, why); }, &handle_) != 0)
      return do_connect(deadline);  // it closed meanwhile: a new one
    conn_ = std::move(conn);
    unsettled_ = true;
    detached_ = false;
    set_remote(0, UINT64_MAX / 2, LIBD_RIGHT_READ | LIBD_RIGHT_WRITE);
    return 0;
  }

  int do_settle(Deadline deadline) override {
    if (!unsettled_ || !conn_) return 0;
    proto::GrantBody grant;
    int rc = conn_->verdict(handle_, deadline, &grant, spin_us_);
    unsettled_ = false;
    if (rc == 0) {
      set_remote(grant.offset, grant.length, grant.rights);
      read_on_ = spin_us_ > 0;
    }
    return rc;
  }

  // A caller that polls reads on, while its spin lasts, until the transfers that rode the
  // ATTACH are answered: it waits for them next (TcpConn::read_on).
  void do_settled(std::shared_lock<IoGate> &io, Deadline deadline) override {
    if (!read_on_.exchange(false) || !conn_) return;
    auto conn = conn_;
    uint32_t handle = handle_;
    io.unlock();  // as do_run: recover/terminate must not wait for it
    conn->read_on(handle, deadline, spin_us_);
  }

  void do_disconnect() override {
    bool unsettled = unsettled_;
    unsettled_ = false;
    if (!conn_) return;
    if (shared_) {
      // The connection stays, for the next transport; a last word (or let_go) detached this one
      // already, and left the record of an ATTACH whose verdict nobody read.
      if (!detached_)
        conn_->detach(handle_);
      else if (unsettled)
        conn_->forget_attach(handle_);
    } else {
      conn_->close(-ECONNABORTED, "the transport was closed");
    }
    conn_.reset();
  }

  int do_post(const std::shared_ptr<Op> &op) override {
    // A waiter looks (reads the socket) before it sleeps, and polls for busy_poll_us first.
    op->set_driver(conn_, false, true, spin_us_);
    conn_->post(op, handle_);
    return 0;
  }

  int do_run(const std::shared_ptr<Op> &op, std::shared_lock<IoGate> &io) override {
    op->set_driver(conn_, false);
    auto conn = conn_;
    uint32_t handle = handle_;
    io.unlock();  // a leader may wait a whole deadline: recover/terminate must not wait for it
    conn->run(op, handle, spin_us_);
    return 0;
  }

  int do_notify(uint64_t value, int status, bool last, std::shared_lock<IoGate> &io, Deadline) override {
    auto conn = conn_;
    uint32_t handle = handle_;
    bool detach = last && shared_;
    if (detach) detached_ = true;  // terminate then has nothing left to say
    io.unlock();
    return conn->notify(value, status, handle, detach);
  }

  int do_let_go(std::shared_lock<IoGate> &io) override {
    if (!shared_ || !conn_ || detached_) return 0;  // a connection of its own goes at terminate
    auto conn = conn_;
    uint32_t handle = handle_;
    detached_ = true;  // terminate then has nothing left to say
    io.unlock();
    return conn->let_go(handle);
  }

 private:
  std::shared_ptr<TcpConn> conn_;
  bool shared_ = false;
  uint32_t handle_ = 0;  // this transport's attachment on a shared connection
  bool unsettled_ = false;  // attached by an operation: the server's verdict not read yet
  std::atomic<bool> read_on_{false};  // do_settle took a verdict for a polling caller: do_settled reads on
  std::atomic<bool> detached_{false};  // its last word detached it already (notify_last); set under the shared I/O lock
  uint32_t spin_us_ = 0;    // busy_poll_us: a blocking call polls its answer this long before it sleeps
};

}  // namespace

extern const ImplInfo kTcpImpl = {
    "rdma_tcp", {"tcp"}, LIBD_KIND_RDMA, [] { return std::unique_ptr<Transport>(new TcpTransport()); }};

}  // namespace libd
