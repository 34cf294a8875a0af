#include "server/unix_server_conn.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "libd.h"

namespace libd {

using namespace proto;

void UnixServerConn::describe(uint32_t handle, const Attachment &a, GrantBody *body) {
  if (!a.element->lent) return;
  // Lent memory has no memfd: the peer attaches to this process (cross-memory attach).
  body->cma_pid = uint32_t(getpid());
  body->cma_base = uint64_t(uintptr_t(a.element->base));
  if (!a.element->ranges.empty()) {  // several ranges: where their table is
    body->cma_base = uint64_t(uintptr_t(a.element->ranges.data()));
    body->cma_ranges = uint32_t(a.element->ranges.size());
  }
  if (session_ && handle == 0) srv_->cma_describe(body);  // where the grant table is
}

void UnixServerConn::send_auth_ok(const Header &r, const std::string &payload) {
  if (atts_[0].element->lent) {
    send_raw(r, payload, -1);
  } else {
    send_fd(r, payload);
  }
}

void UnixServerConn::send_raw(const Header &h, const std::string &body, int fd_to_pass) {
  if (closing_) return;
  char buf[kHeaderSize + kMaxControlPayload];
  encode_header(h, buf);
  std::memcpy(buf + kHeaderSize, body.data(), body.size());
  struct iovec iov = {buf, kHeaderSize + body.size()};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
  if (fd_to_pass >= 0) {
    msg.msg_control = cbuf;
    msg.msg_controllen = sizeof cbuf;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd_to_pass, sizeof(int));
  }
  uv_os_fd_t fd;
  uv_fileno(&h_.handle, &fd);
  ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
  if (n != ssize_t(iov.iov_len)) close();
}

void UnixServerConn::send_fd(const Header &h, const std::string &body) {
  // A read-only grant gets a read-only file description: mmap(PROT_WRITE, MAP_SHARED) on it
  // fails in the client's kernel, whatever the client's code does.
  Attachment &a = atts_[0];
  int fd = a.element->memfd;
  int ro = -1;
  if (!(a.grant.rights & LIBD_RIGHT_WRITE)) {
    std::string path = "/proc/self/fd/" + std::to_string(a.element->memfd);
    ro = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ro < 0) { close(); return; }
    fd = ro;
  }
  send_raw(h, body, fd);
  if (ro >= 0) ::close(ro);
}

}  // namespace libd
