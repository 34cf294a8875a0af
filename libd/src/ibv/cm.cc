#include "ibv/cm.h"

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "proto/client_handshake.h"
#include "proto/le.h"

namespace libd::ibv {
namespace {

constexpr int kQpTimeout = 14;  // as connect_rc_qp: 4.096 us * 2^14 = 67 ms per try, 7 tries

const char *state_name(ibv_qp_state s) {
  return s == IBV_QPS_INIT ? "INIT" : s == IBV_QPS_RTR ? "RTR" : s == IBV_QPS_RTS ? "RTS" : "?";
}

// Printable text from a peer's reject private data (it may be padded with zeros, or garbage).
std::string reject_text(const void *data, uint8_t len) {
  std::string s;
  const char *p = static_cast<const char *>(data);
  for (uint8_t i = 0; p && i < len && p[i]; i++) s += (p[i] >= 32 && p[i] < 127) ? p[i] : '?';
  return s;
}

struct Event {
  rdma_cm_event_type type = RDMA_CM_EVENT_ADDR_ERROR;
  int status = 0;
  std::string private_data;
};

// The next event on ch, copied and acknowledged, before the deadline. 0 or -ETIMEDOUT / -errno.
int next_event(rdma_event_channel *ch, const Deadline &deadline, Event *out) {
  for (;;) {
    rdma_cm_event *e = nullptr;
    if (rdma_get_cm_event(ch, &e) == 0) {
      out->type = e->event;
      out->status = e->status;
      out->private_data.assign(static_cast<const char *>(e->param.conn.private_data),
                               e->param.conn.private_data ? e->param.conn.private_data_len : 0);
      rdma_ack_cm_event(e);
      return 0;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
    if (deadline.expired()) return -ETIMEDOUT;
    pollfd p = {ch->fd, POLLIN, 0};
    int ms = int(std::min<int64_t>(deadline.remaining_ms() + 1, 1000));
    if (poll(&p, 1, ms) < 0 && errno != EINTR) return -errno;
  }
}

// Waits for `want`; anything else is a failure described in *why.
int expect(rdma_event_channel *ch, rdma_cm_event_type want, const Deadline &deadline, Event *ev, std::string *why) {
  if (int rc = next_event(ch, deadline, ev)) {
    *why = rc == -ETIMEDOUT ? std::string("no ") + rdma_event_str(want) + " in time"
                            : std::string("reading rdma_cm events failed: ") + strerror(-rc);
    return rc;
  }
  if (ev->type == want && ev->status == 0) return 0;
  *why = std::string(rdma_event_str(ev->type));
  if (ev->type == RDMA_CM_EVENT_REJECTED) {
    std::string text = reject_text(ev->private_data.data(), uint8_t(std::min<size_t>(ev->private_data.size(), 255)));
    *why += text.empty() ? " (reason " + std::to_string(ev->status) + ")" : ": " + text;
    return -ECONNREFUSED;
  }
  if (ev->status) *why += std::string(" (") + strerror(ev->status < 0 ? -ev->status : ev->status) + ")";
  if (ev->type == RDMA_CM_EVENT_ADDR_ERROR || ev->type == RDMA_CM_EVENT_ROUTE_ERROR ||
      ev->type == RDMA_CM_EVENT_UNREACHABLE)
    return -EHOSTUNREACH;
  return -EPROTO;
}

}  // namespace

std::string encode_cm_hello(const std::string &ticket) {
  std::string s(kCmHelloSize, '\0');
  proto::put_le(s.data(), kCmHelloMagic, 2);
  proto::put_le(s.data() + 2, kCmHelloVersion, 1);
  std::memcpy(s.data() + 4, ticket.data(), std::min(ticket.size(), kTicketSize));
  return s;
}

int decode_cm_hello(const void *data, size_t n, std::string *ticket, std::string *why) {
  const char *p = static_cast<const char *>(data);
  if (!p || n < kCmHelloSize) {
    *why = "rdma_cm request: " + std::to_string(p ? n : 0) + " bytes of private data, expected " +
           std::to_string(kCmHelloSize);
    return -EPROTO;
  }
  if (proto::get_le(p, 2) != kCmHelloMagic) { *why = "rdma_cm request: bad magic (not a Scad client?)"; return -EPROTO; }
  if (proto::get_le(p + 2, 1) != kCmHelloVersion) {
    *why = "rdma_cm request: version " + std::to_string(proto::get_le(p + 2, 1)) + " (this side speaks 1)";
    return -EPROTO;
  }
  for (size_t i = kCmHelloSize; i < n; i++)
    if (p[i]) { *why = "rdma_cm request: trailing bytes are not zero"; return -EPROTO; }
  if (p[3]) { *why = "rdma_cm request: reserved byte is not zero"; return -EPROTO; }
  ticket->assign(p + 4, kTicketSize);
  return 0;
}

std::string encode_cm_ticket(uint16_t port, const std::string &ticket) {
  std::string s(kCmTicketBodySize, '\0');
  proto::put_le(s.data(), port, 2);
  std::memcpy(s.data() + 2, ticket.data(), std::min(ticket.size(), kTicketSize));
  return s;
}

int decode_cm_ticket(const char *p, size_t n, uint16_t *port, std::string *ticket, std::string *why) {
  if (n != kCmTicketBodySize) {
    *why = "rdma_cm ticket: " + std::to_string(n) + " bytes, expected " + std::to_string(kCmTicketBodySize);
    return -EPROTO;
  }
  *port = uint16_t(proto::get_le(p, 2));
  if (*port == 0) { *why = "rdma_cm ticket: port 0"; return -EPROTO; }
  ticket->assign(p + 2, kTicketSize);
  return 0;
}

int cm_modify_qp(rdma_cm_id *id, ibv_qp *qp, ibv_qp_state state, int access, uint32_t *psn) {
  ibv_qp_attr a = {};
  int mask = 0;
  a.qp_state = state;
  if (rdma_init_qp_attr(id, &a, &mask))
    return set_error(-errno, std::string("verbs: rdma_cm has no ") + state_name(state) +
                                 " attributes for this connection: " + strerror(errno));
  if (state == IBV_QPS_INIT && access >= 0) a.qp_access_flags = unsigned(access);
  if (state == IBV_QPS_RTS) {
    a.timeout = kQpTimeout;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    if (a.max_rd_atomic == 0) a.max_rd_atomic = 1;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    if (psn) *psn = a.sq_psn;
  }
  if (state == IBV_QPS_RTR && a.max_dest_rd_atomic == 0) a.max_dest_rd_atomic = 1;
  if (int rc = ibv_modify_qp(qp, &a, mask)) {
    int err = rc > 0 ? rc : (errno ? errno : EIO);
    return set_error(-err, std::string("verbs: queue pair to ") + state_name(state) + " (rdma_cm attributes): " + strerror(err));
  }
  return 0;
}

int cm_check_device(rdma_cm_id *id, const Device &dev, std::string *why) {
  if (!id->verbs) {
    *why = "the route has no RDMA device";
    return -ENODEV;
  }
  std::string name = ibv_get_device_name(id->verbs->device);
  if (name != dev.name() || id->port_num != dev.port()) {
    *why = "the route leaves through " + name + " port " + std::to_string(id->port_num) + ", not " + dev.name() +
           " port " + std::to_string(dev.port()) + " (set dev=" + name + ")";
    return -ENODEV;
  }
  return 0;
}

CmLink::~CmLink() {
  if (id) rdma_destroy_id(id);  // sends a DREQ if connected
  if (channel) rdma_destroy_event_channel(channel);
}

int cm_connect(Device &dev, ibv_qp *qp, const std::string &host, uint16_t port, const std::string &ticket,
               Deadline deadline, std::unique_ptr<CmLink> *out, Record *peer, CmStage *stage) {
  *stage = CmStage::kRoute;
  auto fail = [&](int rc, const std::string &why) {
    return set_error(rc, "rdma_cm to " + host + ":" + std::to_string(port) + ": " + why);
  };
  sockaddr_storage dst;
  socklen_t len;
  if (int rc = proto::resolve(host, std::to_string(port), &dst, &len)) return rc;
  auto link = std::make_unique<CmLink>();
  link->channel = rdma_create_event_channel();
  if (!link->channel) return fail(-errno, std::string("cannot create an event channel: ") + strerror(errno));
  int fl = fcntl(link->channel->fd, F_GETFL);
  fcntl(link->channel->fd, F_SETFL, fl | O_NONBLOCK);
  if (rdma_create_id(link->channel, &link->id, nullptr, RDMA_PS_TCP))
    return fail(-errno, std::string("cannot create an identifier: ") + strerror(errno));

  Event ev;
  std::string why;
  int ms = int(std::clamp<int64_t>(deadline.remaining_ms(), 1, 5000));
  if (rdma_resolve_addr(link->id, nullptr, reinterpret_cast<sockaddr *>(&dst), ms))
    return fail(-errno, std::string("cannot resolve the address: ") + strerror(errno));
  if (int rc = expect(link->channel, RDMA_CM_EVENT_ADDR_RESOLVED, deadline, &ev, &why)) return fail(rc, why);
  if (int rc = cm_check_device(link->id, dev, &why)) return fail(rc, why);
  ms = int(std::clamp<int64_t>(deadline.remaining_ms(), 1, 5000));
  if (rdma_resolve_route(link->id, ms)) return fail(-errno, std::string("cannot resolve the route: ") + strerror(errno));
  if (int rc = expect(link->channel, RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, &ev, &why)) return fail(rc, why);

  *stage = CmStage::kConnect;
  // Our queue pair grants no remote access: the server never reads or writes our memory.
  if (int rc = cm_modify_qp(link->id, qp, IBV_QPS_INIT, 0)) return rc;
  std::string hello = encode_cm_hello(ticket);
  rdma_conn_param cp = {};
  cp.private_data = hello.data();
  cp.private_data_len = uint8_t(hello.size());
  cp.responder_resources = uint8_t(dev.max_responder_reads());
  cp.initiator_depth = uint8_t(dev.max_initiator_reads());
  cp.retry_count = 7;
  cp.rnr_retry_count = 7;
  cp.qp_num = qp->qp_num;  // a queue pair rdma_cm does not own: it reports CONNECT_RESPONSE
  if (rdma_connect(link->id, &cp)) return fail(-errno, std::string("cannot send the request: ") + strerror(errno));
  if (int rc = expect(link->channel, RDMA_CM_EVENT_CONNECT_RESPONSE, deadline, &ev, &why)) {
    if (rc == -ECONNREFUSED) why = "the memory element refused the connection: " + why;
    return fail(rc, why);
  }
  // The REP's private data is padded by the CM: the record is its first 64 bytes.
  if (ev.private_data.size() < kRecordSize) return fail(-EPROTO, "the answer carries no verbs record");
  if (int rc = decode_record(ev.private_data.data(), kRecordSize, peer, &why)) return fail(rc, why);
  if (int rc = cm_modify_qp(link->id, qp, IBV_QPS_RTR, -1)) return rc;
  if (int rc = cm_modify_qp(link->id, qp, IBV_QPS_RTS, -1)) return rc;
  if (rdma_establish(link->id)) return fail(-errno, std::string("cannot complete the exchange: ") + strerror(errno));
  *out = std::move(link);
  return 0;
}

}  // namespace libd::ibv
