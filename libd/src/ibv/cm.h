// librdmacm connection set-up for queue pairs we create ourselves, where the two ends reach each
// other directly: rdma_cm resolves the route (which device, port, GID, path MTU) and runs the IB CM
// exchange (REQ/REP/RTU) that carries the queue pair numbers and PSNs; we move the queue pair
// with the attributes it computes (rdma_init_qp_attr), as perftest's -R mode and UCX's rdmacm
// wire-up do with their own queue pairs.
//
// Authentication stays on the memory element's control connection: the client authenticates
// there (challenge/response), asks for a one-shot ticket (VERBS_CM_REQUEST / VERBS_CM_TICKET in
// proto/frame.h), and presents it in the REQ's private data. The server answers with its
// handshake record (verbs/record.h, 64 bytes: address, scoped key, rights) in the REP.
//
//   REQ private data, version 1 (20 bytes of the 56 the REQ allows):
//     off size field
//      0   2   magic     0x4352 ("RC" on the wire)
//      2   1   version   1
//      3   1   reserved  0
//      4  16   ticket    from VERBS_CM_TICKET
//   VERBS_CM_TICKET body (18 bytes): cm port (2, little-endian), ticket (16).
#pragma once
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/clock.h"
#include "ibv/device.h"
#include "ibv/record.h"

namespace libd::ibv {

constexpr size_t kTicketSize = 16;
constexpr size_t kCmHelloSize = 20;
constexpr size_t kCmTicketBodySize = 2 + kTicketSize;
constexpr uint16_t kCmHelloMagic = 0x4352;
constexpr uint8_t kCmHelloVersion = 1;

std::string encode_cm_hello(const std::string &ticket);
// 0, or -EPROTO with *why. Accepts trailing zero padding (the CM may pad private data).
int decode_cm_hello(const void *p, size_t n, std::string *ticket, std::string *why);
std::string encode_cm_ticket(uint16_t port, const std::string &ticket);
int decode_cm_ticket(const char *p, size_t n, uint16_t *port, std::string *ticket, std::string *why);

// Moves qp to `state` with the attributes rdma_cm computed for id's connection. access >= 0
// replaces the remote access rights (INIT); timeouts are ours (a dead peer shows in about 0.5 s).
int cm_modify_qp(rdma_cm_id *id, ibv_qp *qp, ibv_qp_state state, int access, uint32_t *psn = nullptr);

// 0 if id's route leaves through dev's device and port, else -ENODEV with *why.
int cm_check_device(rdma_cm_id *id, const Device &dev, std::string *why);

// The active side's event channel and identifier, kept as long as the queue pair is connected
// (destroying the identifier disconnects).
class CmLink {
 public:
  CmLink() = default;
  ~CmLink();
  CmLink(const CmLink &) = delete;
  CmLink &operator=(const CmLink &) = delete;

  rdma_event_channel *channel = nullptr;
  rdma_cm_id *id = nullptr;
};

// How far a failed cm_connect got: before anything was sent to the server (the route could not
// be resolved, or leaves through another device) a caller may fall back to the out-of-band
// exchange on the same control connection; qp is then still in RESET.
enum class CmStage { kRoute, kConnect };

// Resolves host:port, checks the route's device, moves qp to INIT, sends the REQ with ticket,
// takes the server's record from the REP, moves qp to RTR and RTS and completes the exchange.
// 0 with *link and *peer, or a negative errno with libd_last_error and *stage.
int cm_connect(Device &dev, ibv_qp *qp, const std::string &host, uint16_t port, const std::string &ticket,
               Deadline deadline, std::unique_ptr<CmLink> *link, Record *peer, CmStage *stage);

}  // namespace libd::ibv
