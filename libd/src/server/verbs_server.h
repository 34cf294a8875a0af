// The verbs side of a memory server: for each authenticated client that asks, a reliable
// queue pair connected to the client's, and a remote key that covers only the client's granted
// range with only its rights. The key is a type-2 memory window bound to that queue pair when
// the device has them (rxe and mlx5 do), over a registration of exactly the granted range that
// allows no remote access by itself; a key learned by another client is useless on its queue
// pair. Without windows the key is a registration of just the granted range with its rights
// (scoped by range and rights, but valid on any queue pair of the server's protection domain). Closing the endpoint — the control connection
// closed, the grant revoked, the element removed — invalidates the key at once.
#pragma once
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <memory>
#include <string>

#include "core/params.h"
#include "server/memory_server.h"
#include "ibv/device.h"
#include "ibv/record.h"

namespace libd {

class VerbsEndpoint {
 public:
  ~VerbsEndpoint();

 private:
  friend class VerbsServer;
  std::shared_ptr<ibv::Device> dev_;
  std::shared_ptr<Element> element_;       // keeps the memory mapped while the key lives
  ibv_qp *qp_ = nullptr;
  ibv_mw *mw_ = nullptr;
  ibv_mr *range_mr_ = nullptr;  // the granted range: MW_BIND only (windows) or the remote rights
  rdma_cm_id *cm_id_ = nullptr;  // when connected through rdma_cm
};

class VerbsServer {
 public:
  // Opens the device (keys dev, port_num, gid_index, mw; see verbs/device.h). mw,0 forces the
  // registration fallback even where windows exist.
  static int create(const Params &params, std::unique_ptr<VerbsServer> *out);
  ~VerbsServer();

  // Runs on the memory server's loop thread. 0 with *ep and *reply, or a negative errno and *why.
  int accept(const std::shared_ptr<Element> &element, const Grant &grant, const ibv::Record &client,
             std::unique_ptr<VerbsEndpoint> *ep, ibv::Record *reply, std::string *why);
  // The same through rdma_cm: id is a connection request whose ticket named this client. Moves a
  // new queue pair to RTS with rdma_cm's attributes, binds the key, and accepts with our record in
  // the answer. On success the endpoint owns id; on failure the caller rejects it with *why.
  int accept_cm(const std::shared_ptr<Element> &element, const Grant &grant, rdma_cm_id *id,
                std::unique_ptr<VerbsEndpoint> *ep, std::string *why);
  std::string describe() const;
  bool uses_windows() const { return use_mw_; }

 private:
  VerbsServer() = default;
  int prepare(const std::shared_ptr<Element> &element, const Grant &grant, VerbsEndpoint &ep, std::string *why);
  int finish(const Grant &grant, uint32_t psn, VerbsEndpoint &ep, ibv::Record *reply, std::string *why);
  int bind_window(VerbsEndpoint &ep, const Grant &grant, uint32_t *rkey, std::string *why);

  std::shared_ptr<ibv::Device> dev_;
  ibv_cq *cq_ = nullptr;  // only window binds complete here
  bool use_mw_ = false;
  uint64_t next_wr_ = 1;
};

}  // namespace libd
