// Reliable-connected queue pairs: creation and the INIT -> RTR -> RTS walk from a peer's
// handshake record. Returns 0 or a negative errno with libd_last_error naming the step.
#pragma once
#include <infiniband/verbs.h>

#include "ibv/device.h"
#include "ibv/record.h"

namespace libd::ibv {

struct QpShape {
  int send_depth = 64;  // work requests in flight
  int max_sge = 1;
  int recv_depth = 1;   // one-sided only: nothing is ever received
  int max_inline = 0;   // bytes a request may carry in the send queue itself (IBV_SEND_INLINE)
};

// `inline_granted`, if given, receives what the device granted of shape.max_inline: a device
// that refuses inline data at all still gets a queue pair, with 0 granted.
int create_rc_qp(Device &dev, ibv_cq *cq, const QpShape &shape, ibv_qp **out, int *inline_granted = nullptr);
// Our half of the record (qpn, psn, mtu, port, lid, gid, rd_atomic).
Record local_record(Device &dev, ibv_qp *qp, uint32_t psn);
// INIT with `access` (remote rights of the QP), RTR towards `peer`, RTS with our `psn`.
int connect_rc_qp(Device &dev, ibv_qp *qp, int access, uint32_t psn, const Record &peer);
// To ERROR: every posted work request completes (flushed).
void break_qp(ibv_qp *qp);
uint32_t random_psn();

}  // namespace libd::ibv
