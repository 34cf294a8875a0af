// Access by grant: the element, the range, the rights, the client; enforced by the server.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "harness.h"
#include "proto/auth.h"
#include "proto/frame.h"

using namespace libd::proto;
using test::make_action;
using test::make_rig;

class Networked : public ::testing::TestWithParam<std::string> {};
INSTANTIATE_TEST_SUITE_P(Impl, Networked, ::testing::Values("shm", "tcp"), [](const auto &i) { return i.param; });

namespace {
std::string replace_key(std::string config, const std::string &key, const std::string &value) {
  auto at = config.find(key + ",");
  auto end = config.find(';', at);
  return config.substr(0, at) + key + "," + value + (end == std::string::npos ? "" : config.substr(end));
}
}  // namespace

TEST_P(Networked, WrongSecretIsRefused) {
  auto rig = make_rig(GetParam(), 4096);
  auto a = make_action("client-1");
  std::string durl = "m;" + GetParam() + ";" + replace_key(rig.config, "secret", std::string(64, 'f'));
  ASSERT_EQ(0, libd_action_add_transport(a.get(), durl.c_str()));
  auto *t = libd_action_get_transport(a.get(), "m");
  EXPECT_EQ(-EACCES, libd_transport_connect(t));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("refused the grant")) << libd_last_error();
  EXPECT_EQ(std::string::npos, std::string(libd_last_error()).find(rig.grant.secret)) << "secrets never in messages";
  EXPECT_EQ(LIBD_STATE_ERROR, libd_transport_state(t));
}

TEST_P(Networked, AnotherClientsGrantIsRefused) {
  auto rig = make_rig(GetParam(), 4096);
  auto thief = make_action("client-2");  // same config, different action id
  std::string durl = "m;" + GetParam() + ";" + rig.config;
  ASSERT_EQ(0, libd_action_add_transport(thief.get(), durl.c_str()));
  EXPECT_EQ(-EACCES, libd_transport_connect(libd_action_get_transport(thief.get(), "m")));
  EXPECT_EQ(0, libd_transport_connect(rig.t)) << libd_last_error();
}

TEST_P(Networked, RevokeCutsTheClientOffAtOnce) {
  auto rig = make_rig(GetParam(), 4096, 3, "timeout_ms,2000");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 64, reinterpret_cast<void **>(&buf)));
  ASSERT_EQ(0, libd_trdma_write(rig.t, 8, 0, buf));
  ASSERT_EQ(0, rig.server->revoke(rig.grant.id));
  ASSERT_EQ(LIBD_STATE_ERROR, libd_transport_wait_state(rig.t, LIBD_STATE_ERROR, 2000)) << "client not told";
  EXPECT_EQ(-ECONNRESET, libd_trdma_read(rig.t, 8, 0, buf));
  EXPECT_EQ(-EACCES, libd_transport_recover(rig.t)) << "a revoked grant cannot reconnect";
  EXPECT_EQ(-ENOENT, rig.server->revoke(rig.grant.id));
}

TEST_P(Networked, RangeGrantCoversOnlyItsRange) {
  auto rig = make_rig(GetParam(), 1 << 16);
  libd::Grant g;
  g.element = "e1";
  g.client = "ranger";
  g.offset = 4096;
  g.length = 8192;
  g.rights = 3;
  ASSERT_EQ(0, rig.server->grant(&g));
  auto a = make_action("ranger");
  std::string durl = "m;" + GetParam() + ";" + rig.server->client_config(g);
  ASSERT_EQ(0, libd_action_add_transport(a.get(), durl.c_str()));
  auto *t = libd_action_get_transport(a.get(), "m");
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 16384, reinterpret_cast<void **>(&buf)));
  if (GetParam() == "shm") {
    // shm would hand over the whole element's memfd: a part of it is refused, by name.
    EXPECT_EQ(-EPERM, libd_transport_connect(t));
    EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("reach it over tcp")) << libd_last_error();
    return;
  }
  EXPECT_EQ(-ERANGE, libd_trdma_read(t, 8, 0, buf));
  EXPECT_EQ(-ERANGE, libd_trdma_read(t, 8, 4096 + 8192 - 4, buf));
  EXPECT_EQ(0, libd_trdma_write(t, 8192, 4096, buf)) << libd_last_error();
  uint64_t end;
  ASSERT_EQ(0, libd_trdma_remote(t, &end, nullptr));
  EXPECT_EQ(4096u + 8192u, end);
  libd::Grant bad = g;
  bad.id.clear();
  bad.offset = 1 << 16;
  bad.length = 1;
  EXPECT_EQ(-ERANGE, rig.server->grant(&bad));
}

