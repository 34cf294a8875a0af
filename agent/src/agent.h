// The host agent: a memory pool that hosts memory elements in this process (one libd server transport,
// serving shm on a unix socket and tcp on the host's address), and a runner that starts compute
// elements as processes of the Python launcher (`python -m scad.launcher`) with their action object
// wired to the memory elements they may reach.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "worker_pool.h"
#include "cgroup.h"
#include "sandbox.h"
#include "element_host.h"
#include "transport_usage.h"

namespace scad {

struct AgentOptions {
  std::string home;            // state directory: sockets live in home/run
  std::string host_id = "local";
  std::string tcp_host = "127.0.0.1";
  std::string python;          // the interpreter that runs compute elements
  std::string pythonpath;      // where it finds disagg and scad
  uint64_t pool_bytes = 4ull << 30;
  double cpus = 2;
  int prewarm = 2;                // started interpreters waiting for any action
  int max_warm = 16;              // idle processes kept for the action they ran
  int64_t keep_alive_ms = 60000;  // how long such a process is kept
  int64_t warm_wait_ms = 500;     // the longest a run waits for a running process of its action (worker_pool.h)
  // RDMA verbs on the memory pool: "auto" (when the host has an active device), "off", or the
  // device's keys "dev=rxe0,gid_index=1,mw=0" (then a missing device is an error at start).
  std::string verbs = "auto";
  // cgroup v2 limits for compute processes: "auto" (where the host allows, see cgroup.h) or "off".
  std::string cgroup = "auto";
  // The sandbox compute processes run in (sandbox.h): "auto" (bubblewrap where it works), "on"
  // (refuse to start without it) or "off".
  std::string sandbox = "auto";
  // Processes with network forked by a fork server with the launcher imported (zygote.h):
  // "auto" (in a sandbox) or "off" (each starts an interpreter of its own).
  std::string fork_server = "auto";
};

struct TransportGrant {
  std::string durl;    // "NAME;IMPL"
  std::string config;  // what the client's config_transport gets
  std::string grant_id;
};

struct ComputeSpec {
  std::string aid;
  std::string code;          // the user's file, relative to the code's folder
  std::string code_key;      // names one version of the code ("ns/app/version"): written once
  nlohmann::json code_files = nlohmann::json::object();  // file name -> content
  // A zip action's code (base64, with __main__.py): the launcher unpacks it under code_key in
  // place of code_files, and `code` is "__main__.py".
  std::string code_zip;
  std::string main = "main";
  nlohmann::json args = nlohmann::json::object();
  std::vector<TransportGrant> transports;
  std::string runtime_url, runtime_token;
  int64_t timeout_ms = 60000;
  double cpu = 1;                  // cores (cgroup cpu.max)
  uint64_t memory = 256ull << 20;  // bytes (cgroup memory.max)
  uint64_t log_bytes = 10ull << 20;  // output kept in the activation's logs; the rest is dropped
  std::string tenant;                // the namespace it runs for: its sandbox's uid
  bool network = true;               // false: a sandbox with a network namespace of its own
  // Environment variables for this run only (OpenWhisk's __OW_*: activation id, deadline, the API
  // key when the action asks for it): they travel with the spec on the process's private pipe,
  // never on a command line, and the launcher removes them when the run ends.
  std::map<std::string, std::string> env;
};

struct ComputeOutcome {
  bool ok = false;
  nlohmann::json result;      // main's return value
  nlohmann::json error;       // {"type", "message"} when not ok
  std::string status;         // success | application error | action developer error
  std::vector<std::string> logs;
  int64_t duration_ms = 0;
  int64_t init_ms = 0;        // loading the user's code, as the launcher measured it
  std::string start;          // warm | prewarmed | cold
  TransportUsage transports;  // what its transports moved, per kind
  std::vector<TransferRecord> transfers;  // and per transport
};

// Creates home (0700) if missing, and refuses one that is not a directory of this process's own
// uid that nobody else can write. 0 or -errno with *why.
int safe_home(const std::string &home, std::string *why);

class Agent {
 public:
  explicit Agent(AgentOptions opts);
  int start(std::string *why);
  const AgentOptions &options() const { return opts_; }

  // Memory pool. -ENOSPC with a reason when the pool cannot hold it.
  int create_element(const std::string &id, uint64_t size, bool prefetch, std::string *why);
  void remove_element(const std::string &id);
  uint64_t pool_used() { return pool_.used_bytes(); }
  // A grant on an element for one client over `impl`: "shm" (a client on this host), "verbs" (on
  // another host, both with RDMA) or "tcp". -EINVAL with a reason for an impl this pool does not serve.
  int grant(const std::string &element, const std::string &client, unsigned rights, const std::string &trans_name,
            const std::string &impl, TransportGrant *out, std::string *why);
  // Whether the pool serves RDMA verbs, and on which device ("" when it does not).
  bool rdma() const { return pool_.rdma(); }
  std::string rdma_device() { return pool_.rdma_device(); }
  // Whether compute processes run under cgroup v2 limits, and if not why ("" when they do).
  bool limits() const { return cgroups_ != nullptr; }
  const std::string &limits_off_reason() const { return cgroup_why_; }
  // Whether compute processes run sandboxed, and if not why ("" when they do).
  bool sandboxed() const { return sandbox_ != nullptr; }
  const std::string &sandbox_off_reason() const { return sandbox_why_; }

  // Ends a grant at once: its client's connections close and its remote keys die.
  int revoke(const std::string &grant_id, std::string *why);

  ComputeOutcome run_compute(const ComputeSpec &spec);
  // Removes the code kept under "ns/kind/name" (every version of it). -EINVAL for a bad prefix.
  int remove_code(const std::string &prefix);
  // Tells the running compute instance `aid` that a peer failed (docs/agent.md, "Crashes"); it
  // reads the notice through action.runtime. -ENOENT when no such instance runs here.
  int notify(const std::string &aid, const nlohmann::json &notice);

 private:
  // The folder holding a version's files, written on first use. "" and *why on failure.
  std::string materialize(const std::string &key, const nlohmann::json &files, std::string *why);
  // Where launchers outside a sandbox unpack zip actions: home/code, with the key's namespace
  // folder made (0700). "" and *why for a bad key.
  std::string unpack_root(const std::string &key, std::string *why);
  // The launcher's part of the spec: the run, and where its code goes (the code itself is added
  // once the process is known: a warm one has it).
  nlohmann::json launcher_spec(const ComputeSpec &spec, std::string *code, std::string *why);
  AgentOptions opts_;
  ElementHost pool_;
  std::shared_ptr<Cgroups> cgroups_;  // before workers_: processes end (and leave their cgroups) first
  std::string cgroup_why_;
  std::shared_ptr<const Sandbox> sandbox_;
  std::string sandbox_why_;
  std::unique_ptr<WorkerPool> workers_;
  std::mutex code_mu_;
  std::mutex run_mu_;
  std::map<std::string, Worker *> running_;  // aid -> its process, while it runs
  struct PendingNotices {
    std::chrono::steady_clock::time_point since;
    nlohmann::json notices = nlohmann::json::array();
  };
  std::map<std::string, PendingNotices> pending_notices_;  // for instances not started yet
};

}  // namespace scad
