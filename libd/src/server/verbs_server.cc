#include "server/verbs_server.h"

#include <sched.h>

#include <cerrno>
#include <cstring>

#include "core/clock.h"
#include "core/error.h"
#include "libd.h"
#include "ibv/cm.h"
#include "ibv/qp.h"

namespace libd {

using namespace ibv;

namespace {
constexpr int kCqSize = 256;
constexpr int64_t kBindTimeoutMs = 2000;

// The remote rights of a grant as verbs access flags.
int remote_access(const Grant &grant) {
  return ((grant.rights & LIBD_RIGHT_READ) ? IBV_ACCESS_REMOTE_READ : 0) |
         ((grant.rights & LIBD_RIGHT_WRITE) ? IBV_ACCESS_REMOTE_WRITE : 0);
}
}  // namespace

VerbsEndpoint::~VerbsEndpoint() {
  // The key first: from here it reaches nothing, whatever is still on the wire. The window must
  // also go before its queue pair, which it holds a reference on: rxe waits (about 50 s under
  // emulation) for that reference when a queue pair with a bound window is destroyed.
  if (mw_) ibv_dealloc_mw(mw_);
  if (qp_) ibv_destroy_qp(qp_);
  if (cm_id_) rdma_destroy_id(cm_id_);  // tells an rdma_cm client (DREQ)
  if (range_mr_) ibv_dereg_mr(range_mr_);
}

int VerbsServer::create(const Params &params, std::unique_ptr<VerbsServer> *out) {
  std::unique_ptr<VerbsServer> s(new VerbsServer());
  if (int rc = Device::open(params, &s->dev_)) return rc;
  s->cq_ = ibv_create_cq(s->dev_->ctx(), kCqSize, nullptr, nullptr, 0);
  if (!s->cq_) return set_error(-ENOMEM, "verbs: cannot create a completion queue on " + s->dev_->name());
  s->use_mw_ = s->dev_->has_mw_type2() && params.get_or("mw", "1") != "0";
  *out = std::move(s);
  return 0;
}

VerbsServer::~VerbsServer() {
  if (cq_) ibv_destroy_cq(cq_);
}

std::string VerbsServer::describe() const {
  return dev_->describe() + (use_mw_ ? ", keys: type-2 memory windows" : ", keys: per-grant registrations");
}

int VerbsServer::bind_window(VerbsEndpoint &ep, const Grant &grant, uint32_t *rkey, std::string *why) {
  ep.mw_ = ibv_alloc_mw(dev_->pd(), IBV_MW_TYPE_2);
  if (!ep.mw_) {
    *why = std::string("cannot allocate a memory window: ") + strerror(errno);
    return -ENOMEM;
  }
  ibv_send_wr wr = {}, *bad = nullptr;
  uint64_t id = next_wr_++;
  wr.wr_id = id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.bind_mw.mw = ep.mw_;
  wr.bind_mw.rkey = ibv_inc_rkey(ep.mw_->rkey);
  wr.bind_mw.bind_info.mr = ep.range_mr_;
  wr.bind_mw.bind_info.addr = uint64_t(uintptr_t(ep.element_->base + grant.offset));
  wr.bind_mw.bind_info.length = grant.length;
  wr.bind_mw.bind_info.mw_access_flags = unsigned(remote_access(grant));
  if (int rc = ibv_post_send(ep.qp_, &wr, &bad)) {
    *why = std::string("cannot post the window bind: ") + strerror(rc);
    return -rc;
  }
  // A bind is a local operation of the device: it completes at once (microseconds, even on rxe
  // under emulation). Completions of other endpoints' binds cannot be pending here: every accept
  // runs on the server's one loop thread and waits for its own.
  Deadline deadline = Deadline::after_ms(kBindTimeoutMs);
  for (;;) {
    ibv_wc wc;
    int n = ibv_poll_cq(cq_, 1, &wc);
    if (n < 0) {
      *why = "polling the completion queue failed";
      return -EIO;
    }
    if (n == 1 && wc.wr_id == id) {
      if (wc.status != IBV_WC_SUCCESS) {
        *why = std::string("the window bind failed: ") + ibv_wc_status_str(wc.status);
        return -EIO;
      }
      *rkey = wr.bind_mw.rkey;
      return 0;
    }
    if (n == 0) {
      if (deadline.expired()) {
        *why = "the window bind did not complete in time";
        return -ETIMEDOUT;
      }
      sched_yield();
    }
  }
}

int VerbsServer::prepare(const std::shared_ptr<Element> &element, const Grant &grant, VerbsEndpoint &ep,
                         std::string *why) {
  ep.dev_ = dev_;
  ep.element_ = element;
  if (!element->ranges.empty()) {
    *why = "element '" + element->name + "' is lent as " + std::to_string(element->ranges.size()) +
           " ranges, which verbs does not serve (one remote key reaches one range): lend each range as an element of its own";
    return -EOPNOTSUPP;
  }
  int remote = remote_access(grant);
  char *range = element->base + grant.offset;
  // Under a window, a registration of exactly the granted range that allows binding windows and
  // nothing remote by itself. Exactly the range, not the whole element: rxe (Linux 6.1) checks an
  // access through a window against the range of the registration beneath it.
  int access = use_mw_ ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND
                       : remote | ((grant.rights & LIBD_RIGHT_WRITE) ? IBV_ACCESS_LOCAL_WRITE : 0);
  ep.range_mr_ = ibv_reg_mr(dev_->pd(), range, grant.length, access);
  if (!ep.range_mr_) {
    *why = std::string("cannot register the granted range: ") + strerror(errno);
    return -ENOMEM;
  }
  QpShape shape;
  shape.send_depth = 4;  // binds only: the server never initiates a transfer
  if (int rc = create_rc_qp(*dev_, cq_, shape, &ep.qp_)) {
    *why = last_error();
    return rc;
  }
  return 0;
}

int VerbsServer::finish(const Grant &grant, uint32_t psn, VerbsEndpoint &ep, Record *reply, std::string *why) {
  Record r = local_record(*dev_, ep.qp_, psn);
  r.addr = uint64_t(uintptr_t(ep.element_->base + grant.offset));
  r.length = grant.length;
  r.rights = grant.rights & (LIBD_RIGHT_READ | LIBD_RIGHT_WRITE);
  if (use_mw_) {
    if (int rc = bind_window(ep, grant, &r.rkey, why)) return rc;
    r.flags |= kRecordFlagMemoryWindow;
  } else {
    r.rkey = ep.range_mr_->rkey;
  }
  *reply = r;
  return 0;
}

int VerbsServer::accept(const std::shared_ptr<Element> &element, const Grant &grant, const Record &client,
                        std::unique_ptr<VerbsEndpoint> *out, Record *reply, std::string *why) {
  auto ep = std::make_unique<VerbsEndpoint>();
  if (int rc = prepare(element, grant, *ep, why)) return rc;
  uint32_t psn = random_psn();
  if (int rc = connect_rc_qp(*dev_, ep->qp_, remote_access(grant), psn, client)) {
    *why = last_error();
    return rc;
  }
  if (int rc = finish(grant, psn, *ep, reply, why)) return rc;
  *out = std::move(ep);
  return 0;
}

int VerbsServer::accept_cm(const std::shared_ptr<Element> &element, const Grant &grant, rdma_cm_id *id,
                           std::unique_ptr<VerbsEndpoint> *out, std::string *why) {
  auto ep = std::make_unique<VerbsEndpoint>();
  if (int rc = cm_check_device(id, *dev_, why)) return rc;
  if (int rc = prepare(element, grant, *ep, why)) return rc;
  // The queue pair is ours (our protection domain and completion queue); rdma_cm supplies the
  // path and sequence numbers. It reaches RTS before the answer goes out, so the window can be
  // bound now and the key is good the moment the client sees it.
  uint32_t psn = 0;
  int rc = cm_modify_qp(id, ep->qp_, IBV_QPS_INIT, remote_access(grant));
  if (!rc) rc = cm_modify_qp(id, ep->qp_, IBV_QPS_RTR, -1);
  if (!rc) rc = cm_modify_qp(id, ep->qp_, IBV_QPS_RTS, -1, &psn);
  if (rc) {
    *why = last_error();
    return rc;
  }
  Record reply;
  if (int rc = finish(grant, psn, *ep, &reply, why)) return rc;
  std::string body = encode_record(reply);
  rdma_conn_param cp = {};
  cp.private_data = body.data();
  cp.private_data_len = uint8_t(body.size());
  cp.responder_resources = uint8_t(dev_->max_responder_reads());
  cp.initiator_depth = 1;
  cp.rnr_retry_count = 7;
  cp.qp_num = ep->qp_->qp_num;
  if (rdma_accept(id, &cp)) {
    *why = std::string("rdma_accept failed: ") + strerror(errno);
    return -errno;
  }
  ep->cm_id_ = id;
  *out = std::move(ep);
  return 0;
}

}  // namespace libd