TEST(Shm, ReadOnlyGrantIsMappedReadOnly) {
  auto rig = make_rig("shm", 1 << 16, LIBD_RIGHT_READ);
  void *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(rig.t, 64, &buf));
  ASSERT_EQ(0, libd_trdma_read(rig.t, 8, 0, buf));
  // The kernel, not libd, enforces it: the mapping of the element's memfd has no write bit.
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int found = 0;
  while (std::getline(maps, line)) {
    if (line.find("memfd:scad-e1") == std::string::npos) continue;
    std::string perms = line.substr(line.find(' ') + 1, 4);
    if (perms[3] == 's' && perms[0] == 'r') {  // the client's shared mapping (the server's is rw)
      if (perms[1] == '-') found++;
    }
  }
  EXPECT_EQ(1, found) << "expected exactly one read-only shared mapping of the element";
  // Reopening the element writable through /proc/self/fd is left to the server's own uid.
  int modes = 0;
  for (int fd = 0; fd < 1024; fd++) {
    char link[256];
    std::string path = "/proc/self/fd/" + std::to_string(fd);
    ssize_t n = readlink(path.c_str(), link, sizeof link - 1);
    if (n <= 0 || std::string(link, size_t(n)).find("memfd:scad-e1") == std::string::npos) continue;
    struct stat st;
    ASSERT_EQ(0, fstat(fd, &st));
    EXPECT_EQ(0600u, st.st_mode & 07777);
    modes++;
  }
  EXPECT_GE(modes, 1);
}

// ---- the server, at the protocol level -----------------------------------------------------

namespace {

struct RawClient {
  int fd = -1;
  ~RawClient() { if (fd >= 0) close(fd); }
  bool connect_to(uint16_t port) {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return ::connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) == 0;
  }
  bool recv_exact(char *p, size_t n, int timeout_ms = 5000) {
    size_t got = 0;
    while (got < n) {
      pollfd pf{fd, POLLIN, 0};
      if (poll(&pf, 1, timeout_ms) <= 0) return false;
      ssize_t r = recv(fd, p + got, n - got, 0);
      if (r <= 0) return false;
      got += size_t(r);
    }
    return true;
  }
  bool read_frame(Header *h, std::string *payload) {
    char hdr[kHeaderSize];
    if (!recv_exact(hdr, kHeaderSize)) return false;
    std::string why;
    if (decode_header(hdr, h, &why)) return false;
    payload->assign(size_t(payload_length(*h)), '\0');
    return payload->empty() || recv_exact(payload->data(), payload->size());
  }
  void send_frame(const Header &h, const std::string &body = {}) {
    char hdr[kHeaderSize];
    encode_header(h, hdr);
    std::string all(hdr, kHeaderSize);
    all += body;
    ASSERT_EQ(ssize_t(all.size()), send(fd, all.data(), all.size(), MSG_NOSIGNAL));
  }
  // Full handshake with a grant.
  bool authenticate(const libd::Grant &g, const std::string &client) {
    Header h;
    std::string nonce;
    if (!read_frame(&h, &nonce) || h.opcode != kChallenge) return false;
    Header a;
    a.opcode = kAuth;
    std::string body = encode_auth({g.id, client, compute_mac(g.secret, nonce, g.id, client)});
    a.size = body.size();
    send_frame(a, body);
    std::string grant;
    return read_frame(&h, &grant) && h.opcode == kAuthOk && h.status == 0;
  }
  bool closed_by_peer() {
    char c;
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, 5000) <= 0) return false;
    return recv(fd, &c, 1, 0) <= 0;
  }
};

struct TcpServerRig {
  libd::MemoryServer server;
  libd::Grant grant;
  uint16_t port = 0;
  TcpServerRig() {
    EXPECT_EQ(0, server.add_element("e1", 1 << 20));
    EXPECT_EQ(0, server.listen_tcp("127.0.0.1", 0, &port));
    grant.element = "e1";
    grant.client = "raw";
    grant.rights = 3;
    EXPECT_EQ(0, server.grant(&grant));
  }
};

}  // namespace

