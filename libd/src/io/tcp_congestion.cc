#include "io/tcp_congestion.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <cstdlib>
#include <cstring>
#include <vector>

namespace libd {

namespace {

// An IPv4 address, also when written as an IPv4-mapped IPv6 one; false otherwise.
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

bool paces(const std::string &algorithm) { return algorithm.compare(0, 3, "bbr") == 0; }

bool set_congestion(int fd, const std::string &algorithm) {
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, algorithm.data(), socklen_t(algorithm.size())) == 0;
}

// LIBD_TCP_CONGESTION, read once: "" for auto, "keep", or an algorithm's name.
const std::string &policy() {
  static const std::string value = [] {
    const char *e = std::getenv("LIBD_TCP_CONGESTION");
    std::string v = e ? e : "";
    return v == "auto" ? std::string() : v;
  }();
  return value;
}

}  // namespace

std::string congestion_of(int fd) {
  char name[64] = {};
  socklen_t len = sizeof name - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, len));
}

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

std::string prefer_unpaced(int fd) { return prefer_unpaced(fd, policy()); }

std::string prefer_unpaced(int fd, const std::string &chosen) {
  if (chosen == "keep") return "";
  std::string had = congestion_of(fd);
  if (had.empty() || (chosen.empty() && !paces(had)) || had == chosen) return "";
  std::vector<std::string> instead = chosen.empty() ? std::vector<std::string>{"cubic", "reno"}
                                                    : std::vector<std::string>{chosen};
  for (const std::string &algorithm : instead)
    if (set_congestion(fd, algorithm)) return had;
  return "";
}

void restore_between_hosts(int fd, const std::string &original) {
  if (original.empty()) return;
  sockaddr_storage local = {}, peer = {};
  socklen_t llen = sizeof local, plen = sizeof peer;
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&local), &llen) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr *>(&peer), &plen) != 0 || same_host(local, peer))
    return;
  set_congestion(fd, original);
}

}  // namespace libd
