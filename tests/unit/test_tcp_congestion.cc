// A tcp connection between two ends on one host crosses no network, so libd gives it a congestion
// control that does not pace (cubic, or reno) where the socket had a pacing one (BBR); between
// hosts the host's choice stays. Checked on the address rule, on sockets given BBR, and on both
// ends of a real transport's connection.
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "harness.h"
#include "io/tcp_congestion.h"

namespace {

sockaddr_storage v4(const char *ip, uint16_t port = 0) {
  sockaddr_storage s = {};
  auto &a = reinterpret_cast<sockaddr_in &>(s);
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  return s;
}

sockaddr_storage v6(const char *ip, uint16_t port = 0) {
  sockaddr_storage s = {};
  auto &a = reinterpret_cast<sockaddr_in6 &>(s);
  a.sin6_family = AF_INET6;
  a.sin6_port = htons(port);
  inet_pton(AF_INET6, ip, &a.sin6_addr);
  return s;
}

std::string congestion_of(int fd) {
  char name[64] = {};
  socklen_t len = sizeof name - 1;
  if (getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) != 0) return "";
  return std::string(name, strnlen(name, len));
}

bool allowed(const std::string &algorithm) {
  std::ifstream f("/proc/sys/net/ipv4/tcp_allowed_congestion_control");
  std::string name;
  while (f >> name)
    if (name == algorithm) return true;
  return false;
}

// A connected pair of tcp sockets on 127.0.0.1: {client, server}.
struct LoopbackPair {
  int client = -1, server = -1;
  LoopbackPair() {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_storage a = v4("127.0.0.1");
    socklen_t len = sizeof(sockaddr_in);
    EXPECT_EQ(0, bind(l, reinterpret_cast<sockaddr *>(&a), len));
    EXPECT_EQ(0, listen(l, 1));
    EXPECT_EQ(0, getsockname(l, reinterpret_cast<sockaddr *>(&a), &len));
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(0, connect(client, reinterpret_cast<sockaddr *>(&a), len));
    server = accept(l, nullptr, nullptr);
    EXPECT_GE(server, 0);
    close(l);
  }
  ~LoopbackPair() {
    close(client);
    close(server);
  }
};

// Every tcp socket of this process with `port` at either end.
std::vector<int> sockets_on_port(uint16_t port) {
  std::vector<int> out;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return out;
  while (dirent *e = readdir(d)) {
    int fd = atoi(e->d_name);
    if (e->d_name[0] == '.' || fd == dirfd(d)) continue;
    int type = 0;
    socklen_t tl = sizeof type;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_STREAM) continue;
    sockaddr_storage l = {}, p = {};
    socklen_t ll = sizeof l, pl = sizeof p;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&l), &ll) != 0 || l.ss_family != AF_INET) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&p), &pl) != 0) continue;  // a listener
    if (ntohs(reinterpret_cast<sockaddr_in &>(l).sin_port) == port ||
        ntohs(reinterpret_cast<sockaddr_in &>(p).sin_port) == port)
      out.push_back(fd);
  }
  closedir(d);
  return out;
}

}  // namespace

TEST(TcpCongestion, SameHostIsLoopbackOrTheHostsOwnAddress) {
  EXPECT_TRUE(libd::same_host(v4("127.0.0.1", 5000), v4("127.0.0.1", 6000)));
  EXPECT_TRUE(libd::same_host(v4("127.0.0.1"), v4("127.3.4.5")));
  EXPECT_TRUE(libd::same_host(v4("10.1.2.3"), v4("10.1.2.3")));  // the host reaching itself
  EXPECT_FALSE(libd::same_host(v4("10.1.2.3"), v4("10.1.2.4")));
  EXPECT_FALSE(libd::same_host(v4("10.1.2.3"), v4("128.0.0.1")));
  EXPECT_TRUE(libd::same_host(v6("::1"), v6("::1")));
  EXPECT_TRUE(libd::same_host(v6("::ffff:127.0.0.1"), v6("::ffff:127.0.0.1")));
  EXPECT_TRUE(libd::same_host(v6("fd00::1"), v6("fd00::1")));
  EXPECT_FALSE(libd::same_host(v6("fd00::1"), v6("fd00::2")));
  EXPECT_FALSE(libd::same_host(v6("::ffff:10.0.0.1"), v6("::ffff:10.0.0.2")));
  sockaddr_storage unix_addr = {};
  unix_addr.ss_family = AF_UNIX;
  EXPECT_FALSE(libd::same_host(unix_addr, unix_addr));
}

TEST(TcpCongestion, ALoopbackSocketWithBbrIsGivenCubic) {
  if (!allowed("bbr")) GTEST_SKIP() << "bbr is not among this host's allowed congestion controls";
  LoopbackPair pair;
  const char bbr[] = "bbr";
  ASSERT_EQ(0, setsockopt(pair.client, IPPROTO_TCP, TCP_CONGESTION, bbr, socklen_t(strlen(bbr)))) << strerror(errno);
  ASSERT_EQ("bbr", congestion_of(pair.client));
  std::string expected = allowed("cubic") ? "cubic" : "reno";
  EXPECT_EQ(expected, libd::settle_local_congestion(pair.client));
  EXPECT_EQ(expected, congestion_of(pair.client));
}

TEST(TcpCongestion, ANonPacingChoiceIsLeftAlone) {
  LoopbackPair pair;
  const char reno[] = "reno";  // built into every kernel
  ASSERT_EQ(0, setsockopt(pair.server, IPPROTO_TCP, TCP_CONGESTION, reno, socklen_t(strlen(reno)))) << strerror(errno);
  EXPECT_EQ("reno", libd::settle_local_congestion(pair.server));
  EXPECT_EQ("reno", congestion_of(pair.server));
  EXPECT_EQ("", libd::settle_local_congestion(-1));  // not a socket: nothing read, nothing changed
}

// Both ends of a tcp transport's connection to an in-process memory server (on a host whose
// default paces, this is where BBR would otherwise be).
TEST(TcpCongestion, BothEndsOfATransportsConnectionDoNotPace) {
  test::Rig rig = test::make_rig("tcp", 4096);
  ASSERT_NE(nullptr, rig.t);
  ASSERT_EQ(0, libd_transport_connect(rig.t)) << libd_last_error();
  uint16_t port = 0;
  if (auto at = rig.config.find("port,"); at != std::string::npos) port = uint16_t(std::stoi(rig.config.substr(at + 5)));
  ASSERT_NE(0, port) << rig.config;
  std::vector<int> ends = sockets_on_port(port);
  ASSERT_EQ(2u, ends.size()) << "the client's socket and the server's";
  for (int fd : ends) {
    std::string algorithm = congestion_of(fd);
    EXPECT_FALSE(algorithm.empty());
    EXPECT_NE(0, algorithm.compare(0, 3, "bbr")) << "fd " << fd << " uses " << algorithm;
  }
}
