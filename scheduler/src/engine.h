// Runs activations: an application's DAG (memory elements created, compute elements started in
// dependency order with their fan-out, parents' results joined into children, sinks' results
// returned, everything cleaned up) or a single OpenWhisk action. Also answers the runtime endpoint
// that running actions call to grow and shrink their memory.
#pragma once
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent.h"
#include "manifest.h"
#include "store.h"

namespace scad {

struct Activation;

class Engine {
 public:
  Engine(Store &store, Agent &agent, std::string home, std::string runtime_url);
  ~Engine();

  // Starts an activation; returns its id. Waits up to wait_ms for it to finish: then *record holds
  // the finished record and *finished is true.
  std::string invoke_app(const std::string &ns, const json &app, const json &params, int64_t wait_ms,
                         json *record, bool *finished);
  std::string invoke_action(const std::string &ns, const json &action, const json &params, int64_t wait_ms,
                            json *record, bool *finished);

  // The runtime endpoint (docs/runtime-endpoint.md). Return an HTTP status and fill *reply.
  int runtime_invoke(const std::string &token, const std::string &aid, const json &body, json *reply);
  int runtime_release(const std::string &token, const std::string &aid, const std::string &name, json *reply);

  json elements(const std::string &ns);
  json host_info();

 private:
  std::string start(std::shared_ptr<Activation> act, int64_t wait_ms, json *record, bool *finished);
  void run_app(const std::shared_ptr<Activation> &act);
  void run_action(const std::shared_ptr<Activation> &act);
  void finish(const std::shared_ptr<Activation> &act, const std::string &status, const json &result);
  std::string code_dir(const std::string &ns, const std::string &kind, const json &doc);
  void acquire_cpu(double cpu);
  void release_cpu(double cpu);

  Store &store_;
  Agent &agent_;
  std::string home_, runtime_url_;
  std::mutex mu_;
  std::condition_variable cpu_cv_;
  double cpu_free_;
  std::map<std::string, std::shared_ptr<Activation>> running_;
  struct Caller {
    std::shared_ptr<Activation> act;
    std::string aid;
  };
  std::map<std::string, Caller> tokens_;  // runtime token -> the compute instance holding it
  // The running compute instance a runtime request comes from; false (reply filled) if none.
  bool find_caller(const std::string &token, const std::string &aid, Caller *out, json *reply);
  uint64_t counter_ = 0;
};

}  // namespace scad
