// A memory server's rdma_cm listener: the passive side of verbs/cm.h. Its event channel's
// descriptor sits in the server's libuv loop; every event is copied and acknowledged at once, so
// destroying an identifier never waits. A connection request with a well-formed hello goes to
// the owner, which must accept or reject it (see accept/reject below).
#pragma once
#include <rdma/rdma_cma.h>
#include <uv.h>

#include <functional>
#include <memory>
#include <string>

namespace libd {

class CmListener {
 public:
  // Called on the loop thread for each request; the owner takes id (accepts, or rejects and
  // destroys it).
  using RequestFn = std::function<void(rdma_cm_id *id, const std::string &ticket)>;

  // Binds host (an IP address; 0.0.0.0 for all) on an ephemeral rdma_cm port. Runs on the loop
  // thread. 0, or a negative errno with libd_last_error.
  static int create(uv_loop_t *loop, const std::string &host, RequestFn on_request, std::unique_ptr<CmListener> *out);
  ~CmListener();  // on the loop thread: stops listening (connections already made stay)

  uint16_t port() const { return port_; }

  // Refuses id with a short reason the client shows, and destroys it.
  static void reject(rdma_cm_id *id, const std::string &why);

 private:
  CmListener() = default;
  void on_events();

  rdma_event_channel *channel_ = nullptr;
  rdma_cm_id *listen_id_ = nullptr;
  uv_poll_t *poll_ = nullptr;
  uint16_t port_ = 0;
  RequestFn on_request_;
};

}  // namespace libd
