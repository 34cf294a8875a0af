// A memory server's unix-socket connection (server_conn.h has what every kind shares): the peer,
// on this host, moves the bytes itself. AUTH_OK hands it the element's memfd with SCM_RIGHTS
// (read-only for a read-only grant), or, for memory the owner lent from its own heap, the owner's
// process and address for cross-memory attach (and, on a session, where the grant table is). No
// READ or WRITE is served here; the socket stays open as the liveness channel and carries the
// holder's word (NOTIFY) and the owner's cuts (DETACHED).
#pragma once
#include <string>

#include "server/server_conn.h"

namespace libd {

class UnixServerConn : public ServerConn {
 public:
  explicit UnixServerConn(MemoryServer *srv) : ServerConn(srv, true) {}

 protected:
  void describe(uint32_t handle, const Attachment &a, proto::GrantBody *body) override;
  void send_auth_ok(const proto::Header &r, const std::string &payload) override;
  void send_frame(const proto::Header &h, const std::string &body) override { send_raw(h, body, -1); }

 private:
  // Control frames are sent with plain send(): they are small, and the memfd must ride along
  // with SCM_RIGHTS, which libuv streams cannot carry.
  void send_raw(const proto::Header &h, const std::string &body, int fd_to_pass);
  // The AUTH grant's memfd; a read-only grant gets a read-only file description.
  void send_fd(const proto::Header &h, const std::string &body);
};

}  // namespace libd
