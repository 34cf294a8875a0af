#include "proto/client_handshake.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "io/sockio.h"
#include "io/tcp_congestion.h"
#include "proto/frame.h"
#include "libd.h"

namespace libd::proto {

std::string refusal_reason(int status) {
  if (status == -EACCES)
    return "the memory element refused the grant (unknown or revoked grant, wrong secret, or another client's grant)";
  if (status == -EPERM)
    return "the grant covers part of its element, and shm can only hand out whole elements: reach it over tcp";
  if (status == -EMFILE)
    return "the shared connection holds as many grants as the memory element allows on one connection "
           "(the next transport opens another)";
  if (status == -EOPNOTSUPP)
    return "a shared connection on the memory element's unix socket reaches lent memory only";
  return std::string("the memory element refused the connection: ") + libd_strerror(status);
}

int resolve(const std::string &host, const std::string &port, sockaddr_storage *out, socklen_t *len) {
  struct addrinfo hints = {}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  int gai = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (gai != 0) return set_error(-EHOSTUNREACH, "cannot resolve '" + host + "': " + gai_strerror(gai));
  *len = res->ai_addrlen;
  std::memcpy(out, res->ai_addr, *len);
  freeaddrinfo(res);
  return 0;
}

std::string encode_attach(uint32_t handle, const Credentials &creds, const std::string &nonce, bool quiet) {
  std::string body = encode_auth({creds.grant_id, creds.client_id,
                                  compute_mac(creds.secret, nonce, creds.grant_id, creds.client_id)});
  Header h;
  h.opcode = kAttach;
  h.addr = handle;
  h.req_id = quiet ? kAttachQuiet : 0;
  h.size = body.size();
  char hdr[kHeaderSize];
  encode_header(h, hdr);
  return std::string(hdr, kHeaderSize) + body;
}

int connect_authenticated(const sockaddr *addr, socklen_t len, const Credentials &creds, const Deadline &deadline,
                          int *out_fd, GrantBody *grant, uint64_t auth_flags, std::string *nonce_out) {
  int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return set_error(-errno, std::string("socket: ") + strerror(errno));
  auto fail = [&](int rc, const std::string &why) {
    ::close(fd);
    return set_error(rc, why);
  };
  int one = 1, idle = 10;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  // Chosen before the connection exists, so that a same-host one never runs BBR (tcp_congestion.h).
  std::string between_hosts = prefer_unpaced(fd);
  if (int rc = connect_before(fd, addr, len, deadline))
    return fail(rc, std::string("cannot connect to the memory element: ") + strerror(-rc));
  restore_between_hosts(fd, between_hosts);

  auto io_fail = [&](int rc) {
    return fail(rc, rc == -ETIMEDOUT ? "no handshake from the memory element in time"
                                     : std::string("handshake with the memory element failed: ") + strerror(-rc));
  };
  char hdr[kHeaderSize];
  Header h;
  std::string why;
  if (int rc = recv_exact(fd, hdr, kHeaderSize, deadline)) return io_fail(rc);
  if (decode_header(hdr, &h, &why) || h.opcode != kChallenge || h.size != kNonceSize)
    return fail(-EPROTO, "the memory element sent no valid challenge: " + why);
  std::string nonce(kNonceSize, '\0');
  if (int rc = recv_exact(fd, nonce.data(), kNonceSize, deadline)) return io_fail(rc);

  std::string body = encode_auth({creds.grant_id, creds.client_id,
                                  compute_mac(creds.secret, nonce, creds.grant_id, creds.client_id)});
  Header ah;
  ah.opcode = kAuth;
  ah.addr = auth_flags;
  ah.size = body.size();
  encode_header(ah, hdr);
  std::string msg = std::string(hdr, kHeaderSize) + body;
  if (int rc = send_all(fd, msg.data(), msg.size(), deadline)) return io_fail(rc);

  if (int rc = recv_exact(fd, hdr, kHeaderSize, deadline)) return io_fail(rc);
  if (decode_header(hdr, &h, &why) || h.opcode != kAuthOk)
    return fail(-EPROTO, "the memory element sent no valid answer: " + why);
  if (h.status != 0)
    return fail(h.status, refusal_reason(h.status));
  std::string gbody(size_t(payload_length(h)), '\0');
  if (int rc = recv_exact(fd, gbody.data(), gbody.size(), deadline)) return io_fail(rc);
  if (decode_grant(gbody.data(), gbody.size(), grant, &why)) return fail(-EPROTO, why);
  if (nonce_out) *nonce_out = nonce;
  *out_fd = fd;
  return 0;
}

}  // namespace libd::proto
