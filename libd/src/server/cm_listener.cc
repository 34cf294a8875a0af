#include "server/cm_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "ibv/cm.h"

namespace libd {

int CmListener::create(uv_loop_t *loop, const std::string &host, RequestFn on_request,
                       std::unique_ptr<CmListener> *out) {
  std::unique_ptr<CmListener> l(new CmListener());
  l->on_request_ = std::move(on_request);
  auto fail = [&](const std::string &what) {
    return set_error(-(errno ? errno : EIO), "rdma_cm listener on " + host + ": " + what + ": " + strerror(errno));
  };
  sockaddr_storage addr = {};
  auto *v4 = reinterpret_cast<sockaddr_in *>(&addr);
  auto *v6 = reinterpret_cast<sockaddr_in6 *>(&addr);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
  } else {
    return set_error(-EINVAL, "rdma_cm listener: '" + host + "' is not an IP address");
  }
  errno = 0;
  l->channel_ = rdma_create_event_channel();
  if (!l->channel_) return fail("cannot create an event channel");
  int fl = fcntl(l->channel_->fd, F_GETFL);
  fcntl(l->channel_->fd, F_SETFL, fl | O_NONBLOCK);
  if (rdma_create_id(l->channel_, &l->listen_id_, l.get(), RDMA_PS_TCP)) return fail("cannot create an identifier");
  if (rdma_bind_addr(l->listen_id_, reinterpret_cast<sockaddr *>(&addr))) return fail("cannot bind");
  if (rdma_listen(l->listen_id_, 64)) return fail("cannot listen");
  l->port_ = ntohs(rdma_get_src_port(l->listen_id_));
  l->poll_ = new uv_poll_t;
  uv_poll_init(loop, l->poll_, l->channel_->fd);
  l->poll_->data = l.get();
  uv_poll_start(l->poll_, UV_READABLE, [](uv_poll_t *p, int, int) { static_cast<CmListener *>(p->data)->on_events(); });
  *out = std::move(l);
  return 0;
}

CmListener::~CmListener() {
  if (poll_) {
    uv_poll_stop(poll_);
    uv_close(reinterpret_cast<uv_handle_t *>(poll_), [](uv_handle_t *h) { delete reinterpret_cast<uv_poll_t *>(h); });
  }
  if (listen_id_) rdma_destroy_id(listen_id_);
  // Identifiers of accepted connections report on this channel; they are destroyed (by their
  // endpoints) before the server lets the listener go, as rdma_destroy_event_channel requires.
  if (channel_) rdma_destroy_event_channel(channel_);
}

void CmListener::reject(rdma_cm_id *id, const std::string &why) {
  std::string text = why.substr(0, 140);  // a REJ carries up to 148 bytes of private data
  rdma_reject(id, text.c_str(), uint8_t(text.size() + 1));
  rdma_destroy_id(id);
}

void CmListener::on_events() {
  for (;;) {
    rdma_cm_event *e = nullptr;
    if (rdma_get_cm_event(channel_, &e)) return;  // EAGAIN: drained
    rdma_cm_event_type type = e->event;
    rdma_cm_id *id = e->id;
    std::string ticket, why;
    int bad = 0;
    if (type == RDMA_CM_EVENT_CONNECT_REQUEST)
      bad = ibv::decode_cm_hello(e->param.conn.private_data, e->param.conn.private_data_len, &ticket, &why);
    rdma_ack_cm_event(e);
    // Only requests need an answer. ESTABLISHED, DISCONNECTED and TIMEWAIT_EXIT of accepted
    // connections need nothing: the control connection, not the queue pair, says when a client is
    // gone, and its endpoint owns (and destroys) the identifier.
    if (type != RDMA_CM_EVENT_CONNECT_REQUEST) continue;
    if (bad) reject(id, why);
    else on_request_(id, ticket);
  }
}

}  // namespace libd
