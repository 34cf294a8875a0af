// Socket I/O bounded by a deadline, for the handshakes run in the calling thread (tcp and shm)
// and for the tcp client's direct path.
#pragma once
#include <sys/socket.h>

#include <string>

#include "core/clock.h"

namespace libd {

// Waits until fd is ready for `events` (POLLIN/POLLOUT); 0, -ETIMEDOUT or -errno.
int wait_fd(int fd, short events, const Deadline &deadline);
// Receives exactly n bytes; with passed_fd, also takes a descriptor sent with SCM_RIGHTS.
int recv_exact(int fd, char *buf, size_t n, const Deadline &deadline, int *passed_fd = nullptr);
int send_all(int fd, const char *data, size_t n, const Deadline &deadline);
// A non-blocking connect completed before the deadline (the socket must be non-blocking).
int connect_before(int fd, const sockaddr *addr, socklen_t len, const Deadline &deadline);

}  // namespace libd
