// The server half of the transport contract: a transport that serves memory (libd.h's
// rdma_server interface: serve, grants, lent memory, hosted elements, the owner's side of a
// holder's word). Client transports derive from Transport alone; the C API reaches these calls
// through as_server(), and on a client transport they answer -EOPNOTSUPP.
#pragma once
#include <cstdint>
#include <string>

#include "core/transport.h"
#include "libd.h"

namespace libd {

class ServerBase : public Transport {
 public:
  // Starts serving in the background (READY); stop() cuts every client off.
  virtual int serve() = 0;
  virtual int stop() = 0;
  // serve(), then blocks until stop() (from another thread) or terminate.
  int serve_blocking();

  // Grants: a client configuration for [offset, offset+length) with rights; revoke ends it.
  virtual int grant(const std::string &client, uint64_t offset, uint64_t length, unsigned rights,
                    std::string *config) = 0;
  virtual int revoke(const std::string &grant_id) = 0;
  struct GrantSpec {
    std::string element;  // "" : the transport's own element
    std::string client;
    uint64_t offset = 0, length = 0;
    unsigned rights = 0;
    uint64_t ttl_ms = 0;
    std::string id, secret;  // "": made by the server (given: a grant restored after a restart)
  };
  virtual int grant_spec(const GrantSpec &spec, std::string *config) = 0;

  // Memory: the caller's own, served in place (expose/withdraw), and elements the server holds
  // itself (add_element); what it serves (query).
  virtual int expose(const std::string &element, void *base, uint64_t size) = 0;
  virtual int expose_ranges(const std::string &element, const libd_range *ranges, int n) = 0;
  virtual int withdraw(const std::string &element) = 0;
  virtual int add_element(const std::string &element, uint64_t size) = 0;
  virtual int prefetch(const std::string &element) = 0;  // its pages allocated in the background
  struct ServerSummary {
    uint64_t used_bytes = 0, capacity = UINT64_MAX, connections = 0;
    bool verbs = false;
    std::string verbs_device;
  };
  virtual int query(ServerSummary *out) = 0;

  // The owner's side of a holder's word (Transport::notify).
  virtual int wait_notify(const std::string &grant_id, uint64_t *value, int *status, int timeout_ms) = 0;
  virtual int watch_notify(const std::string &grant_id, int fd, bool add) = 0;
  // A waiting owner drives the server's loop itself (IoLoop::progress); lease_us 0 gives it back.
  // 1 the loop ran on the caller, 0 it was asked for (call again).
  virtual int progress(uint32_t lease_us) = 0;
};

// The transport as a server, or null for a client transport.
inline ServerBase *as_server(Transport *t) { return dynamic_cast<ServerBase *>(t); }

}  // namespace libd
