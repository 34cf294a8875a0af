#include "host_registry.h"

#include "safe_json.h"
#include "secrets.h"

namespace scad {

using nlohmann::json;

// Checked by hand: std::regex recurses per character and a long name would overflow the stack.
bool valid_entity_name(const std::string &name) {
  auto plain = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; };
  if (name.empty() || name.size() > 256 || !plain(name[0])) return false;
  for (char c : name)
    if (!plain(c) && c != '.' && c != '@' && c != '-') return false;
  return true;
}

HostRegistry::HostRegistry(Store &store, Engine &engine, std::string cluster_token, const std::string &host_keys_file)
    : store_(store),
      engine_(engine),
      cluster_token_(std::move(cluster_token)),
      keys_(host_keys_file.empty() ? nullptr : std::make_unique<HostKeys>(host_keys_file)) {}

HostRegistry::Outcome HostRegistry::register_host(const std::string &bearer, const json &b) {
  bool cluster = !cluster_token_.empty() && constant_time_equal(bearer, cluster_token_);
  if (!cluster && !keys_) return {401, "registering a host needs the cluster token (scad-server --cluster-token-file)"};
  // With per-host keys, a key registers its own id and no other.
  if (!cluster && !(get_string(b, "id") && keys_->admits(bearer, *get_string(b, "id"))))
    return {401, "registering a host needs its own key (ID:SECRET, as `scad host key ID` made it) or the cluster token"};
  if (!b.contains("id") || !b["id"].is_string() || !b.contains("url") || !b["url"].is_string() || !b.contains("cpus") ||
      !b["cpus"].is_number() || !b.contains("pool") || !b["pool"].is_number_unsigned())
    return {400, "needs {\"id\", \"url\", \"cpus\", \"pool\"}"};
  if (b.contains("rdma") && !b["rdma"].is_boolean()) return {400, "\"rdma\" must be true or false"};
  std::string id = b["id"];
  // The built-in host's id is never a remote agent's: registering it would replace it.
  if (id == "local" || !valid_entity_name(id))
    return {400, "host id '" + valid_utf8(id.substr(0, 64)) + "' is reserved or not a name (letters, digits, '_', '.', '@', '-')"};
  if (!(b["cpus"].get<double>() >= 0 && b["cpus"].get<double>() <= 4096)) return {400, "\"cpus\" must be from 0 to 4096"};
  bool rdma = b.value("rdma", false);
  std::lock_guard<std::mutex> lk(mu_);
  auto &known = hosts_[id];
  if (known && known->url() == b["url"].get<std::string>() && known->rdma() == rdma && known->token() == bearer) {
    known->heartbeat();
    return {};
  }
  // A live host is never taken over with another credential (the cluster token for a host that
  // registered with its own key, or the reverse); once its heartbeats stop, it may be.
  if (known && known->alive() && !constant_time_equal(known->token(), bearer))
    return {409, "host '" + id + "' is registered and alive with another credential; it can be registered "
                 "otherwise once its heartbeats stop"};
  // The scheduler calls the agent with the credential the agent registered with.
  known = std::make_shared<RemoteHost>(id, b["url"], b["cpus"].get<double>(), b["pool"].get<uint64_t>(), rdma, bearer);
  json isolation = {{"sandbox", get_bool(b, "sandbox").value_or(false)},
                    {"cgroup_limits", get_bool(b, "limits").value_or(false)}};
  for (const char *why : {"sandbox_off", "cgroup_limits_off"})
    if (auto w = get_string(b, why)) isolation[why] = valid_utf8(w->substr(0, 200));
  known->set_isolation(isolation);
  engine_.add_host(known);
  store_.put_host({{"id", id}, {"url", b["url"]}, {"cpus", b["cpus"]}, {"memory_pool", b["pool"]}, {"rdma", rdma},
                   {"rdma_device", get_string(b, "rdma_device").value_or("")}});
  return {};
}

}  // namespace scad
