// Runs activations: an application's DAG (memory elements created, compute elements started in
// dependency order with their fan-out, parents' results joined into children, sinks' results
// returned, everything cleaned up) or a single OpenWhisk action. Also answers the runtime endpoint
// that running actions call to grow and shrink their memory.
#pragma once
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent.h"
#include "hosts.h"
#include "action_limits.h"
#include "metrics.h"
#include "manifest.h"
#include "quotas.h"
#include "store.h"

namespace httplib {
class ThreadPool;
}

namespace scad {

struct Activation;

// Compute instances of applications run on a pool of this many threads, shared by every activation
// (an instance mostly waits: for cpu, for its process); more wait their turn in the queue.
constexpr size_t kInstanceThreads = 64;

class Engine {
 public:
  Engine(Store &store, std::string runtime_url, LimitRanges limits = {}, Quotas quotas = {});
  ~Engine();

  // Hosts elements are placed on: the embedded agent and remote agents as they register.
  void add_host(std::shared_ptr<HostAgent> host);
  // The largest pool and cpus of any host (for validating manifests).
  Capacity capacity();

  // Starts an activation; returns its id. Waits up to wait_ms for it to finish: then *record holds
  // the finished record and *finished is true. "" when the namespace has its quota of activations
  // in flight (*record then holds {"error"}).
  std::string invoke_app(const std::string &ns, const json &app, const json &params, int64_t wait_ms,
                         json *record, bool *finished);
  std::string invoke_action(const std::string &ns, const json &action, const json &params, int64_t wait_ms,
                            json *record, bool *finished);
  const Quotas &quotas() const { return quotas_; }

  // The runtime endpoint (docs/runtime-endpoint.md). Return an HTTP status and fill *reply.
  int runtime_invoke(const std::string &token, const std::string &aid, const json &body, json *reply);
  int runtime_release(const std::string &token, const std::string &aid, const std::string &name, json *reply);

  // A deleted action or application: every host removes the code it kept of it.
  void forget_code(const std::string &ns, const std::string &kind, const std::string &name);

  json elements(const std::string &ns);
  json host_info();
  // Where activations and starts are counted (GET /metrics); set before the first invoke.
  void set_metrics(Metrics *m) { metrics_ = m; }

 private:
  std::string start(std::shared_ptr<Activation> act, int64_t wait_ms, json *record, bool *finished);
  // The body of an activation's thread: runs it, and whatever goes wrong inside becomes a
  // "whisk internal error" record (never an exception leaving the thread).
  void run(const std::shared_ptr<Activation> &act);
  void run_app(const std::shared_ptr<Activation> &act);
  // One compute instance of an application, on a thread of its own.
  ComputeOutcome run_instance(const std::shared_ptr<Activation> &act, const std::string &element, int instance,
                              const json &parents);
  void run_action(const std::shared_ptr<Activation> &act);
  void finish(const std::shared_ptr<Activation> &act, const std::string &status, const json &result);
  // A compute instance ended without a result (crash, timeout, exception): frees its grants, the
  // memory it invoked and its token at once, and notifies the activation's running instances.
  void instance_failed(const std::shared_ptr<Activation> &act, const std::string &aid, const ComputeOutcome &o);

  struct HostState {
    std::shared_ptr<HostAgent> agent;
    double cpu_free = 0;
    uint64_t pool_used = 0;
    bool was_alive = true;  // as the host watcher last saw it
  };
  // Every half second: a host whose heartbeats stopped takes its memory elements with it. The
  // compute instances still running that reach one of them (by manifest or by runtime invoke) are
  // told at once, as a peer failure of type host_lost, instead of finding out at their next
  // operation.
  void watch_hosts();
  void host_lost(int host);
  std::thread watcher_;
  bool stopping_ = false;  // under mu_
  std::condition_variable stop_cv_;
  // Placement. A memory element goes where the most pool is free (preferring `near`); a compute
  // element next to the memory it reaches when that host has cpus, else where most cpu is free.
  // Both count against the namespace's quota of elements and bytes.
  int place_memory(const std::string &ns, uint64_t size, int near, std::string *why);
  void unplace_memory(const std::string &ns, int host, uint64_t size);
  int place_compute(double cpu, int near);
  // The transport between a memory element and a client: shm on one host, verbs where both hosts
  // have RDMA, tcp otherwise.
  std::string transport_between(int memory_host, int client_host);
  // Takes cpu on a host, waiting while it is busy.
  void acquire_cpu(int host, double cpu);
  void release_cpu(int host, double cpu);
  std::shared_ptr<HostAgent> host(int i);

  Store &store_;
  std::string runtime_url_;
  LimitRanges limits_;
  Quotas quotas_;
  struct Usage {
    int64_t elements = 0, activations = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, Usage> usage_;  // per namespace, under mu_
  std::unique_ptr<httplib::ThreadPool> instance_pool_;
  Metrics *metrics_ = nullptr;
  std::mutex mu_;
  std::condition_variable cpu_cv_;
  std::vector<HostState> hosts_;
  std::map<std::string, std::shared_ptr<Activation>> running_;
  struct Caller {
    std::shared_ptr<Activation> act;
    std::string aid;
    int host = 0;
  };
  std::map<std::string, Caller> tokens_;  // runtime token -> the compute instance holding it
  // The running compute instance a runtime request comes from; false (reply filled) if none.
  bool find_caller(const std::string &token, const std::string &aid, Caller *out, json *reply);
  uint64_t counter_ = 0;
};

}  // namespace scad
