// A host served by a remote scad-agent (runtime/src/agent_api.h), reached over HTTP with the
// cluster token. It counts as alive while its heartbeats keep coming.
#pragma once
#include <atomic>
#include <chrono>

#include "hosts.h"

namespace scad {

class RemoteHost : public HostAgent {
 public:
  RemoteHost(std::string id, std::string url, double cpus, uint64_t pool, bool rdma, std::string token)
      : id_(std::move(id)), url_(std::move(url)), cpus_(cpus), pool_(pool), rdma_(rdma), token_(std::move(token)) {
    heartbeat();
  }
  std::string id() const override { return id_; }
  std::string url() const { return url_; }
  const std::string &token() const { return token_; }
  double cpus() const override { return cpus_; }
  uint64_t pool_bytes() const override { return pool_; }
  bool alive() const override;
  bool rdma() const override { return rdma_; }
  json isolation() const override { return isolation_; }
  void set_isolation(json j) { isolation_ = std::move(j); }
  void heartbeat();

  int create_element(const std::string &id, uint64_t size, bool prefetch, std::string *why) override;
  void remove_element(const std::string &id) override;
  int grant(const std::string &element, const std::string &client, unsigned rights, const std::string &trans_name,
            const std::string &impl, TransportGrant *out, std::string *why) override;
  int revoke(const std::string &grant_id, std::string *why) override;
  ComputeOutcome run_compute(const ComputeSpec &spec) override;
  int notify(const std::string &aid, const json &notice) override;
  void remove_code(const std::string &prefix) override;

 private:
  std::string id_, url_;
  double cpus_;
  uint64_t pool_;
  bool rdma_;
  std::string token_;
  std::atomic<int64_t> last_seen_ms_{0};
  json isolation_ = json::object();  // as the agent reported it when it registered
};

}  // namespace scad
