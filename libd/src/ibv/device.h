// An opened RDMA device: context, protection domain, the chosen port and GID, and the
// registration cache. One per (device, port, GID index) per process, shared by every verbs
// transport and server in it, as UCX shares one memory domain: memory registered once serves
// every queue pair on it.
//
// Nothing is hard-coded. The device, port and GID index are discovered — the first active port,
// and on it the RoCE v2 GID of an IPv4 address if there is one, else any RoCE v2 GID, else
// index 0 (InfiniBand) — and overridden by the keys dev, port and gid_index (durl or action
// options) or by LIBD_VERBS_DEV, LIBD_VERBS_PORT and LIBD_VERBS_GID_INDEX.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/params.h"
#include "ibv/mr_cache.h"

namespace libd::ibv {

class Device {
 public:
  // 0, or a negative errno with libd_last_error saying which device/port/GID was wanted and why
  // it could not be used (no device, port down, GID index out of range...).
  static int open(const Params &params, std::shared_ptr<Device> *out);
  // True if this host has at least one RDMA device with an active port (for "verbs where both
  // ends have RDMA"); never fails.
  static bool available();
  ~Device();

  ibv_context *ctx() const { return ctx_; }
  ibv_pd *pd() const { return pd_; }
  const std::string &name() const { return name_; }
  uint8_t port() const { return port_; }
  int gid_index() const { return gid_index_; }
  const ibv_gid &gid() const { return gid_; }
  uint16_t lid() const { return lid_; }
  ibv_mtu mtu() const { return mtu_; }
  uint32_t max_msg() const { return max_msg_; }
  bool is_roce() const { return roce_; }
  // Type-2 memory windows (bound per queue pair): the device advertises them.
  bool has_mw_type2() const { return mw_type2_; }
  int max_qp_wr() const { return max_qp_wr_; }
  int max_sge() const { return max_sge_; }
  // Outstanding RDMA READs a queue pair issues / accepts (the device's limits, at most 16).
  int max_initiator_reads() const { return max_init_reads_; }
  int max_responder_reads() const { return max_resp_reads_; }
  MrCache &mrs() { return *mrs_; }
  // The IPv4 address of the chosen GID (RoCE v2 over IPv4), or "" if it has none.
  std::string ipv4() const;
  std::string describe() const;  // "rxe0 port 1 gid[1] RoCEv2 ::ffff:10.0.0.1 mtu 1024"

 private:
  Device() = default;
  ibv_context *ctx_ = nullptr;
  ibv_pd *pd_ = nullptr;
  std::string name_;
  uint8_t port_ = 1;
  int gid_index_ = 0;
  ibv_gid gid_ = {};
  uint16_t lid_ = 0;
  ibv_mtu mtu_ = IBV_MTU_1024;
  uint32_t max_msg_ = 1u << 30;
  bool roce_ = false;
  bool roce_v2_ = false;
  bool mw_type2_ = false;
  int max_qp_wr_ = 1024;
  int max_sge_ = 1;
  int max_init_reads_ = 1;
  int max_resp_reads_ = 1;
  std::unique_ptr<MrCache> mrs_;
};

std::string gid_text(const ibv_gid &gid);

}  // namespace libd::ibv
