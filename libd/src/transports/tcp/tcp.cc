// rdma_tcp (tcp): one-sided reads and writes to a memory element over tcp. Config keys (from the
// memory element's grant): host, port, grant, secret; optional timeout_ms (per-request deadline,
// default 10000). See tcp_conn.h for how progress is made.
#include <netdb.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/transport.h"
#include "transports/tcp/tcp_conn.h"

namespace libd {
namespace {

class TcpTransport : public Transport {
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
    return 0;
  }

  int do_connect(Deadline deadline) override {
    std::string host = params_.get_or("host", "");
    std::string port = params_.get_or("port", "");
    struct sockaddr_storage addr;
    socklen_t len;
    if (int rc = proto::resolve(host, port, &addr, &len)) return rc;
    TcpCredentials creds{params_.get_or("grant", ""), params_.get_or("secret", ""), aid()};
    proto::GrantBody grant;
    int rc = TcpConn::open(reinterpret_cast<sockaddr *>(&addr), len, creds, deadline,
                           [this](int err, const std::string &why) { fail(err, why); }, &conn_, &grant);
    if (rc) return set_error(rc, last_error() + " (" + host + ":" + port + ")");
    set_remote(grant.offset, grant.length, grant.rights);
    return 0;
  }

  void do_disconnect() override {
    if (!conn_) return;
    conn_->close(-ECONNABORTED, "the transport was closed");
    conn_.reset();
  }

  int do_post(const std::shared_ptr<Op> &op) override {
    op->set_driver(conn_, false);
    conn_->post(op);
    return 0;
  }

  int do_run(const std::shared_ptr<Op> &op, std::shared_lock<IoGate> &io) override {
    op->set_driver(conn_, false);
    auto conn = conn_;
    io.unlock();  // a leader may wait a whole deadline: recover/terminate must not wait for it
    conn->run(op);
    return 0;
  }

  int do_notify(uint64_t value, int status, std::shared_lock<IoGate> &io, Deadline) override {
    auto conn = conn_;
    io.unlock();
    return conn->notify(value, status);
  }

 private:
  std::shared_ptr<TcpConn> conn_;
};

}  // namespace

extern const ImplInfo kTcpImpl = {
    "rdma_tcp", {"tcp"}, LIBD_KIND_RDMA, [] { return std::unique_ptr<Transport>(new TcpTransport()); }};

}  // namespace libd
