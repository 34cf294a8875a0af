// rdma_tcp_server (tcp_server), rdma_shm_server (shm_server) and rdma_uverbs_server
// (verbs_server): a memory element served from this process — Scad's model of a memory element as an action that calls serve(). Keys:
//   size   bytes of the element (required; 0: no element of its own, only memory the caller
//          lends with expose())
//   host, port   tcp listener (tcp_server; default 127.0.0.1 and an ephemeral port)
//   path   unix socket for shm clients (shm_server: required unless shm is 0; tcp_server: optional)
//   dev, port_num, gid_index, mw   verbs_server: device selection; mw,0 forces per-grant
//          registrations instead of type-2 memory windows (see server/verbs_server.h)
//   cm     verbs_server: 0 turns off the rdma_cm listener (clients use the record exchange)
//   capacity   most bytes of elements at once (add_element past it: -ENOSPC); lent memory is not counted
//   busy_poll_us   after each request the server's thread keeps polling this long before it
//          sleeps (default 0): a request that follows soon finds it awake, at the price of a core
//          spinning meanwhile (UCX's and NIXL's busy-polling progress)
// verbs_server also serves tcp clients: its listener carries the verbs handshake.
// serve() starts the listeners (state READY); the message then holds "host,..;port,..;path,..".
// grant() hands out a client configuration; revoke() and stop() cut clients off at once.
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <memory>
#include <mutex>

#include "core/error.h"
#include "core/server_base.h"
#include "server/memory_server.h"

namespace libd {
namespace {

class ServerTransport : public ServerBase {
 public:
  ServerTransport(bool tcp, bool verbs) : tcp_(tcp), verbs_(verbs) {}

  int serve() override { return connect(); }
  int stop() override { return terminate(); }

  int grant(const std::string &client, uint64_t offset, uint64_t length, unsigned rights,
            std::string *config) override {
    auto srv = server();
    if (state() != LIBD_STATE_READY || !srv) return set_error(-ENOTCONN, "memory element '" + name() + "' is not serving; call serve() first");
    Grant g;
    g.element = name();
    g.client = client;
    g.offset = offset;
    g.length = length;
    g.rights = rights;
    if (int rc = srv->grant(&g)) return rc;
    *config = srv->client_config(g);
    return 0;
  }

  int revoke(const std::string &grant_id) override {
    auto srv = server();
    if (!srv) return set_error(-ENOTCONN, "memory element '" + name() + "' is not serving");
    return srv->revoke(grant_id);
  }

  // The server object is created by serve() and dropped by stop(); each call works on its own
  // reference, so a concurrent stop() makes it fail cleanly instead of touching a freed server.
  int expose(const std::string &element, void *base, uint64_t size) override {
    std::shared_ptr<MemoryServer> srv;
    if (int rc = serving(&srv)) return rc;
    if (element == name()) return set_error(-EEXIST, "element '" + element + "' is the transport's own");
    return srv->add_lent_element(element, static_cast<char *>(base), size);
  }

  static_assert(LIBD_MAX_RANGES == proto::kMaxLentRanges, "one bound for lists, in the API and on the wire");
  int expose_ranges(const std::string &element, const libd_range *ranges, int n) override {
    std::shared_ptr<MemoryServer> srv;
    if (int rc = serving(&srv)) return rc;
    if (element == name()) return set_error(-EEXIST, "element '" + element + "' is the transport's own");
    std::vector<proto::CmaRange> table(static_cast<size_t>(n));
    for (int i = 0; i < n; i++) table[size_t(i)] = {uint64_t(uintptr_t(ranges[i].base)), ranges[i].size};
    return srv->add_lent_ranges(element, table);
  }

  int withdraw(const std::string &element) override {
    auto srv = server();
    if (!srv) return set_error(-ENOTCONN, "memory element '" + name() + "' is not serving");
    return srv->remove_element(element);
  }

  int grant_spec(const GrantSpec &spec, std::string *config) override {
    std::shared_ptr<MemoryServer> srv;
    if (int rc = serving(&srv)) return rc;
    Grant g;
    g.element = spec.element.empty() ? name() : spec.element;
    g.client = spec.client;
    g.offset = spec.offset;
    g.length = spec.length;
    g.rights = spec.rights;
    g.ttl_ms = spec.ttl_ms;
    if (!spec.secret.empty()) {
      // It ends up in a configuration string, where ',' and ';' separate fields.
      for (char c : spec.secret)
        if (!isxdigit(static_cast<unsigned char>(c))) return set_error(-EINVAL, "grant: the secret must be hex digits");
    }
    g.id = spec.id;
    g.secret = spec.secret;
    if (int rc = srv->grant(&g)) return rc;
    *config = srv->client_config(g);
    return 0;
  }

  int add_element(const std::string &element, uint64_t size) override {
    std::shared_ptr<MemoryServer> srv;
    if (int rc = serving(&srv)) return rc;
    return srv->add_element(element, size);
  }

