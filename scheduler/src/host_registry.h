// Agents of other hosts register (and heartbeat, by registering again) here: who may register
// which host id (the cluster token any id but the built-in `local`; a host key only its own), what
// a registration must say, and what the engine and the store learn of a new or changed host.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "engine.h"
#include "host_keys.h"
#include "remote_host.h"
#include "store.h"

namespace scad {

class HostRegistry {
 public:
  // cluster_token "" = none; host_keys_file "" = no per-host keys.
  HostRegistry(Store &store, Engine &engine, std::string cluster_token, const std::string &host_keys_file);

  struct Outcome {
    int status = 200;   // 200, or 400 / 401 / 409 with `error`
    std::string error;
  };
  // `bearer` is the credential presented; `body` the parsed registration {id, url, cpus, pool, ...}.
  Outcome register_host(const std::string &bearer, const nlohmann::json &body);
  // Whether any credential could register a host here (a cluster token or host keys).
  bool accepts_hosts() const { return !cluster_token_.empty() || keys_; }

 private:
  Store &store_;
  Engine &engine_;
  const std::string cluster_token_;
  std::unique_ptr<HostKeys> keys_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<RemoteHost>> hosts_;
};

// OpenWhisk's entity names: a letter, digit or '_' first, then also '.', '@', '-'; at most 256.
bool valid_entity_name(const std::string &name);

}  // namespace scad
