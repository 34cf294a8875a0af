#include "ibv/qp.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>
#include <string>

#include "core/error.h"

namespace libd::ibv {
namespace {

int verr(int rc, const std::string &what) {
  int err = rc > 0 ? rc : (errno ? errno : EIO);
  return set_error(-err, "verbs: " + what + ": " + strerror(err));
}

}  // namespace

uint32_t random_psn() {
  static thread_local std::mt19937 rng{std::random_device{}()};
  return rng() & 0xFFFFFF;
}

int create_rc_qp(Device &dev, ibv_cq *cq, const QpShape &shape, ibv_qp **out, int *inline_granted) {
  ibv_qp_init_attr ia = {};
  ia.send_cq = cq;
  ia.recv_cq = cq;
  ia.qp_type = IBV_QPT_RC;
  ia.sq_sig_all = 0;
  ia.cap.max_send_wr = uint32_t(std::min(shape.send_depth, dev.max_qp_wr()));
  ia.cap.max_recv_wr = uint32_t(shape.recv_depth);
  ia.cap.max_send_sge = uint32_t(std::min(shape.max_sge, dev.max_sge()));
  ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = uint32_t(std::max(0, shape.max_inline));
  errno = 0;
  ibv_qp *qp = ibv_create_qp(dev.pd(), &ia);
  if (!qp && ia.cap.max_inline_data) {
    // The size of inline data a device takes is not in its attributes: asking is the only test.
    ia.cap.max_inline_data = 0;
    errno = 0;
    qp = ibv_create_qp(dev.pd(), &ia);
  }
  if (!qp) return verr(0, "cannot create a queue pair on " + dev.name() + " (depth " + std::to_string(ia.cap.max_send_wr) + ")");
  if (inline_granted) *inline_granted = int(ia.cap.max_inline_data);  // the device writes back what it gave
  *out = qp;
  return 0;
}

Record local_record(Device &dev, ibv_qp *qp, uint32_t psn) {
  Record r;
  r.qpn = qp->qp_num;
  r.psn = psn;
  r.mtu = uint8_t(dev.mtu());
  r.port = dev.port();
  r.lid = dev.lid();
  std::memcpy(r.gid, dev.gid().raw, 16);
  r.rd_atomic = uint32_t(dev.max_responder_reads());
  return r;
}

int connect_rc_qp(Device &dev, ibv_qp *qp, int access, uint32_t psn, const Record &peer) {
  ibv_qp_attr a = {};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = 0;
  a.port_num = dev.port();
  a.qp_access_flags = access;
  if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return verr(rc, "queue pair to INIT");

  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = ibv_mtu(std::min<int>(int(dev.mtu()), peer.mtu));
  a.dest_qp_num = peer.qpn;
  a.rq_psn = peer.psn;
  a.max_dest_rd_atomic = uint8_t(dev.max_responder_reads());
  a.min_rnr_timer = 12;
  a.ah_attr.port_num = dev.port();
  a.ah_attr.dlid = peer.lid;
  a.ah_attr.sl = 0;
  bool has_gid = false;
  for (uint8_t b : peer.gid) has_gid |= b != 0;
  if (dev.is_roce() || has_gid) {
    a.ah_attr.is_global = 1;
    std::memcpy(a.ah_attr.grh.dgid.raw, peer.gid, 16);
    a.ah_attr.grh.sgid_index = uint8_t(dev.gid_index());
    a.ah_attr.grh.hop_limit = 64;
  }
  if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                         IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return verr(rc, "queue pair to RTR (towards qpn " + std::to_string(peer.qpn) + " gid " + [&] {
      ibv_gid g;
      std::memcpy(g.raw, peer.gid, 16);
      return gid_text(g);
    }() + ")");

  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = psn;
  a.timeout = 14;  // 4.096 us * 2^14 = 67 ms per try; with 7 retries a dead peer shows in ~0.5 s
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.max_rd_atomic = uint8_t(std::min<uint32_t>(uint32_t(dev.max_initiator_reads()), peer.rd_atomic));
  if (int rc = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
    return verr(rc, "queue pair to RTS");
  return 0;
}

void break_qp(ibv_qp *qp) {
  ibv_qp_attr a = {};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

}  // namespace libd::ibv