TEST(Server, ChecksEveryRangeItselfAndKeepsTheConnection) {
  TcpServerRig rig;
  RawClient c;
  ASSERT_TRUE(c.connect_to(rig.port));
  ASSERT_TRUE(c.authenticate(rig.grant, "raw"));
  Header r;
  r.opcode = kRead;
  r.req_id = 1;
  r.addr = (1 << 20) - 4;
  r.size = 8;  // past the element: the server must refuse even if a client does not check
  c.send_frame(r);
  Header resp;
  std::string payload;
  ASSERT_TRUE(c.read_frame(&resp, &payload));
  EXPECT_EQ(kReadResp, resp.opcode);
  EXPECT_EQ(-ERANGE, resp.status);
  EXPECT_EQ(1u, resp.req_id);
  EXPECT_TRUE(payload.empty());
  // An out-of-range WRITE is drained, refused, and the stream stays in sync.
  Header w;
  w.opcode = kWrite;
  w.req_id = 2;
  w.addr = 1 << 20;
  w.size = 100;
  c.send_frame(w, std::string(100, 'x'));
  ASSERT_TRUE(c.read_frame(&resp, &payload));
  EXPECT_EQ(-ERANGE, resp.status);
  EXPECT_EQ(2u, resp.req_id);
  w.req_id = 3;
  w.addr = 0;
  c.send_frame(w, std::string(100, 'y'));
  ASSERT_TRUE(c.read_frame(&resp, &payload));
  EXPECT_EQ(0, resp.status);
  r.req_id = 4;
  r.addr = 0;
  r.size = 100;
  c.send_frame(r);
  ASSERT_TRUE(c.read_frame(&resp, &payload));
  EXPECT_EQ(std::string(100, 'y'), payload);
}

TEST(Server, RefusesUnauthenticatedAndGarbageClientsWithoutHarmingOthers) {
  TcpServerRig rig;
  RawClient good;
  ASSERT_TRUE(good.connect_to(rig.port));
  ASSERT_TRUE(good.authenticate(rig.grant, "raw"));

  RawClient sneaky;  // skips AUTH
  ASSERT_TRUE(sneaky.connect_to(rig.port));
  Header h;
  std::string nonce;
  ASSERT_TRUE(sneaky.read_frame(&h, &nonce));
  Header r;
  r.opcode = kRead;
  r.size = 8;
  sneaky.send_frame(r);
  EXPECT_TRUE(sneaky.closed_by_peer());

  RawClient garbage;
  ASSERT_TRUE(garbage.connect_to(rig.port));
  ASSERT_TRUE(garbage.read_frame(&h, &nonce));
  std::string junk(64, '\x7f');
  send(garbage.fd, junk.data(), junk.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(garbage.closed_by_peer());

  RawClient truncated;  // half a header, then gone
  ASSERT_TRUE(truncated.connect_to(rig.port));
  send(truncated.fd, "DS\x01", 3, MSG_NOSIGNAL);
  close(truncated.fd);
  truncated.fd = -1;

  Header p;
  p.opcode = kPing;
  p.req_id = 9;
  good.send_frame(p);
  std::string none;
  ASSERT_TRUE(good.read_frame(&h, &none));
  EXPECT_EQ(kPong, h.opcode);
  EXPECT_EQ(9u, h.req_id);
}

TEST(Server, ASlowReaderDoesNotBlockOthers) {
  TcpServerRig rig;
  libd::Grant g2 = rig.grant;
  g2.id.clear();
  g2.secret.clear();
  g2.client = "client-1";
  ASSERT_EQ(0, rig.server.grant(&g2));
  RawClient slow;
  ASSERT_TRUE(slow.connect_to(rig.port));
  ASSERT_TRUE(slow.authenticate(rig.grant, "raw"));
  int small = 4096;
  setsockopt(slow.fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  // Ask for 256 MiB of reads and never read the answers.
  for (int i = 0; i < 256; i++) {
    Header r;
    r.opcode = kRead;
    r.req_id = uint64_t(i);
    r.size = 1 << 20;
    slow.send_frame(r);
  }
  auto a = make_action("client-1");
  std::string durl = "m;tcp;timeout_ms,3000;" + rig.server.client_config(g2);
  ASSERT_EQ(0, libd_action_add_transport(a.get(), durl.c_str()));
  auto *t = libd_action_get_transport(a.get(), "m");
  void *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 1 << 20, &buf));
  for (int i = 0; i < 50; i++) ASSERT_EQ(0, libd_trdma_read(t, 1 << 20, 0, buf)) << libd_last_error();
}

