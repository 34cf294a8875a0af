// A tcp connection between two ends on one host crosses no network, so libd keeps BBR off it:
// a socket whose congestion control is BBR gets cubic (reno where cubic cannot be set) before it
// connects or listens, and a connection that turns out to join two hosts gets BBR back. Checked
// on the address rule, on sockets given BBR, on the policy's settings, and on both ends of a real
// transport's connection.
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

sockaddr_storage v4(const char *ip) {
  sockaddr_storage s = {};
  auto &a = reinterpret_cast<sockaddr_in &>(s);
  a.sin_family = AF_INET;
  inet_pton(AF_INET, ip, &a.sin_addr);
  return s;
}

sockaddr_storage v6(const char *ip) {
  sockaddr_storage s = {};
  auto &a = reinterpret_cast<sockaddr_in6 &>(s);
  a.sin6_family = AF_INET6;
  inet_pton(AF_INET6, ip, &a.sin6_addr);
  return s;
}

bool set_congestion(int fd, const std::string &algorithm) {
  return setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, algorithm.data(), socklen_t(algorithm.size())) == 0;
}

// Whether this process may give a socket `algorithm` (tried, not guessed from the sysctls: root
// may set algorithms the allowed list leaves out).
bool settable(const std::string &algorithm) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  bool ok = set_congestion(fd, algorithm);
  close(fd);
  return ok;
}

std::string same_host_choice() { return settable("cubic") ? "cubic" : "reno"; }

// A listening socket on 127.0.0.1 (an ephemeral port), given `algorithm` first when not empty.
int listener(const std::string &algorithm, sockaddr_in *where) {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (!algorithm.empty()) {
    EXPECT_TRUE(set_congestion(l, algorithm));
  }
  sockaddr_storage a = v4("127.0.0.1");
  socklen_t len = sizeof(sockaddr_in);
  EXPECT_EQ(0, bind(l, reinterpret_cast<sockaddr *>(&a), len));
  EXPECT_EQ(0, getsockname(l, reinterpret_cast<sockaddr *>(&a), &len));
  *where = reinterpret_cast<sockaddr_in &>(a);
  return l;
}

// Every connected tcp socket of this process with `port` at either end.
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

std::string host_default() {
  std::ifstream f("/proc/sys/net/ipv4/tcp_congestion_control");
  std::string name;
  f >> name;
  return name;
}

}  // namespace

TEST(TcpCongestion, SameHostIsLoopbackOrTheSocketsOwnAddress) {
  EXPECT_TRUE(libd::same_host(v4("127.0.0.1"), v4("127.0.0.1")));
  EXPECT_TRUE(libd::same_host(v4("127.0.0.1"), v4("127.3.4.5")));
  EXPECT_TRUE(libd::same_host(v4("10.1.2.3"), v4("10.1.2.3")));  // the host reaching itself
  EXPECT_FALSE(libd::same_host(v4("10.1.2.3"), v4("10.1.2.4")));
  EXPECT_FALSE(libd::same_host(v4("10.1.2.3"), v4("128.0.0.1")));
  EXPECT_TRUE(libd::same_host(v6("::1"), v6("::1")));
  EXPECT_TRUE(libd::same_host(v6("fd00::1"), v6("::1")));
  EXPECT_TRUE(libd::same_host(v6("::ffff:127.0.0.1"), v6("::ffff:127.0.0.1")));
  EXPECT_TRUE(libd::same_host(v6("::ffff:10.0.0.1"), v6("::ffff:10.0.0.1")));
  EXPECT_TRUE(libd::same_host(v4("10.0.0.1"), v6("::ffff:10.0.0.1")));
  EXPECT_TRUE(libd::same_host(v6("fd00::1"), v6("fd00::1")));
  EXPECT_FALSE(libd::same_host(v6("fd00::1"), v6("fd00::2")));
  EXPECT_FALSE(libd::same_host(v6("::ffff:10.0.0.1"), v6("::ffff:10.0.0.2")));
  sockaddr_storage unix_addr = {};
  unix_addr.ss_family = AF_UNIX;
  EXPECT_FALSE(libd::same_host(unix_addr, unix_addr));
}

