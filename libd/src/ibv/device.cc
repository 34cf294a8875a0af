#include "ibv/device.h"

#include <arpa/inet.h>

#include <algorithm>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"

namespace libd::ibv {
namespace {

std::mutex g_mu;
std::map<std::string, std::weak_ptr<Device>> g_open;  // "dev/port/gid" -> shared device

// A key's value from params, else from the environment, else empty.
std::string setting(const Params &p, const char *key, const char *env) {
  if (auto v = p.get(key)) return *v;
  const char *e = std::getenv(env);
  return e ? e : "";
}

bool is_ipv4_mapped(const ibv_gid &g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, 12) == 0;
}

bool is_zero(const ibv_gid &g) {
  for (uint8_t b : g.raw)
    if (b) return false;
  return true;
}

struct PortChoice {
  uint8_t port = 0;
  ibv_port_attr attr = {};
};

// The first active port of ctx, or `want` if given; "" or why not.
std::string choose_port(ibv_context *ctx, const ibv_device_attr &dattr, int want, PortChoice *out) {
  for (int p = 1; p <= dattr.phys_port_cnt; p++) {
    if (want > 0 && p != want) continue;
    ibv_port_attr pa;
    if (ibv_query_port(ctx, uint8_t(p), &pa)) continue;
    if (pa.state != IBV_PORT_ACTIVE) {
      if (want > 0) return "port " + std::to_string(p) + " is not active (state " + ibv_port_state_str(pa.state) + ")";
      continue;
    }
    out->port = uint8_t(p);
    out->attr = pa;
    return "";
  }
  if (want > 0 && want > dattr.phys_port_cnt)
    return "port " + std::to_string(want) + " does not exist (the device has " + std::to_string(dattr.phys_port_cnt) + ")";
  return "no active port";
}

// The preferred GID index on a port: RoCE v2 with an IPv4 address, then any RoCE v2, then the
// first valid one. -1 if the table is empty.
int choose_gid(ibv_context *ctx, uint8_t port, int table_len, bool *v2) {
  int best = -1, best_rank = 0;
  for (int i = 0; i < table_len; i++) {
    ibv_gid_entry e;
    if (ibv_query_gid_ex(ctx, port, uint32_t(i), &e, 0)) continue;
    ibv_gid g;
    std::memcpy(g.raw, e.gid.raw, sizeof g.raw);
    if (is_zero(g)) continue;
    int rank = 1;
    if (e.gid_type == IBV_GID_TYPE_ROCE_V2) rank = is_ipv4_mapped(g) ? 3 : 2;
    if (rank > best_rank) best = i, best_rank = rank, *v2 = e.gid_type == IBV_GID_TYPE_ROCE_V2;
  }
  return best;
}

}  // namespace

std::string gid_text(const ibv_gid &gid) {
  char buf[INET6_ADDRSTRLEN];
  inet_ntop(AF_INET6, gid.raw, buf, sizeof buf);
  return buf;
}

std::string Device::ipv4() const {
  if (!roce_ || !is_ipv4_mapped(gid_)) return "";
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, gid_.raw + 12, buf, sizeof buf);
  return buf;
}