// Scad's model: a memory element is an action whose rdma_server transport serves it.
TEST(ServerTransport, ServesPublishesItsAddressGrantsAndStops) {
  std::string sock = test::unique_socket_path("srv");
  auto server = make_action("memory-element");
  std::string durl = "mem;tcp_server;size,1MiB;path," + sock;
  ASSERT_EQ(0, libd_action_add_transport(server.get(), durl.c_str())) << libd_last_error();
  auto *s = libd_action_get_transport(server.get(), "mem");
  EXPECT_EQ(LIBD_KIND_RDMA_SERVER, libd_transport_kind(s));
  char msg[512];
  EXPECT_EQ(-ENODATA, libd_transport_get_message(s, msg, sizeof msg, nullptr));
  char config[512];
  EXPECT_EQ(-ENOTCONN, libd_trdma_server_grant(s, "c", 0, 0, 3, config, sizeof config));
  void *nope = nullptr;
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_reg(s, 64, &nope));

  ASSERT_EQ(0, libd_trdma_server_serve(s)) << libd_last_error();
  EXPECT_EQ(LIBD_STATE_READY, libd_transport_state(s));
  size_t needed = 0;
  EXPECT_EQ(-ERANGE, libd_transport_get_message(s, msg, 4, &needed));
  ASSERT_GT(libd_transport_get_message(s, msg, sizeof msg, &needed), 0);
  EXPECT_NE(std::string::npos, std::string(msg).find("port,")) << msg;
  EXPECT_NE(std::string::npos, std::string(msg).find("path," + sock)) << msg;

  int len = libd_trdma_server_grant(s, "reader", 0, 0, LIBD_RIGHT_READ | LIBD_RIGHT_WRITE, config, sizeof config);
  ASSERT_GT(len, 0) << libd_last_error();
  std::string grant_id = std::string(config).substr(std::string(config).find("grant,") + 6);
  grant_id = grant_id.substr(0, grant_id.find(';'));

  std::atomic<int> run_rc{1};
  std::thread runner([&] { run_rc = libd_trdma_server_run(s); });  // Scad's blocking serve

  for (const char *impl : {"tcp", "shm"}) {
    auto client = make_action("reader");
    std::string cdurl = std::string("m;") + impl + ";" + config;
    ASSERT_EQ(0, libd_action_add_transport(client.get(), cdurl.c_str()));
    auto *t = libd_action_get_transport(client.get(), "m");
    char *buf = nullptr;
    ASSERT_EQ(0, libd_trdma_reg(t, 4096, reinterpret_cast<void **>(&buf)));
    memcpy(buf, impl, 3);
    ASSERT_EQ(0, libd_trdma_write(t, 3, 1000, buf)) << libd_last_error();
    ASSERT_EQ(0, libd_trdma_read(t, 3, 1000, buf + 100));
    EXPECT_EQ(0, memcmp(buf + 100, impl, 3));
  }
  auto client = make_action("reader");
  std::string cdurl = std::string("m;tcp;") + config;
  ASSERT_EQ(0, libd_action_add_transport(client.get(), cdurl.c_str()));
  auto *t = libd_action_get_transport(client.get(), "m");
  ASSERT_EQ(0, libd_transport_connect(t));
  ASSERT_EQ(0, libd_trdma_server_revoke(s, grant_id.c_str()));
  EXPECT_EQ(LIBD_STATE_ERROR, libd_transport_wait_state(t, LIBD_STATE_ERROR, 2000));
  EXPECT_EQ(-ENOENT, libd_trdma_server_revoke(s, "g-unknown"));

  ASSERT_EQ(0, libd_trdma_server_stop(s));
  runner.join();
  EXPECT_EQ(0, run_rc.load());
  EXPECT_EQ(LIBD_STATE_TERMINATED, libd_transport_state(s));
  struct stat st;
  EXPECT_NE(0, stat(sock.c_str(), &st)) << "the socket file is removed on stop";
  // The runner above may have started after stop (it once returned -ESHUTDOWN then): a run that
  // begins on a stopped server returns at once, as one that was stopped while it ran.
  EXPECT_EQ(0, libd_trdma_server_run(s));
}

namespace {
// A client of server transport `s` on the tcp transport under a read-write grant for `aid`, with
// 4096 bytes of local memory (*buf).
test::ActionPtr granted_tcp_client(libd_transport *s, const char *aid, libd_transport **t, char **buf) {
  char config[512];
  EXPECT_GT(libd_trdma_server_grant(s, aid, 0, 0, LIBD_RIGHT_READ | LIBD_RIGHT_WRITE, config, sizeof config), 0);
  auto client = make_action(aid);
  EXPECT_EQ(0, libd_action_add_transport(client.get(), (std::string("m;tcp;") + config).c_str()));
  *t = libd_action_get_transport(client.get(), "m");
  EXPECT_EQ(0, libd_trdma_reg(*t, 4096, reinterpret_cast<void **>(buf)));
  return client;
}

std::set<long> threads_of_this_process() {
  std::set<long> out;
  if (DIR *d = opendir("/proc/self/task")) {
    while (dirent *e = readdir(d))
      if (e->d_name[0] != '.') out.insert(std::stol(e->d_name));
    closedir(d);
  }
  return out;
}

// Starts server transport `s` serving: the thread it started (its loop's), or -1.
long serve_on_a_new_thread(libd_transport *s) {
  auto before = threads_of_this_process();
  EXPECT_EQ(0, libd_trdma_server_serve(s)) << libd_last_error();
  std::vector<long> started;
  for (long tid : threads_of_this_process())
    if (!before.count(tid)) started.push_back(tid);
  EXPECT_EQ(1u, started.size()) << "the server was to start one thread, its loop's";
  return started.size() == 1 ? started[0] : -1;
}
}  // namespace

