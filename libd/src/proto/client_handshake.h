// The client half of the authenticated handshake on a memory element's tcp listener, shared by
// the tcp transport (which then moves data on the same socket) and the verbs transport (which
// then exchanges queue-pair records on it and keeps it as its control and liveness channel).
#pragma once
#include <sys/socket.h>

#include <string>

#include "core/clock.h"
#include "proto/auth.h"

namespace libd::proto {

struct Credentials {
  std::string grant_id;
  std::string secret;
  std::string client_id;
};

// host:port to an address; -EHOSTUNREACH with the resolver's reason.
int resolve(const std::string &host, const std::string &port, sockaddr_storage *out, socklen_t *len);

// Why a memory element answered AUTH with this (negative) status, in words for the user.
std::string refusal_reason(int status);

// Connects (non-blocking socket, TCP_NODELAY, keep-alive), answers the CHALLENGE and reads
// AUTH_OK, all before the deadline. 0 with *fd and *grant set, or a negative errno with
// libd_last_error saying what the memory element answered. auth_flags go in AUTH's addr
// (kAuthSession: a shared connection); *nonce, if asked for, is the server's challenge (a session
// signs its later ATTACHes over it).
int connect_authenticated(const sockaddr *addr, socklen_t len, const Credentials &creds, const Deadline &deadline,
                          int *fd, GrantBody *grant, uint64_t auth_flags = 0, std::string *nonce = nullptr);

// The ATTACH frame (header and body) for one more grant on a session. quiet: the server answers
// only a refusal (the peer needs nothing from a grant it checked itself, in the owner's table).
std::string encode_attach(uint32_t handle, const Credentials &creds, const std::string &nonce, bool quiet = false);

}  // namespace libd::proto
