// The C ABI: argument checks, handle conversion, and nothing else.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

#include "core/action.h"
#include "core/error.h"
#include "core/send_batch.h"
#include "core/server_base.h"
#include "core/transport.h"
#include "ibv/device.h"
#include "libd.h"

using libd::Action;
using libd::OpKind;
using libd::Segment;
using libd::Segments;
using libd::set_error;
using libd::Transport;

namespace {

Transport *T(libd_transport *t) { return libd::from_handle(t); }
Action *A(libd_action *a) { return static_cast<Action *>(a); }
const Action *A(const libd_action *a) { return static_cast<const Action *>(a); }

int copy_out(const std::string &s, char *buf, size_t cap, size_t *needed) {
  if (needed) *needed = s.size() + 1;
  if (!buf || cap < s.size() + 1)
    return set_error(-ERANGE, "buffer of " + std::to_string(cap) + " bytes is too small for " +
                                  std::to_string(s.size() + 1));
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return int(s.size());
}

// Copies a new grant's configuration out. When it does not fit, the grant is revoked: nobody could
// use it, and it would stay until the server stops.
int hand_out(libd::ServerBase *t, const std::string &config, char *out, size_t cap) {
  int n = copy_out(config, out, cap, nullptr);
  if (n >= 0) return n;
  std::string why = libd_last_error();
  size_t at = config.rfind("grant,");  // "...;grant,ID;secret,HEX": the secret is hex, holds no "grant,"
  if (at != std::string::npos && (at == 0 || config[at - 1] == ';'))
    t->revoke(config.substr(at + 6, config.find(';', at) - (at + 6)));
  return set_error(n, why);
}

int to_segments(const libd_iov *iov, int n, std::vector<Segment> *out) {
  if (!iov || n <= 0) return set_error(-EINVAL, "iov must hold at least one entry");
  if (n > 4096) return set_error(-EINVAL, "at most 4096 entries per batch");
  out->reserve(size_t(n));
  for (int i = 0; i < n; i++) {
    if (!iov[i].buf && iov[i].size) return set_error(-EINVAL, "iov[" + std::to_string(i) + "].buf is NULL");
    out->push_back({iov[i].size, iov[i].raddr, static_cast<char *>(iov[i].buf)});
  }
  return 0;
}

int start(libd_transport *t, OpKind kind, Segments segs, libd_op **op) {
  if (!t || !op) return set_error(-EINVAL, "NULL transport or op pointer");
  std::shared_ptr<libd::Op> o;
  if (int rc = T(t)->submit(kind, std::move(segs), &o)) return rc;
  *op = libd::Op::to_handle(std::move(o));
  return 0;
}

char *writable(const void *buf) { return static_cast<char *>(const_cast<void *>(buf)); }

// A transfer and what follows it (`then`: the holder's word, or the grant let go of) in one
// SendBatch: a connection that carries both writes them together when the batch ends.
template <class Then>
int start_then(libd_transport *t, OpKind kind, const void *buf, size_t size, uint64_t raddr, libd_op **op, Then then) {
  libd::SendBatch batch;
  if (int rc = start(t, kind, {{size, raddr, writable(buf)}}, op)) return rc;
  return then();
}

int start_with_word(libd_transport *t, OpKind kind, const void *buf, size_t size, uint64_t raddr, uint64_t value,
                    unsigned flags, libd_op **op) {
  if (flags & ~LIBD_WORD_LAST) return set_error(-EINVAL, "unknown flags");
  return start_then(t, kind, buf, size, raddr, op, [&] { return T(t)->notify(value, 0, (flags & LIBD_WORD_LAST) != 0); });
}

#define CHECK_T(t) \
  if (!(t)) return set_error(-EINVAL, "NULL transport")

// The transport as a server (s); a client transport refuses the server's calls.
#define CHECK_S(t, what)                           \
  CHECK_T(t);                                      \
  libd::ServerBase *s = libd::as_server(T(t));     \
  if (!s) return T(t)->unsupported(what)

}  // namespace