// busy_poll_us: after a request the server's thread keeps polling (a core busy) for that long,
// serves what comes meanwhile, then sleeps; stop() ends it even while it polls.
TEST(ServerTransport, BusyPollingKeepsTheThreadAwakeAfterARequestAndStops) {
  auto bad = make_action("memory-element");
  EXPECT_EQ(-EINVAL, libd_action_add_transport(bad.get(), "mem;tcp_server;size,4096;busy_poll_us,2000000"));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("busy_poll_us")) << libd_last_error();

  auto server = make_action("memory-element");
  ASSERT_EQ(0, libd_action_add_transport(server.get(), "mem;tcp_server;size,4096;busy_poll_us,400000"));
  auto *s = libd_action_get_transport(server.get(), "mem");
  long loop = serve_on_a_new_thread(s);
  ASSERT_GT(loop, 0);
  libd_transport *t = nullptr;
  char *buf = nullptr;
  auto client = granted_tcp_client(s, "reader", &t, &buf);
  ASSERT_FALSE(::testing::Test::HasFailure());
  for (int i = 0; i < 100; i++) {
    buf[0] = char(i);
    ASSERT_EQ(0, libd_trdma_write(t, 1, 7, buf)) << libd_last_error();
    ASSERT_EQ(0, libd_trdma_read(t, 1, 7, buf + 1)) << libd_last_error();
    ASSERT_EQ(char(i), buf[1]);
  }
  // Within its window after the last answer the server's thread polls: it serves a request
  // 100 ms later, and waits 50 ms more, without a sleep (a voluntary context switch: one that
  // slept would sleep again after that request), however little of a core it gets on a loaded
  // host.
  long before = test::sleeps_of(loop);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(0, libd_trdma_read(t, 1, 7, buf + 1)) << libd_last_error();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  long after = test::sleeps_of(loop);
  ASSERT_GE(before, 0);
  EXPECT_EQ(before, after) << "the server's thread slept within its polling window";
  ASSERT_EQ(0, libd_trdma_server_stop(s));  // while it polls
  EXPECT_EQ(LIBD_STATE_TERMINATED, libd_transport_state(s));
}


// The polling window runs from the last request served, not from the wake-up: requests that come
// a fifth of the window apart keep the server's thread awake however long they go on (a large
// write arriving chunk by chunk is such a run). A window counted from the wake-up put the thread
// to sleep every 100 ms here, four times or more, and each next request paid a wake-up.
TEST(ServerTransport, BusyPollingLastsFromTheLastRequestNotTheWakeUp) {
  auto server = make_action("memory-element");
  ASSERT_EQ(0, libd_action_add_transport(server.get(), "mem;tcp_server;size,4096;busy_poll_us,100000"));
  auto *s = libd_action_get_transport(server.get(), "mem");
  long loop = serve_on_a_new_thread(s);
  ASSERT_GT(loop, 0);
  libd_transport *t = nullptr;
  char *buf = nullptr;
  auto client = granted_tcp_client(s, "writer", &t, &buf);
  ASSERT_FALSE(::testing::Test::HasFailure());
  ASSERT_EQ(0, libd_trdma_write(t, 1, 0, buf)) << libd_last_error();  // connected, the thread awake
  long first = test::sleeps_of(loop);
  for (int i = 0; i < 25; i++) {  // 500 ms, five windows counted from the first request
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(0, libd_trdma_write(t, 1, 0, buf)) << libd_last_error();
  }
  long last = test::sleeps_of(loop);
  ASSERT_GE(first, 0);
  ASSERT_GE(last, 0);
  EXPECT_LE(last - first, 1) << "the server's thread slept between requests 20 ms apart with a 100 ms window";
  ASSERT_EQ(0, libd_trdma_server_stop(s));
}
