// rdma_tcp_server (tcp_server), rdma_shm_server (shm_server) and rdma_uverbs_server
// (verbs_server): a memory element served from this process — Scad's model of a memory element as an action that calls serve(). Keys:
//   size   bytes of the element (required)
//   host, port   tcp listener (tcp_server; default 127.0.0.1 and an ephemeral port)
//   path   unix socket for shm clients (shm_server: required unless shm is 0; tcp_server: optional)
//   dev, port_num, gid_index, mw   verbs_server: device selection; mw,0 forces per-grant
//          registrations instead of type-2 memory windows (see server/verbs_server.h)
//   cm     verbs_server: 0 turns off the rdma_cm listener (clients use the record exchange)
// verbs_server also serves tcp clients: its listener carries the verbs handshake.
// serve() starts the listeners (state READY); the message then holds "host,..;port,..;path,..".
// grant() hands out a client configuration; revoke() and stop() cut clients off at once.
#include <unistd.h>

#include <cerrno>

#include "core/error.h"
#include "core/transport.h"
#include "server/memory_server.h"

namespace libd {
namespace {

class ServerTransport : public Transport {
 public:
  ServerTransport(bool tcp, bool verbs) : tcp_(tcp), verbs_(verbs) {}

  int serve() override { return connect(); }
  int stop() override { return terminate(); }

  int grant(const std::string &client, uint64_t offset, uint64_t length, unsigned rights,
            std::string *config) override {
    if (state() != LIBD_STATE_READY) return set_error(-ENOTCONN, "memory element '" + name() + "' is not serving; call serve() first");
    Grant g;
    g.element = name();
    g.client = client;
    g.offset = offset;
    g.length = length;
    g.rights = rights;
    if (int rc = server_->grant(&g)) return rc;
    *config = server_->client_config(g);
    return 0;
  }

  int revoke(const std::string &grant_id) override {
    if (!server_) return set_error(-ENOTCONN, "memory element '" + name() + "' is not serving");
    return server_->revoke(grant_id);
  }

 protected:
  bool configured() const override { return params_.has("size"); }

  int do_init() override {
    uint64_t size, port;
    if (int rc = params_.get_size("size", 0, &size)) return rc;
    if (size == 0) return set_error(-EINVAL, "parameter 'size' is required (e.g. size,64MiB)");
    if (int rc = params_.get_u64("port", 0, &port)) return rc;
    if (port > 65535) return set_error(-EINVAL, "parameter 'port' must be 0..65535");
    if (!tcp_ && !params_.has("path")) return set_error(-EINVAL, "parameter 'path' (unix socket) is required");
    return 0;
  }

  int do_connect(Deadline) override {
    uint64_t size, port;
    params_.get_size("size", 0, &size);
    params_.get_u64("port", 0, &port);
    server_ = std::make_unique<MemoryServer>();
    if (int rc = server_->add_element(name(), size)) return rc;
    std::string msg;
    if (verbs_) {
      if (int rc = server_->enable_verbs(params_)) return rc;
    }
    if (tcp_) {
      std::string host = params_.get_or("host", "127.0.0.1");
      uint16_t bound;
      if (int rc = server_->listen_tcp(host, uint16_t(port), &bound)) return rc;
      msg += "host," + host + ";port," + std::to_string(bound);
    }
    if (params_.has("path")) {
      if (int rc = server_->listen_unix(params_.get_or("path", ""))) return rc;
      msg += std::string(msg.empty() ? "" : ";") + "path," + params_.get_or("path", "");
    }
    set_remote(0, size, LIBD_RIGHT_READ | LIBD_RIGHT_WRITE);
    set_message(msg);
    return 0;
  }

  void do_disconnect() override {
    if (server_) server_->stop();
    server_.reset();
  }

 private:
  bool tcp_;
  bool verbs_;
  std::unique_ptr<MemoryServer> server_;
};

}  // namespace

extern const ImplInfo kTcpServerImpl = {
    "rdma_tcp_server", {"tcp_server"}, LIBD_KIND_RDMA_SERVER,
    [] { return std::unique_ptr<Transport>(new ServerTransport(true, false)); }};
extern const ImplInfo kShmServerImpl = {
    "rdma_shm_server", {"shm_server"}, LIBD_KIND_RDMA_SERVER,
    [] { return std::unique_ptr<Transport>(new ServerTransport(false, false)); }};
extern const ImplInfo kVerbsServerImpl = {
    "rdma_uverbs_server", {"verbs_server"}, LIBD_KIND_RDMA_SERVER,
    [] { return std::unique_ptr<Transport>(new ServerTransport(true, true)); }};

}  // namespace libd