  int prefetch(const std::string &element) override {
    std::shared_ptr<MemoryServer> srv;
    if (int rc = serving(&srv)) return rc;
    return srv->prefetch_element(element);
  }

  int query(ServerSummary *out) override {
    std::shared_ptr<MemoryServer> srv;
    if (int rc = serving(&srv)) return rc;
    out->used_bytes = srv->used_bytes();
    out->capacity = srv->capacity();
    out->connections = srv->connections();
    out->verbs = srv->verbs_enabled();
    out->verbs_device = out->verbs ? srv->verbs_description() : "";
    return 0;
  }

  int watch_notify(const std::string &grant_id, int fd, bool add) override {
    auto srv = server();
    if (!srv) return set_error(-ENOTCONN, "memory element '" + name() + "' is not serving");
    return srv->watch_notify(grant_id, fd, add);
  }

  int progress(uint32_t lease_us) override {
    auto srv = server();
    if (!srv) return set_error(-ENOTCONN, "memory element '" + name() + "' is not serving");
    return srv->progress(lease_us);
  }

  int wait_notify(const std::string &grant_id, uint64_t *value, int *status, int timeout_ms) override {
    auto srv = server();
    if (!srv) return set_error(-ENOTCONN, "memory element '" + name() + "' is not serving");
    Notice n;
    if (int rc = srv->wait_notify(grant_id, &n, timeout_ms)) return rc;
    *value = n.value;
    *status = n.status;
    return 0;
  }

 protected:
  bool configured() const override { return params_.has("size"); }

  int do_init() override {
    uint64_t size, port, capacity;
    if (int rc = params_.get_size("size", 0, &size)) return rc;
    if (int rc = params_.get_size("capacity", UINT64_MAX, &capacity)) return rc;
    // size,0 is a host for lent memory only (expose()).
    if (int rc = params_.get_u64("port", 0, &port)) return rc;
    if (port > 65535) return set_error(-EINVAL, "parameter 'port' must be 0..65535");
    if (!tcp_ && !params_.has("path")) return set_error(-EINVAL, "parameter 'path' (unix socket) is required");
    uint64_t spin;
    if (int rc = params_.get_u64("busy_poll_us", 0, &spin)) return rc;
    if (spin > 1000000) return set_error(-EINVAL, "parameter 'busy_poll_us' must be at most 1000000");
    return 0;
  }

  int do_connect(Deadline) override {
    uint64_t size, port;
    params_.get_size("size", 0, &size);
    params_.get_u64("port", 0, &port);
    {
      std::lock_guard<std::mutex> lk(server_mu_);
      server_ = std::make_shared<MemoryServer>();
    }
    auto srv = server();
    uint64_t capacity;
    params_.get_size("capacity", UINT64_MAX, &capacity);
    srv->set_capacity(capacity);
    uint64_t spin;
    params_.get_u64("busy_poll_us", 0, &spin);
    srv->set_busy_poll_us(uint32_t(spin));
    if (size > 0) {
      if (int rc = srv->add_element(name(), size)) return rc;
    }
    std::string msg;
    if (verbs_) {
      if (int rc = srv->enable_verbs(params_)) return rc;
    }
    if (tcp_) {
      std::string host = params_.get_or("host", "127.0.0.1");
      uint16_t bound;
      if (int rc = srv->listen_tcp(host, uint16_t(port), &bound)) return rc;
      msg += "host," + host + ";port," + std::to_string(bound);
    }
    if (params_.has("path")) {
      if (int rc = srv->listen_unix(params_.get_or("path", ""))) return rc;
      msg += std::string(msg.empty() ? "" : ";") + "path," + params_.get_or("path", "");
    }
    set_remote(0, size, LIBD_RIGHT_READ | LIBD_RIGHT_WRITE);
    set_message(msg);
    return 0;
  }

  void do_disconnect() override {
    std::shared_ptr<MemoryServer> srv;
    {
      std::lock_guard<std::mutex> lk(server_mu_);
      srv.swap(server_);
    }
    if (srv) srv->stop();
  }

 private:
  // 0 and the server if serving; else -ENOTCONN with the error set.
  int serving(std::shared_ptr<MemoryServer> *out) {
    *out = server();
    if (state() != LIBD_STATE_READY || !*out)
      return set_error(-ENOTCONN, "memory element '" + name() + "' is not serving; call serve() first");
    return 0;
  }

  bool tcp_;
  bool verbs_;
  // Shared: a thread inside wait_notify keeps the server alive while stop() drops it (its wait
  // ends with -ECANCELED first). server_mu_ guards the pointer, not the server.
  std::mutex server_mu_;
  std::shared_ptr<MemoryServer> server_;
  std::shared_ptr<MemoryServer> server() {
    std::lock_guard<std::mutex> lk(server_mu_);
    return server_;
  }
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
