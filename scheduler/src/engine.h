// Runs activations: an application's DAG (memory elements created, compute elements started in
// dependency order with their fan-out, parents' results joined into children, sinks' results
// returned, everything cleaned up) or a single OpenWhisk action. Also answers the runtime endpoint
// that running actions call to grow and shrink their memory.
#pragma once
#include <atomic>
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
#include "engine_error.h"
#include "metrics.h"
#include "manifest.h"
#include "quotas.h"
#include "store.h"

namespace httplib {
class ThreadPool;
}

namespace scad {

struct Activation;

// A memory element where it was placed: its id on the host, the host, its bytes.
struct PlacedMemory {
  std::string id;
  int host = -1;
  uint64_t size = 0;
};

// Compute instances of applications run on a pool of this many threads, shared by every activation
// (an instance mostly waits: for cpu, for its process); more wait their turn in the queue.
constexpr size_t kInstanceThreads = 64;

// What an action's invocation carries besides its parameters (OpenWhisk's).
struct InvokeContext {
  std::string api_key;  // the caller's "uuid:key": for actions annotated provide-api-key only; never stored
  std::string txid;     // the request's transaction id (__OW_TRANSACTION_ID)
  std::string cause;    // the activation (a sequence's, a trigger's) that caused this one
  bool in_sequence = false;  // a sequence's component (annotated causedBy: sequence)
};

class Engine {
 public:
  Engine(Store &store, std::string runtime_url, LimitRanges limits = {}, Quotas quotas = {});
  ~Engine();

  // Hosts elements are placed on: the embedded agent and remote agents as they register.
  void add_host(std::shared_ptr<HostAgent> host);
  // The largest pool and cpus of any host (for validating manifests).
  Capacity capacity();

  // An activation started: its id, and when it finished within the wait, its record.
  struct Started {
    std::string id;
    bool finished = false;
    json record;
  };
  // Starts an activation, and waits up to wait_ms for it to finish. kBusy when the namespace has its
  // quota of activations in flight.
  EngineError invoke_app(const std::string &ns, const json &app, const json &params, int64_t wait_ms, Started *out);
  using InvokeContext = scad::InvokeContext;
  EngineError invoke_action(const std::string &ns, const json &action, const json &params, int64_t wait_ms,
                            Started *out, const InvokeContext &ctx = {});
  // Where actions reach the REST API (__OW_API_HOST); set before the first invoke.
  void set_api_host(std::string url) { api_host_ = std::move(url); }
  const Quotas &quotas() const { return quotas_; }

  // The runtime endpoint (docs/runtime-endpoint.md): a running instance, by its token, creates a
  // memory element of its activation (*reply: the new transport's name, durl and configuration)
  // and releases one.
  EngineError runtime_invoke(const std::string &token, const std::string &aid, const json &body, json *reply);
  EngineError runtime_release(const std::string &token, const std::string &aid, const std::string &name);

  // A deleted action or application: every host removes the code it kept of it.
  void forget_code(const std::string &ns, const std::string &kind, const std::string &name);

  json elements(const std::string &ns);
  json host_info();
  // Where activations and starts are counted (GET /metrics); set before the first invoke.
  void set_metrics(Metrics *m) { metrics_ = m; }

 private:
  EngineError start(std::shared_ptr<Activation> act, int64_t wait_ms, Started *out);
  // The body of an activation's thread: runs it, and whatever goes wrong inside becomes a
  // "whisk internal error" record (never an exception leaving the thread).
  void run(const std::shared_ptr<Activation> &act);
  // An application: its memory created, its compute elements run in waves (an element once all its
  // parents are done, its instances side by side), its memory released, its result the sinks'.
  void run_app(const std::shared_ptr<Activation> &act);
  bool create_app_memory(const std::shared_ptr<Activation> &act, std::string *why);
  void release_app_memory(const std::shared_ptr<Activation> &act);  // and its runtime tokens
  struct WaveRun {
    std::string element;
    int instance;
    ComputeOutcome outcome;
  };
  struct WaveResults {
    std::map<std::string, json> results;  // element -> its instances' results
    json failure;                         // the first instance that failed, if one did
    std::string failure_status;
  };
  void run_waves(const std::shared_ptr<Activation> &act, WaveResults *out);
  void run_wave(const std::shared_ptr<Activation> &act, const std::map<std::string, json> &results,
                std::vector<WaveRun> *runs);
  void keep_instance_logs(const std::shared_ptr<Activation> &act, const std::string &tag, const ComputeOutcome &o);
  void keep_transfers(const std::shared_ptr<Activation> &act, const std::string &instance, const ComputeOutcome &o);
  void keep_transfers_locked(const std::shared_ptr<Activation> &act, const std::string &instance,
                             const ComputeOutcome &o);
  static json app_result(const Manifest &m, const std::map<std::string, json> &results);
  // One compute instance of an application, on a thread of its own.
  ComputeOutcome run_instance(const std::shared_ptr<Activation> &act, const std::string &element, int instance,
                              const json &parents);
  void run_action(const std::shared_ptr<Activation> &act);
  // A sequence (engine_sequence.cc): its components one after the other, each one's result the
  // next one's parameters.
  void run_sequence(const std::shared_ptr<Activation> &act);
  // The __OW_* variables of an action's run.
  std::map<std::string, std::string> ow_env(const std::shared_ptr<Activation> &act, int64_t deadline_ms);
  // size: the result's length as JSON text (response.size), -1 to leave it out.
  void finish(const std::shared_ptr<Activation> &act, const std::string &status, const json &result,
              int64_t size = -1);
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
  // The life of a memory element and its grants, written once (engine_elements.cc): placed and
  // created, with nothing left behind when either fails; granted to a client over the transport
  // between the two hosts; released (its grants die with it) with its bytes given back to the
  // namespace's quota.
  int create_memory(const std::string &ns, const std::string &id, uint64_t size, bool prefetch, int near, PlacedMemory *out,
                    std::string *why);
  int grant_memory(const PlacedMemory &mem, const std::string &client, unsigned rights, const std::string &trans_name,
                   int client_host, TransportGrant *out, std::string *why);
  void release_memory(const std::string &ns, const PlacedMemory &mem);
  void revoke_grants(const std::vector<std::pair<int, std::string>> &grants);  // (host, grant id)

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
  std::string api_host_;
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
  EngineError find_caller(const std::string &token, const std::string &aid, Caller *out);
  std::atomic<uint64_t> counter_{0};  // names of elements made at run time
};

}  // namespace scad
