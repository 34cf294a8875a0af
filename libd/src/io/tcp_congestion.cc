#include "io/tcp_congestion.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <cstring>

namespace libd {

namespace {

// An IPv4 address in network order, also when written as an IPv4-mapped IPv6 one; false otherwise.
bool ipv4_of(const sockaddr_storage &a, in_addr *out) {
  if (a.ss_family == AF_INET) {
    *out = reinterpret_cast<const sockaddr_in &>(a).sin_addr;
    return true;
  }
  if (a.ss_family == AF_INET6) {
    const in6_addr &v6 = reinterpret_cast<const sockaddr_in6 &>(a).sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&v6)) {
      std::memcpy(out, v6.s6_addr + 12, 4);
      return true;
    }
  }
  return false;
}

std::string congestion_of(int fd) {
  char name[64] = {};
  socklen_t len = sizeof name - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, len));
}

bool paces(const std::string &algorithm) { return algorithm.compare(0, 3, "bbr") == 0; }

}  // namespace

bool same_host(const sockaddr_storage &local, const sockaddr_storage &peer) {
  in_addr l4, p4;
  if (ipv4_of(peer, &p4)) {
    if ((ntohl(p4.s_addr) >> 24) == 127) return true;
    return ipv4_of(local, &l4) && l4.s_addr == p4.s_addr;
  }
  if (peer.ss_family != AF_INET6 || local.ss_family != AF_INET6) return false;
  const in6_addr &p6 = reinterpret_cast<const sockaddr_in6 &>(peer).sin6_addr;
  const in6_addr &l6 = reinterpret_cast<const sockaddr_in6 &>(local).sin6_addr;
  return IN6_IS_ADDR_LOOPBACK(&p6) || std::memcmp(&p6, &l6, sizeof p6) == 0;
}

std::string settle_local_congestion(int fd) {
  std::string now = congestion_of(fd);
  if (!paces(now)) return now;
  sockaddr_storage local = {}, peer = {};
  socklen_t llen = sizeof local, plen = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&local), &llen) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &plen) != 0 || !same_host(local, peer))
    return now;
  for (const char *instead : {"cubic", "reno"})
    if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, instead, socklen_t(std::strlen(instead))) == 0) return instead;
  return now;
}

}  // namespace libd
