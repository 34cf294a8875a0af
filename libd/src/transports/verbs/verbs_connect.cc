#include "transports/verbs/verbs_connect.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/sockio.h"
#include "libd.h"
#include "proto/frame.h"
#include "verbs/qp.h"

namespace libd::verbs {

using namespace proto;

int connect_engine(std::shared_ptr<Device> dev, const Engine::Config &cfg, const std::string &host,
                   const std::string &port, const Credentials &creds, Deadline deadline, Engine::FailFn on_fail,
                   Connected *out) {
  auto where = [&] { return " (" + host + ":" + port + ")"; };
  sockaddr_storage addr;
  socklen_t len;
  if (int rc = resolve(host, port, &addr, &len)) return rc;
  GrantBody grant;
  int fd = -1;
  if (int rc = connect_authenticated(reinterpret_cast<sockaddr *>(&addr), len, creds, deadline, &fd, &grant))
    return set_error(rc, last_error() + where());
  auto give_up = [&](int rc, const std::string &why) {
    ::close(fd);  // every failure comes before the engine takes the socket
    return set_error(rc, why + where());
  };
  std::shared_ptr<Engine> engine;
  if (int rc = Engine::create(dev, cfg, std::move(on_fail), &engine)) return give_up(rc, last_error());

  uint32_t psn = random_psn();
  std::string body = encode_record(local_record(*dev, engine->qp(), psn));
  char hdr[kHeaderSize];
  Header h;
  h.opcode = kVerbsConnect;
  h.size = body.size();
  encode_header(h, hdr);
  std::string msg = std::string(hdr, kHeaderSize) + body;
  auto io_fail = [&](int rc) {
    return give_up(rc, rc == -ETIMEDOUT ? "the memory element did not answer the verbs handshake in time"
                                        : std::string("verbs handshake failed: ") + strerror(-rc));
  };
  if (int rc = send_all(fd, msg.data(), msg.size(), deadline)) return io_fail(rc);
  if (int rc = recv_exact(fd, hdr, kHeaderSize, deadline)) return io_fail(rc);
  std::string why;
  if (decode_header(hdr, &h, &why) || h.opcode != kVerbsAccept)
    return give_up(-EPROTO, "the memory element sent no valid verbs answer: " +
                                (why.empty() ? std::string(opcode_name(h.opcode)) : why));
  std::string reply(size_t(payload_length(h)), '\0');
  if (int rc = recv_exact(fd, reply.data(), reply.size(), deadline)) return io_fail(rc);
  if (h.status != 0)
    return give_up(h.status, "the memory element refused the verbs connection: " +
                                 (reply.empty() ? std::string(libd_strerror(h.status)) : reply));
  Record peer;
  if (decode_record(reply.data(), reply.size(), &peer, &why)) return give_up(-EPROTO, why);
  if (peer.length != grant.length || peer.rights != (grant.rights & 3u))
    return give_up(-EPROTO, "the memory element's verbs key does not match its grant");
  // Our queue pair grants no remote access: the server never reads or writes our memory.
  if (int rc = connect_rc_qp(*dev, engine->qp(), 0, psn, peer)) return give_up(rc, last_error());
  engine->set_remote(grant.offset, peer.addr, peer.rkey);
  engine->start(fd);
  out->engine = std::move(engine);
  out->grant = grant;
  out->peer = peer;
  return 0;
}

}  // namespace libd::verbs
