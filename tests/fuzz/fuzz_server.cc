// libFuzzer target: the memory server's connection handler (MemoryServer::Conn) as a peer that
// passed the handshake reaches it. Each input is one authenticated tcp connection to a server in
// this process: byte 0 picks a plain connection or a shared one (session), and whether a valid
// ATTACH of a second grant (handle 1) goes first; the rest is sent as it is, then the write side
// is shut and everything the server answers is read until it closes. Afterwards the server must
// still admit a new connection and answer its PING: a bad peer ends its own connection only.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "io/sockio.h"
#include "proto/client_handshake.h"
#include "proto/frame.h"
#include "server/memory_server.h"

using namespace libd;
using namespace libd::proto;

namespace {

struct Server {
  MemoryServer server;
  std::vector<char> lent = std::vector<char>(1 << 16);
  Grant first, second;
  sockaddr_in addr{};

  Server() {
    signal(SIGPIPE, SIG_IGN);
    if (server.add_lent_element("lent", lent.data(), lent.size()) != 0) abort();
    uint16_t port = 0;
    if (server.listen_tcp("127.0.0.1", 0, &port) != 0) abort();
    for (Grant *g : {&first, &second}) {
      g->element = "lent";
      g->client = "*";
      g->rights = 3;
      if (server.grant(g) != 0) abort();
    }
    addr.sin_family = AF_INET;
    addr.sin_port = htons(port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }

  int open(bool session, std::string *nonce) {
    int fd = -1;
    GrantBody body;
    if (connect_authenticated(reinterpret_cast<sockaddr *>(&addr), sizeof addr, {first.id, first.secret, "fuzz"},
                              Deadline::after_ms(5000), &fd, &body, session ? kAuthSession : 0, nonce) != 0)
      abort();  // the server stopped admitting peers
    return fd;
  }
};

// Reads until the peer closes (true) or nothing comes for the deadline (false).
bool drain(int fd, int ms) {
  char buf[65536];
  for (;;) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, ms) != 1) return false;
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && errno != EAGAIN && errno != EINTR) return true;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static Server *s = new Server();
  if (size == 0) return 0;
  bool session = data[0] & 1, attach = data[0] & 2;
  std::string nonce;
  int fd = s->open(session, &nonce);
  std::string bytes;
  if (session && attach) bytes = encode_attach(1, {s->second.id, s->second.secret, "fuzz"}, nonce);
  bytes.append(reinterpret_cast<const char *>(data + 1), size - 1);
  send_all(fd, bytes.data(), bytes.size(), Deadline::after_ms(5000));  // the server may close first
  shutdown(fd, SHUT_WR);
  if (!drain(fd, 10000)) abort();  // a connection the server neither answers nor closes
  ::close(fd);
  // The server goes on for everyone else.
  int probe = s->open(true, &nonce);
  Header h;
  h.opcode = kPing;
  h.req_id = 77;
  char hdr[kHeaderSize];
  encode_header(h, hdr);
  if (send_all(probe, hdr, kHeaderSize, Deadline::after_ms(5000)) != 0) abort();
  char got[kHeaderSize];
  std::string why;
  if (recv_exact(probe, got, kHeaderSize, Deadline::after_ms(5000)) != 0 || decode_header(got, &h, &why) != 0 ||
      h.opcode != kPong || h.req_id != 77)
    abort();
  ::close(probe);
  return 0;
}
