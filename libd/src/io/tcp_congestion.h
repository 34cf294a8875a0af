// The congestion control of libd's tcp connections whose two ends are on one host.
//
// Such a connection crosses no network: the kernel hands its segments from one socket to the other
// over the loopback device. BBR (some hosts' default) still models and paces them, and bulk
// transfers pay for it in the sender's system calls (docs/transports.md, "Congestion control
// between two ends on one host", has the figures). So libd gives a socket whose algorithm is BBR
// cubic (reno where cubic is not allowed) before it connects or listens, and puts the original
// back on a connection that turns out to join two hosts; BBR thus never runs on a same-host
// connection. LIBD_TCP_CONGESTION changes the policy: `keep` leaves every socket alone, an
// algorithm's name is given to every same-host connection instead of cubic, `auto` (or unset) is
// the above.
#pragma once
#include <sys/socket.h>

#include <string>

namespace libd {

// Whether a connection from `local` to `peer` stays on this host: the peer is a loopback address,
// or the socket's own address (the host reaching itself, which the kernel routes over loopback).
bool same_host(const sockaddr_storage &local, const sockaddr_storage &peer);

// For a tcp socket not yet connected or listening: applies the policy above. Returns the algorithm
// the socket had if it changed it ("" if not), for restore_between_hosts. Never fails: a socket it
// cannot change keeps what it had.
std::string prefer_unpaced(int fd);
// The same under a given policy ("" for auto, "keep", or an algorithm's name).
std::string prefer_unpaced(int fd, const std::string &policy);

// For a connected socket (a client's, or one accepted from a listener prefer_unpaced changed):
// a connection between two hosts gets `original` back; a same-host one keeps what it has.
void restore_between_hosts(int fd, const std::string &original);

// The socket's congestion control ("" if it cannot be read).
std::string congestion_of(int fd);

}  // namespace libd
