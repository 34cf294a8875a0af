// The hosts the scheduler places elements on. Each is reached through HostAgent: the agent
// embedded in this process (single machine) or a remote `scad-agent` over HTTP. The engine only
// sees this interface.
#pragma once
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent.h"

namespace scad {

using nlohmann::json;

class HostAgent {
 public:
  virtual ~HostAgent() = default;
  virtual std::string id() const = 0;
  virtual double cpus() const = 0;
  virtual uint64_t pool_bytes() const = 0;
  virtual int create_element(const std::string &id, uint64_t size, bool prefetch, std::string *why) = 0;
  virtual void remove_element(const std::string &id) = 0;
  // A grant for `client` over `impl` (shm, tcp or verbs: Engine::transport_between chooses).
  virtual int grant(const std::string &element, const std::string &client, unsigned rights,
                    const std::string &trans_name, const std::string &impl, TransportGrant *out,
                    std::string *why) = 0;
  virtual int revoke(const std::string &grant_id, std::string *why) = 0;
  virtual ComputeOutcome run_compute(const ComputeSpec &spec) = 0;
  // Hands a peer-failure notice to a running compute instance; nonzero if it no longer runs there.
  virtual int notify(const std::string &aid, const json &notice) = 0;
  // Removes the code kept under "ns/kind/name" (all its versions); best effort.
  virtual void remove_code(const std::string &prefix) = 0;
  virtual bool alive() const { return true; }
  // Whether its memory pool serves RDMA verbs.
  virtual bool rdma() const = 0;
  // How its compute processes are confined: {"sandbox": bool, "cgroup_limits": bool, and the
  // reasons when either is off}, as GET /api/v1/hosts shows it.
  virtual json isolation() const = 0;
};

// The agent of this process.
class LocalHost : public HostAgent {
 public:
  explicit LocalHost(Agent &a) : a_(a) {}
  std::string id() const override { return a_.options().host_id; }
  double cpus() const override { return a_.options().cpus; }
  uint64_t pool_bytes() const override { return a_.options().pool_bytes; }
  int create_element(const std::string &id, uint64_t size, bool prefetch, std::string *why) override {
    return a_.create_element(id, size, prefetch, why);
  }
  void remove_element(const std::string &id) override { a_.remove_element(id); }
  int grant(const std::string &element, const std::string &client, unsigned rights, const std::string &trans_name,
            const std::string &impl, TransportGrant *out, std::string *why) override {
    return a_.grant(element, client, rights, trans_name, impl, out, why);
  }
  bool rdma() const override { return a_.rdma(); }
  int revoke(const std::string &grant_id, std::string *why) override { return a_.revoke(grant_id, why); }
  ComputeOutcome run_compute(const ComputeSpec &spec) override { return a_.run_compute(spec); }
  int notify(const std::string &aid, const json &notice) override { return a_.notify(aid, notice); }
  void remove_code(const std::string &prefix) override { a_.remove_code(prefix); }
  json isolation() const override {
    json j = {{"sandbox", a_.sandboxed()}, {"cgroup_limits", a_.limits()}};
    if (!a_.sandboxed()) j["sandbox_off"] = a_.sandbox_off_reason();
    if (!a_.limits()) j["cgroup_limits_off"] = a_.limits_off_reason();
    return j;
  }

 private:
  Agent &a_;
};

}  // namespace scad