extern "C" {

libd_action *libd_action_init(const char *aid, int argc, char **argv) {
  libd::clear_error();
  if (!aid) { set_error(-EINVAL, "NULL action id"); return nullptr; }
  std::unique_ptr<Action> a;
  if (Action::create(aid, argc, argv, &a)) return nullptr;
  return a.release();
}

int libd_action_free(libd_action *action) {
  if (!action) return set_error(-EINVAL, "NULL action");
  delete A(action);
  return 0;
}

const char *libd_action_id(const libd_action *action) { return action ? A(action)->id().c_str() : ""; }

int libd_action_add_transport(libd_action *action, const char *durl) {
  if (!action || !durl) return set_error(-EINVAL, "NULL action or durl");
  return A(action)->add_transport(durl);
}

int libd_action_config_transport(libd_action *action, const char *name, const char *config) {
  if (!action || !name || !config) return set_error(-EINVAL, "NULL action, name or config");
  return A(action)->config_transport(name, config);
}

libd_transport *libd_action_get_transport(libd_action *action, const char *name) {
  if (!action || !name) { set_error(-EINVAL, "NULL action or name"); return nullptr; }
  return A(action)->get_transport(name);
}

int libd_action_transport_names(const libd_action *action, char *buf, size_t cap) {
  if (!action) return set_error(-EINVAL, "NULL action");
  int rc = copy_out(A(action)->names(), buf, cap, nullptr);
  return rc < 0 ? rc : int(A(action)->count());
}

const char *libd_transport_name(const libd_transport *t) {
  return t ? static_cast<const Transport *>(t)->name().c_str() : "";
}
const char *libd_transport_impl(const libd_transport *t) {
  return t ? static_cast<const Transport *>(t)->impl_name() : "";
}
int libd_transport_kind(const libd_transport *t) {
  return t ? static_cast<const Transport *>(t)->kind() : -EINVAL;
}

const char *libd_state_name(int s) {
  switch (s) {
    case LIBD_STATE_INIT: return "INIT";
    case LIBD_STATE_INITD: return "INITD";
    case LIBD_STATE_READY: return "READY";
    case LIBD_STATE_ERROR: return "ERROR";
    case LIBD_STATE_TERMINATED: return "TERMINATED";
    default: return "UNKNOWN";
  }
}

int libd_transport_state(libd_transport *t) { CHECK_T(t); return T(t)->state(); }
int libd_transport_wait_state(libd_transport *t, unsigned mask, int timeout_ms) {
  CHECK_T(t);
  return T(t)->wait_state(mask, timeout_ms);
}
int libd_transport_wait_change(libd_transport *t, uint64_t *seq, int timeout_ms) {
  CHECK_T(t);
  if (!seq) return set_error(-EINVAL, "NULL seq");
  return T(t)->wait_change(seq, timeout_ms);
}
int libd_transport_init(libd_transport *t) { CHECK_T(t); return T(t)->init(); }
int libd_transport_connect(libd_transport *t) { CHECK_T(t); return T(t)->connect(); }
int libd_transport_recover(libd_transport *t) { CHECK_T(t); return T(t)->recover(); }
int libd_transport_terminate(libd_transport *t) { CHECK_T(t); return T(t)->terminate(); }

int libd_transport_error(libd_transport *t, char *buf, size_t cap) {
  CHECK_T(t);
  return copy_out(T(t)->error_message(), buf, cap, nullptr);
}

int libd_transport_get_message(libd_transport *t, char *buf, size_t cap, size_t *needed) {
  CHECK_T(t);
  std::string m;
  if (int rc = T(t)->message(&m)) return rc;
  return copy_out(m, buf, cap, needed);
}

int libd_transport_set(libd_transport *t, const char *key, const char *value) {
  CHECK_T(t);
  if (!key || !value) return set_error(-EINVAL, "NULL key or value");
  return T(t)->set(key, value);
}

int libd_transport_stats(libd_transport *t, libd_stats *out) {
  CHECK_T(t);
  if (!out) return set_error(-EINVAL, "NULL stats");
  T(t)->stats(out);
  return 0;
}
int libd_transport_busy_ns(libd_transport *t, uint64_t *ns) {
  CHECK_T(t);
  if (!ns) return set_error(-EINVAL, "NULL ns");
  *ns = T(t)->busy_ns();
  return 0;
}

int libd_transport_caps(libd_transport *t) {
  CHECK_T(t);
  return int(T(t)->cap_bits());
}
int libd_trdma_reg(libd_transport *t, size_t size, void **buf) { CHECK_T(t); return T(t)->reg(size, buf); }
int libd_trdma_map(libd_transport *t, void **addr, uint64_t *size) {
  CHECK_T(t);
  if (!addr || !size) return set_error(-EINVAL, "map: addr and size must not be NULL");
  return T(t)->map(addr, size);
}
int libd_trdma_reg_ranges(libd_transport *t, const libd_range *ranges, int n) {
  CHECK_T(t);
  if (!ranges || n < 1 || n > LIBD_MAX_RANGES)
    return set_error(-EINVAL, "reg_ranges: 1.." + std::to_string(LIBD_MAX_RANGES) + " ranges required");
  return T(t)->reg_ranges(ranges, n);
}
int libd_trdma_remote(libd_transport *t, uint64_t *size, unsigned *rights) {
  CHECK_T(t);
  return T(t)->remote(size, rights);
}

int libd_trdma_read(libd_transport *t, size_t size, uint64_t raddr, void *buf) {
  CHECK_T(t);
  return T(t)->run(OpKind::Read, {{size, raddr, static_cast<char *>(buf)}});
}
int libd_trdma_write(libd_transport *t, size_t size, uint64_t raddr, const void *buf) {
  CHECK_T(t);
  return T(t)->run(OpKind::Write, {{size, raddr, static_cast<char *>(const_cast<void *>(buf))}});
}
int libd_trdma_read_nowait(libd_transport *t, size_t size, uint64_t raddr, void *buf) {
  CHECK_T(t);
  return T(t)->run_nowait(OpKind::Read, {size, raddr, static_cast<char *>(buf)});
}
int libd_trdma_write_nowait(libd_transport *t, size_t size, uint64_t raddr, const void *buf) {
  CHECK_T(t);
  return T(t)->run_nowait(OpKind::Write, {size, raddr, static_cast<char *>(const_cast<void *>(buf))});
}
int libd_trdma_readv(libd_transport *t, const libd_iov *iov, int n) {
  CHECK_T(t);
  std::vector<Segment> segs;
  if (int rc = to_segments(iov, n, &segs)) return rc;
  return T(t)->run(OpKind::Read, std::move(segs));
}
int libd_trdma_writev(libd_transport *t, const libd_iov *iov, int n) {
  CHECK_T(t);
  std::vector<Segment> segs;
  if (int rc = to_segments(iov, n, &segs)) return rc;
  return T(t)->run(OpKind::Write, std::move(segs));
}

int libd_trdma_read_async(libd_transport *t, size_t size, uint64_t raddr, void *buf, libd_op **op) {
  return start(t, OpKind::Read, {{size, raddr, static_cast<char *>(buf)}}, op);
}
int libd_trdma_write_async(libd_transport *t, size_t size, uint64_t raddr, const void *buf, libd_op **op) {
  return start(t, OpKind::Write, {{size, raddr, static_cast<char *>(const_cast<void *>(buf))}}, op);
}
int libd_trdma_readv_async(libd_transport *t, const libd_iov *iov, int n, libd_op **op) {
  std::vector<Segment> segs;
  if (int rc = to_segments(iov, n, &segs)) return rc;
  return start(t, OpKind::Read, std::move(segs), op);
}
int libd_trdma_writev_async(libd_transport *t, const libd_iov *iov, int n, libd_op **op) {
  std::vector<Segment> segs;
  if (int rc = to_segments(iov, n, &segs)) return rc;
  return start(t, OpKind::Write, std::move(segs), op);
}

int libd_op_poll(libd_op *op) {
  if (!op) return set_error(-EINVAL, "NULL op");
  return op->op->poll();
}
int libd_op_wait(libd_op *op, int timeout_ms) {
  if (!op) return set_error(-EINVAL, "NULL op");
  auto until = timeout_ms < 0 ? libd::Clock::time_point::max() : libd::Deadline::after_ms(timeout_ms).at();
  int rc = op->op->wait_until(until);
  if (rc == -ETIMEDOUT && !op->op->done()) return set_error(-ETIMEDOUT, "wait timed out; the operation goes on");
  if (rc < 0) set_error(rc, op->op->message().empty() ? libd_strerror(rc) : op->op->message());
  return rc;
}
int libd_op_cancel(libd_op *op) {
  if (!op) return set_error(-EINVAL, "NULL op");
  return op->op->cancel();
}
int libd_op_watch(libd_op *op, int fd) {
  if (!op) return set_error(-EINVAL, "NULL op");
  op->op->watch(fd);
  return 0;
}
int libd_op_free(libd_op *op) {
  if (!op) return set_error(-EINVAL, "NULL op");
  // The handle's reference, taken out of the handle: the operation (with the handle in it) goes
  // when this does, unless its engine still holds it.
  std::shared_ptr<libd::Op> o = std::move(op->op);
  if (!o->done()) o->cancel();
  return 0;
}

int libd_trdma_server_serve(libd_transport *t) { CHECK_S(t, "serve"); return s->serve(); }
int libd_trdma_server_stop(libd_transport *t) { CHECK_S(t, "stop"); return s->stop(); }
int libd_trdma_server_run(libd_transport *t) { CHECK_S(t, "serve"); return s->serve_blocking(); }
int libd_trdma_server_grant(libd_transport *t, const char *client, uint64_t offset, uint64_t length,
                            unsigned rights, char *out, size_t cap) {
  CHECK_S(t, "grant");
  if (!client) return set_error(-EINVAL, "NULL client");
  std::string config;
  if (int rc = s->grant(client, offset, length, rights, &config)) return rc;
  return hand_out(s, config, out, cap);
}
int libd_trdma_server_revoke(libd_transport *t, const char *grant_id) {
  CHECK_S(t, "revoke");
  if (!grant_id) return set_error(-EINVAL, "NULL grant id");
  return s->revoke(grant_id);
}

int libd_trdma_server_expose(libd_transport *t, const char *element, void *base, uint64_t size) {
  CHECK_S(t, "expose");
  if (!element || !*element) return set_error(-EINVAL, "expose: element name required");
  return s->expose(element, base, size);
}
int libd_trdma_server_expose_ranges(libd_transport *t, const char *element, const libd_range *ranges, int n) {
  CHECK_S(t, "expose_ranges");
  if (!element || !*element) return set_error(-EINVAL, "expose_ranges: element name required");
  if (!ranges || n < 1 || n > LIBD_MAX_RANGES)
    return set_error(-EINVAL, "expose_ranges: 1.." + std::to_string(LIBD_MAX_RANGES) + " ranges required");
  return s->expose_ranges(element, ranges, n);
}
int libd_trdma_server_withdraw(libd_transport *t, const char *element) {
  CHECK_S(t, "withdraw");
  if (!element) return set_error(-EINVAL, "NULL element");
  return s->withdraw(element);
}
namespace {
int grant_with(libd::ServerBase *s, const libd_grant_spec *spec, const char *id, const char *secret, char *out,
               size_t cap) {
  if (!spec || !spec->client) return set_error(-EINVAL, "grant: NULL spec or client");
  libd::ServerBase::GrantSpec g;
  g.id = id ? id : "";
  g.secret = secret ? secret : "";
  g.element = spec->element ? spec->element : "";
  g.client = spec->client;
  g.offset = spec->offset;
  g.length = spec->length;
  g.rights = spec->rights;
  g.ttl_ms = spec->ttl_ms;
  std::string config;
  if (int rc = s->grant_spec(g, &config)) return rc;
  return hand_out(s, config, out, cap);
}
}  // namespace

int libd_trdma_server_grant_ex(libd_transport *t, const libd_grant_spec *spec, char *out, size_t cap) {
  CHECK_S(t, "grant");
  return grant_with(s, spec, nullptr, nullptr, out, cap);
}
int libd_trdma_server_grant_as(libd_transport *t, const libd_grant_spec *spec, const char *grant_id,
                               const char *secret, char *out, size_t cap) {
  CHECK_S(t, "grant");
  if (!grant_id || !*grant_id || !secret || !*secret) return set_error(-EINVAL, "grant_as: the id and the secret are required");
  return grant_with(s, spec, grant_id, secret, out, cap);
}
int libd_trdma_server_add_element(libd_transport *t, const char *element, uint64_t size) {
  CHECK_S(t, "add_element");
  if (!element || !*element) return set_error(-EINVAL, "add_element: element name required");
  return s->add_element(element, size);
}
int libd_trdma_server_prefetch(libd_transport *t, const char *element) {
  CHECK_S(t, "prefetch");
  if (!element || !*element) return set_error(-EINVAL, "prefetch: element name required");
  return s->prefetch(element);
}
int libd_trdma_server_query(libd_transport *t, libd_server_attr *attr) {
  CHECK_S(t, "query");
  if (!attr) return set_error(-EINVAL, "query: NULL attr");
  libd::ServerBase::ServerSummary sum;
  if (int rc = s->query(&sum)) return rc;
  memset(attr, 0, sizeof *attr);
  attr->used_bytes = sum.used_bytes;
  attr->capacity = sum.capacity;
  attr->connections = sum.connections;
  attr->verbs = sum.verbs ? 1 : 0;
  snprintf(attr->verbs_device, sizeof attr->verbs_device, "%s", sum.verbs_device.c_str());
  return 0;
}
int libd_verbs_available(void) { return libd::ibv::Device::available() ? 1 : 0; }
int libd_trdma_server_wait_notify(libd_transport *t, const char *grant_id, uint64_t *value, int *status,
                                  int timeout_ms) {
  CHECK_S(t, "wait_notify");
  if (!grant_id || !value || !status) return set_error(-EINVAL, "wait_notify: NULL argument");
  return s->wait_notify(grant_id, value, status, timeout_ms);
}
int libd_trdma_server_progress(libd_transport *t, uint32_t lease_us) {
  CHECK_S(t, "progress");
  if (lease_us > 1000000) return set_error(-EINVAL, "progress: lease_us must be at most 1000000");
  return s->progress(lease_us);
}
int libd_trdma_server_watch_notify(libd_transport *t, const char *grant_id, int fd) {
  CHECK_S(t, "watch_notify");
  if (!grant_id || fd < 0) return set_error(-EINVAL, "watch_notify: NULL grant or no descriptor");
  return s->watch_notify(grant_id, fd, true);
}
int libd_trdma_server_unwatch_notify(libd_transport *t, const char *grant_id, int fd) {
  CHECK_S(t, "watch_notify");
  if (!grant_id) return set_error(-EINVAL, "unwatch_notify: NULL grant");
  return s->watch_notify(grant_id, fd, false);
}
int libd_trdma_notify(libd_transport *t, uint64_t value, int status) {
  CHECK_T(t);
  return T(t)->notify(value, status);
}
int libd_trdma_notify_last(libd_transport *t, uint64_t value, int status) {
  CHECK_T(t);
  return T(t)->notify(value, status, true);
}

int libd_trdma_read_async_notify(libd_transport *t, size_t size, uint64_t raddr, void *buf, uint64_t value,
                                 unsigned flags, libd_op **op) {
  return start_with_word(t, OpKind::Read, buf, size, raddr, value, flags, op);
}
int libd_trdma_write_async_notify(libd_transport *t, size_t size, uint64_t raddr, const void *buf, uint64_t value,
                                  unsigned flags, libd_op **op) {
  return start_with_word(t, OpKind::Write, buf, size, raddr, value, flags, op);
}
int libd_trdma_read_async_last(libd_transport *t, size_t size, uint64_t raddr, void *buf, libd_op **op) {
  return start_then(t, OpKind::Read, buf, size, raddr, op, [&] { return T(t)->let_go(); });
}
int libd_trdma_write_async_last(libd_transport *t, size_t size, uint64_t raddr, const void *buf, libd_op **op) {
  return start_then(t, OpKind::Write, buf, size, raddr, op, [&] { return T(t)->let_go(); });
}

}  // extern "C"