bool Device::available() {
  int n = 0;
  ibv_device **list = ibv_get_device_list(&n);
  if (!list) return false;
  bool found = false;
  for (int i = 0; i < n && !found; i++) {
    ibv_context *ctx = ibv_open_device(list[i]);
    if (!ctx) continue;
    ibv_device_attr da;
    PortChoice pc;
    found = ibv_query_device(ctx, &da) == 0 && choose_port(ctx, da, 0, &pc).empty();
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  return found;
}

int Device::open(const Params &params, std::shared_ptr<Device> *out) {
  std::string want_dev = setting(params, "dev", "LIBD_VERBS_DEV");
  std::string port_s = setting(params, "port_num", "LIBD_VERBS_PORT");
  std::string gid_s = setting(params, "gid_index", "LIBD_VERBS_GID_INDEX");
  int want_port = 0, want_gid = -1;
  try {
    if (!port_s.empty()) want_port = std::stoi(port_s);
    if (!gid_s.empty()) want_gid = std::stoi(gid_s);
  } catch (...) {
    return set_error(-EINVAL, "verbs: port_num and gid_index must be numbers (got '" + port_s + "', '" + gid_s + "')");
  }
  if (want_port < 0 || want_port > 255 || want_gid < -1)
    return set_error(-EINVAL, "verbs: port_num must be 1..255 and gid_index >= 0");

  int n = 0;
  ibv_device **list = ibv_get_device_list(&n);
  if (!list || n == 0) {
    if (list) ibv_free_device_list(list);
    return set_error(-ENODEV, "verbs: no RDMA device on this host (ibv_get_device_list found none; "
                              "load a driver or add Soft-RoCE: rdma link add rxe0 type rxe netdev IFACE)");
  }
  std::string tried;
  for (int i = 0; i < n; i++) {
    std::string name = ibv_get_device_name(list[i]);
    if (!want_dev.empty() && name != want_dev) continue;
    ibv_context *ctx = ibv_open_device(list[i]);
    if (!ctx) {
      tried += name + ": cannot open (" + strerror(errno) + "); ";
      continue;
    }
    ibv_device_attr da;
    PortChoice pc;
    std::string why = ibv_query_device(ctx, &da) ? std::string("cannot query") : choose_port(ctx, da, want_port, &pc);
    if (!why.empty()) {
      tried += name + ": " + why + "; ";
      ibv_close_device(ctx);
      continue;
    }
    bool v2 = false;
    int gid = want_gid;
    if (gid < 0) gid = choose_gid(ctx, pc.port, pc.attr.gid_tbl_len, &v2);
    else {
      ibv_gid_entry e;
      if (gid >= pc.attr.gid_tbl_len || ibv_query_gid_ex(ctx, pc.port, uint32_t(gid), &e, 0)) {
        tried += name + ": GID index " + std::to_string(gid) + " is not valid on port " + std::to_string(pc.port) + "; ";
        ibv_close_device(ctx);
        continue;
      }
      v2 = e.gid_type == IBV_GID_TYPE_ROCE_V2;
    }
    bool roce = pc.attr.link_layer == IBV_LINK_LAYER_ETHERNET;
    if (gid < 0 && roce) {
      tried += name + ": no GID on port " + std::to_string(pc.port) + " (is the netdev up with an address?); ";
      ibv_close_device(ctx);
      continue;
    }
    std::string key = name + "/" + std::to_string(pc.port) + "/" + std::to_string(gid);
    ibv_free_device_list(list);
    std::lock_guard<std::mutex> lk(g_mu);
    if (auto existing = g_open[key].lock()) {
      ibv_close_device(ctx);
      *out = existing;
      return 0;
    }
    std::shared_ptr<Device> d(new Device());
    d->ctx_ = ctx;
    d->name_ = name;
    d->port_ = pc.port;
    d->gid_index_ = gid < 0 ? 0 : gid;
    d->lid_ = pc.attr.lid;
    d->mtu_ = pc.attr.active_mtu;
    d->max_msg_ = pc.attr.max_msg_sz ? pc.attr.max_msg_sz : (1u << 31);
    d->roce_ = roce;
    d->roce_v2_ = v2;
    d->mw_type2_ = (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B) || (da.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2A);
    d->max_qp_wr_ = da.max_qp_wr;
    d->max_sge_ = da.max_sge;
    // Outstanding RDMA READs per queue pair: what the device allows, as perftest uses (16 on most
    // NICs, 128 on rxe). Fewer would cap read bandwidth below the depth the user asked for.
    d->max_init_reads_ = std::clamp(da.max_qp_init_rd_atom, 1, 255);
    d->max_resp_reads_ = std::clamp(da.max_qp_rd_atom, 1, 255);
    if (gid >= 0 && ibv_query_gid(ctx, pc.port, gid, &d->gid_)) {
      return set_error(-EIO, "verbs: cannot read GID " + std::to_string(gid) + " of " + name);
    }
    d->pd_ = ibv_alloc_pd(ctx);
    if (!d->pd_) return set_error(-ENOMEM, "verbs: cannot allocate a protection domain on " + name);
    d->mrs_ = std::make_unique<MrCache>(d->pd_);
    g_open[key] = d;
    *out = std::move(d);
    return 0;
  }
  ibv_free_device_list(list);
  if (!want_dev.empty() && tried.empty())
    return set_error(-ENODEV, "verbs: no RDMA device named '" + want_dev + "' (set dev or LIBD_VERBS_DEV to one that ibv_devices lists)");
  return set_error(-ENODEV, "verbs: no usable RDMA device: " + tried);
}

Device::~Device() {
  mrs_.reset();  // deregisters before the PD goes
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
}

std::string Device::describe() const {
  std::string s = name_ + " port " + std::to_string(port_);
  if (roce_) s += " gid[" + std::to_string(gid_index_) + "] " + (roce_v2_ ? "RoCEv2 " : "RoCEv1 ") + gid_text(gid_);
  else s += " lid " + std::to_string(lid_);
  s += " mtu " + std::to_string(128 << int(mtu_));
  return s;
}

}  // namespace libd::ibv
