#include "transports/verbs/verbs_connect.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/sockio.h"
#include "libd.h"
#include "proto/frame.h"
#include "ibv/qp.h"

namespace libd::ibv {

using namespace proto;

bool parse_setup(const std::string &s, Setup *out) {
  if (s == "auto") *out = Setup::kAuto;
  else if (s == "cm") *out = Setup::kCm;
  else if (s == "oob") *out = Setup::kOob;
  else return false;
  return true;
}

namespace {

// One control frame out and its answer back on the authenticated connection. 0 with *h and *body
// (h->status may still be a refusal), or a negative errno with *why.
int exchange(int fd, Opcode op, const std::string &payload, Opcode want, const Deadline &deadline, Header *h,
             std::string *body, std::string *why) {
  char hdr[kHeaderSize];
  Header out;
  out.opcode = op;
  out.size = payload.size();
  encode_header(out, hdr);
  std::string msg = std::string(hdr, kHeaderSize) + payload;
  auto io_fail = [&](int rc) {
    *why = rc == -ETIMEDOUT ? std::string("the memory element did not answer ") + opcode_name(op) + " in time"
                            : std::string("verbs handshake failed: ") + strerror(-rc);
    return rc;
  };
  if (int rc = send_all(fd, msg.data(), msg.size(), deadline)) return io_fail(rc);
  if (int rc = recv_exact(fd, hdr, kHeaderSize, deadline)) return io_fail(rc);
  std::string bad;
  if (decode_header(hdr, h, &bad) || h->opcode != want) {
    *why = std::string("the memory element sent no valid ") + opcode_name(want) + ": " +
           (bad.empty() ? std::string(opcode_name(h->opcode)) : bad);
    return -EPROTO;
  }
  body->assign(size_t(payload_length(*h)), '\0');
  if (int rc = recv_exact(fd, body->data(), body->size(), deadline)) return io_fail(rc);
  return 0;
}

}  // namespace

int connect_driver(std::shared_ptr<Device> dev, const QpDriver::Config &cfg, const std::string &host,
                   const std::string &port, const Credentials &creds, Setup setup, Deadline deadline,
                   QpDriver::FailFn on_fail, Connected *out) {
  auto where = [&] { return " (" + host + ":" + port + ")"; };
  sockaddr_storage addr;
  socklen_t len;
  if (int rc = resolve(host, port, &addr, &len)) return rc;
  GrantBody grant;
  int fd = -1;
  if (int rc = connect_authenticated(reinterpret_cast<sockaddr *>(&addr), len, creds, deadline, &fd, &grant))
    return set_error(rc, last_error() + where());
  auto give_up = [&](int rc, const std::string &why) {
    ::close(fd);  // every failure comes before the driver takes the socket
    return set_error(rc, why + where());
  };
  std::shared_ptr<QpDriver> driver;
  if (int rc = QpDriver::create(dev, cfg, std::move(on_fail), &driver)) return give_up(rc, last_error());

  Header h;
  std::string reply, why;
  Record peer;
  bool via_cm = false;
  std::string cm_skipped;
  if (setup != Setup::kOob) {
    if (int rc = exchange(fd, kVerbsCmRequest, "", kVerbsCmTicket, deadline, &h, &reply, &why)) return give_up(rc, why);
    uint16_t cm_port = 0;
    std::string ticket;
    if (h.status != 0) {
      cm_skipped = reply.empty() ? std::string(libd_strerror(h.status)) : reply;
      if (setup == Setup::kCm) return give_up(h.status, "the memory element offers no rdma_cm: " + cm_skipped);
    } else if (int rc = decode_cm_ticket(reply.data(), reply.size(), &cm_port, &ticket, &why)) {
      return give_up(rc, why);
    } else {
      std::unique_ptr<CmLink> link;
      CmStage stage;
      int crc = cm_connect(*dev, driver->qp(), host, cm_port, ticket, deadline, &link, &peer, &stage);
      if (crc == 0) {
        driver->attach_cm(std::move(link));
        via_cm = true;
      } else if (setup == Setup::kCm || stage != CmStage::kRoute) {
        return give_up(crc, last_error());
      } else {
        cm_skipped = last_error();
      }
    }
  }
  if (!via_cm) {
    uint32_t psn = random_psn();
    if (int rc = exchange(fd, kVerbsConnect, encode_record(local_record(*dev, driver->qp(), psn)), kVerbsAccept,
                          deadline, &h, &reply, &why))
      return give_up(rc, why);
    if (h.status != 0)
      return give_up(h.status, "the memory element refused the verbs connection: " +
                                   (reply.empty() ? std::string(libd_strerror(h.status)) : reply));
    if (decode_record(reply.data(), reply.size(), &peer, &why)) return give_up(-EPROTO, why);
    // Our queue pair grants no remote access: the server never reads or writes our memory.
    if (int rc = connect_rc_qp(*dev, driver->qp(), 0, psn, peer)) return give_up(rc, last_error());
  }
  if (peer.length != grant.length || peer.rights != (grant.rights & 3u))
    return give_up(-EPROTO, "the memory element's verbs key does not match its grant");
  driver->set_remote(grant.offset, peer.addr, peer.rkey, (peer.rights & LIBD_RIGHT_WRITE) != 0);
  driver->start(fd);
  out->driver = std::move(driver);
  out->grant = grant;
  out->peer = peer;
  out->via_cm = via_cm;
  out->cm_skipped = cm_skipped;
  return 0;
}

}  // namespace libd::ibv
