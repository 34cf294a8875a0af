#include "server/verbs_handshake.h"

#include "core/error.h"
#include "ibv/cm.h"
#include "ibv/record.h"
#include "server/cm_listener.h"
#include "server/server_conn.h"
#include "server/verbs_server.h"

namespace libd {

using namespace proto;

namespace {
constexpr const char *kNoVerbs = "this memory server does not serve RDMA verbs (no device on its host, or verbs not enabled)";

// A control answer: the body when status is 0, else why (cut to what a control frame holds).
void answer(const Header &h, Opcode opcode, int status, const std::string &text, Header *r, std::string *body) {
  r->opcode = opcode;
  r->req_id = h.req_id;
  r->status = status;
  *body = status == 0 ? text : text.substr(0, kMaxControlPayload);
  r->size = body->size();
}
}  // namespace

VerbsHandshake::VerbsHandshake(MemoryServer *srv) : srv_(srv) {}
VerbsHandshake::~VerbsHandshake() = default;

int VerbsHandshake::on_header(const Header &h, std::string *ctl, char **dest) {
  if (ep_ || got_verbs_) return -EPROTO;
  if (h.opcode == kVerbsConnect) {
    got_verbs_ = true;
    if (!cm_ticket_.empty()) srv_->cm_tickets_.erase(cm_ticket_);  // the client gave up on rdma_cm
    ctl->assign(size_t(h.size), '\0');
    *dest = ctl->data();
    return 0;
  }
  if (got_cm_request_ || h.size != 0) return -EPROTO;  // VERBS_CM_REQUEST: once, no body
  got_cm_request_ = true;
  return 0;
}

void VerbsHandshake::on_frame(TcpServerConn *conn, const Header &h, const std::string &ctl, const Attachment &a,
                              Header *r, std::string *body) {
  if (!a.element->ranges.empty())  // before any queue pair or ticket: a remote key reaches one range
    return answer(h, h.opcode == kVerbsConnect ? kVerbsAccept : kVerbsCmTicket, -EOPNOTSUPP,
                  "element '" + a.element->name + "' is lent as " + std::to_string(a.element->ranges.size()) +
                      " ranges, which verbs does not serve (one remote key reaches one range): lend each range as an element of its own",
                  r, body);
  if (h.opcode == kVerbsConnect) {
    ibv::Record client, reply;
    std::string why;
    if (ibv::decode_record(ctl.data(), ctl.size(), &client, &why)) return answer(h, kVerbsAccept, -EPROTO, why, r, body);
    if (!srv_->verbs_) return answer(h, kVerbsAccept, -EPROTONOSUPPORT, kNoVerbs, r, body);
    int rc = srv_->verbs_->accept(a.element, a.grant, client, &ep_, &reply, &why);
    return answer(h, kVerbsAccept, rc, rc == 0 ? ibv::encode_record(reply) : why, r, body);
  }
  if (!srv_->cm_)
    return answer(h, kVerbsCmTicket, -EPROTONOSUPPORT,
                  srv_->verbs_ ? "no rdma_cm listener: " + srv_->cm_status_ : std::string(kNoVerbs), r, body);
  cm_ticket_ = random_bytes(ibv::kTicketSize);
  srv_->cm_tickets_[cm_ticket_] = conn;
  answer(h, kVerbsCmTicket, 0, ibv::encode_cm_ticket(srv_->cm_->port(), cm_ticket_), r, body);
}

void VerbsHandshake::on_cm_connect(rdma_cm_id *id, const Attachment *a) {
  cm_ticket_.clear();
  if (!a || ep_ || got_verbs_) {
    CmListener::reject(id, "the connection that asked for this ticket is already connected or closing");
    return;
  }
  got_verbs_ = true;
  std::string why;
  if (srv_->verbs_->accept_cm(a->element, a->grant, id, &ep_, &why) != 0) CmListener::reject(id, why);
}

void VerbsHandshake::close() {
  ep_.reset();
  if (!cm_ticket_.empty()) srv_->cm_tickets_.erase(cm_ticket_);
  cm_ticket_.clear();
}

}  // namespace libd
