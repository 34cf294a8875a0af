// The verbs handshake a memory server's tcp connection carries (tcp_server_conn.h): a client with
// an RDMA device asks for a queue pair on the grant it authenticated with, either by sending its
// queue-pair record (VERBS_CONNECT, answered with the server's: ibv/record.h) or by asking for a
// one-shot ticket (VERBS_CM_REQUEST) that it then presents to the rdma_cm listener (ibv/cm.h). A
// connection gets one queue pair, a session none (a queue pair serves one grant). The queue pair
// and its remote key die with the connection.
#pragma once
#include <rdma/rdma_cma.h>

#include <memory>
#include <string>

#include "proto/frame.h"

namespace libd {

class MemoryServer;
class TcpServerConn;
class VerbsEndpoint;
struct Attachment;

class VerbsHandshake {
 public:
  explicit VerbsHandshake(MemoryServer *srv);
  ~VerbsHandshake();
  // VERBS_CONNECT or VERBS_CM_REQUEST arriving: 0 (a body goes to *ctl, *dest points into it),
  // or -EPROTO if the connection asked already or has its queue pair.
  int on_header(const proto::Header &h, std::string *ctl, char **dest);
  // The answer to the request whose body is `ctl`, for the connection's grant `a`: its opcode,
  // status and body in *answer and *body.
  void on_frame(TcpServerConn *conn, const proto::Header &h, const std::string &ctl, const Attachment &a,
                proto::Header *answer, std::string *body);
  // The rdma_cm request that presented the connection's ticket; a is null when the connection is
  // closing or has no grant (the request is rejected).
  void on_cm_connect(rdma_cm_id *id, const Attachment *a);
  // The connection closes: its queue pair goes, an unspent ticket is withdrawn.
  void close();

 private:
  MemoryServer *srv_;
  std::string cm_ticket_;  // handed out, not yet presented
  std::unique_ptr<VerbsEndpoint> ep_;  // this client's queue pair and remote key
  bool got_verbs_ = false, got_cm_request_ = false;
};

}  // namespace libd
