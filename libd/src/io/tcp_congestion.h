// The congestion control of libd's tcp connections whose two ends are on one host.
//
// Such a connection crosses no network: the kernel hands its segments from one socket to the other
// over the loopback device. A pacing algorithm (BBR, some hosts' default) still paces and models
// them, at a cost in the sender's system calls that bulk transfers feel: with BBR a 1 MiB write
// between two processes took 130-175 µs here, with cubic 105-115, and 64 KiB writes 16 at a
// time moved at 2 GB/s in some connections instead of 4-6. So on such a connection libd replaces
// a pacing algorithm with cubic (reno where cubic is not allowed). Connections between hosts keep
// the host's choice.
#pragma once
#include <sys/socket.h>

#include <string>

namespace libd {

// Whether a connection from `local` to `peer` stays on this host: the peer is a loopback address,
// or the host's own address (which the kernel also routes over the loopback device).
bool same_host(const sockaddr_storage &local, const sockaddr_storage &peer);

// For a connected tcp socket: on a same-host connection, a pacing congestion control is replaced
// as above. Returns the algorithm the socket uses afterwards ("" if it cannot be read). Never
// fails: a socket it cannot change keeps what it had.
std::string settle_local_congestion(int fd);

}  // namespace libd
