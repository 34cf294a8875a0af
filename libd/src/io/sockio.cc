#include "io/sockio.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace libd {

int wait_fd(int fd, short events, const Deadline &deadline) {
  for (;;) {
    struct pollfd p = {fd, events, 0};
    int r = poll(&p, 1, int(deadline.remaining_ms()));
    if (r > 0) return 0;
    if (r == 0) return -ETIMEDOUT;
    if (errno != EINTR) return -errno;
  }
}

int recv_exact(int fd, char *buf, size_t n, const Deadline &deadline, int *passed_fd) {
  size_t got = 0;
  while (got < n) {
    struct iovec iov = {buf + got, n - got};
    struct msghdr msg = {};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(struct cmsghdr) char cbuf[CMSG_SPACE(sizeof(int))];
    if (passed_fd) {
      msg.msg_control = cbuf;
      msg.msg_controllen = sizeof cbuf;
    }
    ssize_t r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (r == 0) return -ECONNRESET;
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return -errno;
      if (int rc = wait_fd(fd, POLLIN, deadline)) return rc;
      continue;
    }
    if (passed_fd) {
      for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(passed_fd, CMSG_DATA(c), sizeof(int));
    }
    got += size_t(r);
  }
  return 0;
}

int send_all(int fd, const char *data, size_t n, const Deadline &deadline) {
  size_t sent = 0;
  while (sent < n) {
    ssize_t r = send(fd, data + sent, n - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) return -errno;
      if (int rc = wait_fd(fd, POLLOUT, deadline)) return rc;
      continue;
    }
    sent += size_t(r);
  }
  return 0;
}

int connect_before(int fd, const sockaddr *addr, socklen_t len, const Deadline &deadline) {
  if (::connect(fd, addr, len) == 0) return 0;
  if (errno != EINPROGRESS) return -errno;
  if (int rc = wait_fd(fd, POLLOUT, deadline)) return rc;
  int err = 0;
  socklen_t elen = sizeof err;
  getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
  return err ? -err : 0;
}

}  // namespace libd
