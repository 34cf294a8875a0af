// rdma_tcp (tcp): one-sided reads and writes to a memory element over tcp, on the shared libuv
// client loop. Config keys (from the memory element's grant): host, port, grant, secret;
// optional timeout_ms (per-request deadline, default 10000).
#include <arpa/inet.h>
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
    struct addrinfo hints = {}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
    if (gai != 0) return set_error(-EHOSTUNREACH, "cannot resolve '" + host + "': " + gai_strerror(gai));
    struct sockaddr_storage addr;
    std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
    freeaddrinfo(res);

    auto result = std::make_shared<ConnectResult>();
    TcpCredentials creds{params_.get_or("grant", ""), params_.get_or("secret", ""), aid()};
    int64_t budget = std::max<int64_t>(1, deadline.remaining_ms());
    IoLoop &loop = IoLoop::shared();
    loop.run_sync([&] {
      conn_ = TcpConn::start(&loop, reinterpret_cast<sockaddr *>(&addr), creds, budget, result,
                             [this](int err, const std::string &why) { fail(err, why); });
    });
    std::unique_lock<std::mutex> lk(result->mu);
    // The connection's own timer ends the handshake at the deadline; the grace is for its tick.
    result->cv.wait_until(lk, deadline.at() + std::chrono::milliseconds(200), [&] { return result->done; });
    if (!result->done) return set_error(-ETIMEDOUT, "no handshake from " + host + ":" + port + " in time");
    if (result->rc) return set_error(result->rc, result->why + " (" + host + ":" + port + ")");
    set_remote(result->grant.offset, result->grant.length, result->grant.rights);
    return 0;
  }

  void do_disconnect() override {
    if (!conn_) return;
    auto conn = std::move(conn_);
    std::mutex m;
    std::condition_variable cv;
    bool closed = false;
    IoLoop::shared().run_sync([&] {
      conn->close(-ECONNABORTED, "the transport was closed", [&] {
        std::lock_guard<std::mutex> lk(m);
        closed = true;
        cv.notify_all();
      });
    });
    std::unique_lock<std::mutex> lk(m);
    cv.wait(lk, [&] { return closed; });  // close callbacks run on the next loop turn
  }

  int do_post(const std::shared_ptr<Op> &op) override {
    auto conn = conn_;
    op->set_canceller([conn](Op *o) {
      std::mutex m;
      std::condition_variable cv;
      bool drained = false;
      IoLoop::shared().run_sync([&] {
        conn->detach(o, [&] {
          std::lock_guard<std::mutex> lk(m);
          drained = true;
          cv.notify_all();
        });
      });
      std::unique_lock<std::mutex> lk(m);
      cv.wait(lk, [&] { return drained; });  // bounded: the deadline closes the connection
    });
    IoLoop::shared().post([conn, op] { conn->submit(op); });
    return 0;
  }

 private:
  std::shared_ptr<TcpConn> conn_;
};

}  // namespace

extern const ImplInfo kTcpImpl = {
    "rdma_tcp", {"tcp"}, LIBD_KIND_RDMA, [] { return std::unique_ptr<Transport>(new TcpTransport()); }};

}  // namespace libd