// The client's way: chosen before connect, kept on a connection that stays on the host.
TEST(TcpCongestion, AClientSocketWithBbrConnectsToItsOwnHostWithoutIt) {
  if (!settable("bbr")) GTEST_SKIP() << "this host offers no bbr";
  sockaddr_in where;
  int l = listener("", &where);
  ASSERT_EQ(0, listen(l, 1));
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_TRUE(set_congestion(c, "bbr"));
  EXPECT_EQ("bbr", libd::prefer_unpaced(c, ""));
  EXPECT_EQ(same_host_choice(), libd::congestion_of(c));
  ASSERT_EQ(0, connect(c, reinterpret_cast<sockaddr *>(&where), sizeof where));
  libd::restore_between_hosts(c, "bbr");
  EXPECT_EQ(same_host_choice(), libd::congestion_of(c));
  close(c);
  close(l);
}

// The server's way: the listener's choice is what the connections it accepts start with.
TEST(TcpCongestion, AListenerWithBbrAcceptsConnectionsWithoutIt) {
  if (!settable("bbr")) GTEST_SKIP() << "this host offers no bbr";
  sockaddr_in where;
  int l = listener("bbr", &where);
  EXPECT_EQ("bbr", libd::prefer_unpaced(l, ""));
  ASSERT_EQ(0, listen(l, 1));
  int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(0, connect(c, reinterpret_cast<sockaddr *>(&where), sizeof where));
  int a = accept(l, nullptr, nullptr);
  ASSERT_GE(a, 0);
  EXPECT_EQ(same_host_choice(), libd::congestion_of(a));
  libd::restore_between_hosts(a, "bbr");
  EXPECT_EQ(same_host_choice(), libd::congestion_of(a));
  close(a);
  close(c);
  close(l);
}

TEST(TcpCongestion, ThePolicyKeepsOrNamesTheAlgorithm) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_TRUE(set_congestion(fd, "reno"));  // built into every kernel, and does not pace
  EXPECT_EQ("", libd::prefer_unpaced(fd, ""));  // auto: a choice that does not pace is left alone
  EXPECT_EQ("reno", libd::congestion_of(fd));
  if (settable("cubic")) {
    EXPECT_EQ("reno", libd::prefer_unpaced(fd, "cubic"));  // a name: given whatever the socket had
    EXPECT_EQ("cubic", libd::congestion_of(fd));
  }
  if (settable("bbr")) {
    ASSERT_TRUE(set_congestion(fd, "bbr"));
    EXPECT_EQ("", libd::prefer_unpaced(fd, "keep"));
    EXPECT_EQ("bbr", libd::congestion_of(fd));
  }
  EXPECT_EQ("", libd::prefer_unpaced(fd, "no-such-algorithm"));  // cannot be set: nothing changes
  close(fd);
  EXPECT_EQ("", libd::prefer_unpaced(-1, ""));  // not a socket: nothing read, nothing changed
  EXPECT_EQ("", libd::congestion_of(-1));
}

// Both ends of a tcp transport's connection to an in-process memory server, on a host whose
// default is BBR (elsewhere there is nothing to see).
TEST(TcpCongestion, BothEndsOfATransportsConnectionRunWithoutBbr) {
  if (host_default().compare(0, 3, "bbr") != 0) GTEST_SKIP() << "this host's default is " << host_default();
  test::Rig rig = test::make_rig("tcp", 4096);
  ASSERT_NE(nullptr, rig.t);
  ASSERT_EQ(0, libd_transport_connect(rig.t)) << libd_last_error();
  std::vector<int> ends = sockets_on_port(rig.port);
  ASSERT_EQ(2u, ends.size()) << "the client's socket and the server's";
  for (int fd : ends) EXPECT_EQ(same_host_choice(), libd::congestion_of(fd)) << "fd " << fd;
}
