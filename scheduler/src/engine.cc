#include "engine.h"

#include <httplib.h>

#include <latch>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "flags.h"
#include "safe_json.h"

namespace scad {

namespace {
int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
int status_code(const std::string &status) {
  if (status == "success") return 0;
  if (status == "application error") return 1;
  if (status == "action developer error") return 2;
  return 3;  // whisk internal error
}
}  // namespace

struct Activation;
static std::string code_key(const std::shared_ptr<Activation> &act, const char *kind);

struct Activation {
  std::string id, ns, name, kind;  // kind: app | action
  json doc;                         // the app or action document
  json params;
  Manifest manifest;
  std::string code_key;             // "ns/kind/name/version": the agents keep one copy per version
  json code_files;
  int64_t requested_ms = 0;
  json record;
  std::vector<std::string> logs;
  struct Placed {
    std::string id;
    int host;
    uint64_t size;
  };
  std::map<std::string, Placed> memory;            // manifest name -> element, alive during the activation
  std::map<std::string, Placed> runtime_elements;  // aid/name -> element (action.runtime.invoke)
  std::vector<std::string> tokens;
  bool done = false;
  int64_t first_start_ms = 0, init_ms = 0;
  std::map<std::string, int> starts;  // warm / prewarmed / cold: how its compute elements started
  struct Instance {  // a compute instance while it runs
    std::string element;
    int instance = 0, host = 0;
    std::string token;
    std::vector<std::string> memory;                     // manifest names of the memory it reaches
    std::vector<std::pair<int, std::string>> grants;     // (memory host, grant id)
  };
  std::map<std::string, Instance> instances;           // aid -> instance
  bool failed = false;                                 // an instance failed: start no more
  json wiring = json::object();       // "instance:durl" -> host it ran on (durl's impl: shm, verbs or tcp)
  std::mutex mu;
  std::condition_variable cv;
};

// "ns/kind/name/VERSION-HASH": the agents keep one copy of each; versions never repeat, and the
// hash of the content makes a key that names other files impossible even if they did.
static std::string code_key(const std::shared_ptr<Activation> &act, const char *kind) {
  std::string hash = get_string(act->doc, "code_hash").value_or("");
  if (hash.empty())  // stored before documents carried their hash
    hash = sha256_hex(act->kind == "app" ? dump_json(act->doc["files"]) : dump_json(act->doc["exec"]["code"]));
  return act->ns + "/" + kind + "/" + act->name + "/" + std::to_string(get_int(act->doc, "version").value_or(1)) +
         "-" + hash.substr(0, 16);
}

Engine::Engine(Store &store, std::string runtime_url, LimitRanges limits, Quotas quotas)
    : store_(store), runtime_url_(std::move(runtime_url)), limits_(limits), quotas_(quotas),
      instance_pool_(std::make_unique<httplib::ThreadPool>(kInstanceThreads)) {
  watcher_ = std::thread([this] { watch_hosts(); });
}

Engine::~Engine() {
  {
    // Let running activations end (each is bounded by its elements' timeouts).
    std::unique_lock<std::mutex> lk(mu_);
    cpu_cv_.wait(lk, [&] { return running_.empty(); });
    stopping_ = true;
  }
  stop_cv_.notify_all();
  watcher_.join();
  instance_pool_->shutdown();
}

void Engine::watch_hosts() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_cv_.wait_for(lk, std::chrono::milliseconds(500), [&] { return stopping_; })) {
    std::vector<int> lost;
    for (size_t i = 0; i < hosts_.size(); i++) {
      bool alive = hosts_[i].agent->alive();
      if (hosts_[i].was_alive && !alive) lost.push_back(int(i));
      hosts_[i].was_alive = alive;
    }
    if (lost.empty()) continue;
    lk.unlock();
    for (int h : lost) {
      try {
        host_lost(h);
      } catch (const std::exception &e) {  // a notice that could not be built or sent: the next host
        fprintf(stderr, "scad-server: telling instances about lost host %d failed: %s\n", h, e.what());
      }
    }
    lk.lock();
  }
}

void Engine::host_lost(int h) {
  std::string host_id = host(h)->id();
  std::vector<std::shared_ptr<Activation>> acts;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto &[id, act] : running_) acts.push_back(act);
  }
  for (auto &act : acts) {
    struct Notice {
      int host;
      std::string aid;
      json body;
    };
    std::vector<Notice> notices;
    {
      std::lock_guard<std::mutex> lk(act->mu);
      std::vector<std::string> gone;  // manifest names of memory on the lost host
      for (auto &[name, p] : act->memory)
        if (p.host == h) gone.push_back(name);
      for (auto &[aid, inst] : act->instances) {
        if (inst.host == h) continue;  // gone with the host
        json shared = json::array();
        for (auto &m : inst.memory)
          if (std::find(gone.begin(), gone.end(), m) != gone.end()) shared.push_back(m);
        for (auto &[key, p] : act->runtime_elements)  // "aid/name": what this instance invoked
          if (p.host == h && key.rfind(aid + "/", 0) == 0) shared.push_back(key.substr(aid.size() + 1));
        if (shared.empty()) continue;
        std::string reason = "host '" + host_id + "' stopped answering (no heartbeat): memory element" +
                             (shared.size() > 1 ? "s " : " ");
        for (size_t i = 0; i < shared.size(); i++) reason += (i ? ", '" : "'") + shared[i].get<std::string>() + "'";
        reason += shared.size() > 1 ? " are gone with it" : " is gone with it";
        notices.push_back({inst.host, aid, json{{"aid", nullptr}, {"element", shared[0]}, {"instance", nullptr},
                                       {"status", "lost"}, {"type", "host_lost"}, {"host", host_id},
                                       {"reason", reason}, {"shared", shared}}});
      }
    }
    for (auto &n : notices) host(n.host)->notify(n.aid, n.body);  // outside act->mu: it is an HTTP call
  }
}

void Engine::add_host(std::shared_ptr<HostAgent> h) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto &hs : hosts_)
    if (hs.agent->id() == h->id()) {  // a re-registering agent: new address, same bookkeeping
      hs.agent = std::move(h);
      return;
    }
  HostState hs;
  hs.cpu_free = h->cpus();
  hs.agent = std::move(h);
  hosts_.push_back(std::move(hs));
}

Capacity Engine::capacity() {
  std::lock_guard<std::mutex> lk(mu_);
  Capacity c;
  for (auto &h : hosts_) {
    c.memory_pool = std::max(c.memory_pool, h.agent->pool_bytes());
    c.cpus = std::max(c.cpus, h.agent->cpus());
  }
  return c;
}

std::shared_ptr<HostAgent> Engine::host(int i) {
  std::lock_guard<std::mutex> lk(mu_);
  return hosts_.at(size_t(i)).agent;
}

int Engine::place_memory(const std::string &ns, uint64_t size, int near, std::string *why) {
  std::lock_guard<std::mutex> lk(mu_);
  Usage &u = usage_[ns];
  uint64_t counted = std::max(size, kElementMinBytes);
  if (u.elements >= quotas_.elements || counted > quotas_.element_bytes - std::min(u.bytes, quotas_.element_bytes)) {
    *why = "namespace '" + ns + "' is at its quota of memory elements (" + std::to_string(u.elements) + " of " +
           std::to_string(quotas_.elements) + " elements, " + std::to_string(u.bytes) + " of " +
           std::to_string(quotas_.element_bytes) + " bytes)";
    return -1;
  }
  auto free_of = [&](const HostState &h) {
    return h.agent->alive() && h.agent->pool_bytes() >= h.pool_used ? h.agent->pool_bytes() - h.pool_used : 0;
  };
  int best = -1;
  if (near >= 0 && free_of(hosts_[size_t(near)]) >= size) best = near;  // one host: the transport is shm
  for (size_t i = 0; best < 0 && i < hosts_.size(); i++)
    if (free_of(hosts_[i]) >= size && (best < 0 || free_of(hosts_[i]) > free_of(hosts_[size_t(best)]))) best = int(i);
  if (best < 0) {
    uint64_t most = 0;
    for (auto &h : hosts_) most = std::max(most, free_of(h));
    *why = "no host has " + std::to_string(size) + " bytes free in its memory pool (the most free is " +
           std::to_string(most) + ")";
    return -1;
  }
  hosts_[size_t(best)].pool_used += size;
  u.elements++;
  u.bytes += counted;
  return best;
}

void Engine::unplace_memory(const std::string &ns, int host, uint64_t size) {
  std::lock_guard<std::mutex> lk(mu_);
  hosts_[size_t(host)].pool_used -= std::min(size, hosts_[size_t(host)].pool_used);
  Usage &u = usage_[ns];
  u.elements -= std::min<int64_t>(u.elements, 1);
  u.bytes -= std::min(u.bytes, std::max(size, kElementMinBytes));
}

int Engine::place_compute(double cpu, int near) {
  std::lock_guard<std::mutex> lk(mu_);
  if (near >= 0 && hosts_[size_t(near)].agent->alive() && hosts_[size_t(near)].agent->cpus() >= std::min(cpu, 1.0))
    return near;  // beside its memory: shm
  int best = -1;
  for (size_t i = 0; i < hosts_.size(); i++) {
    const HostState &h = hosts_[i];
    if (!h.agent->alive() || h.agent->cpus() <= 0) continue;
    if (best < 0 || h.cpu_free > hosts_[size_t(best)].cpu_free) best = int(i);
  }
  return best;
}

std::string Engine::transport_between(int memory_host, int client_host) {
  if (memory_host == client_host) return "shm";
  auto a = host(memory_host), b = host(client_host);
  return a->rdma() && b->rdma() ? "verbs" : "tcp";
}

void Engine::acquire_cpu(int host, double cpu) {
  std::unique_lock<std::mutex> lk(mu_);
  HostState &h = hosts_[size_t(host)];
  // An element asking for more than the host has still runs, alone (validation refuses such
  // manifests; actions ask for 1).
  cpu = std::min(cpu, h.agent->cpus());
  cpu_cv_.wait(lk, [&] { return h.cpu_free >= cpu - 1e-9; });
  h.cpu_free -= cpu;
}

void Engine::release_cpu(int host, double cpu) {
  std::lock_guard<std::mutex> lk(mu_);
  HostState &h = hosts_[size_t(host)];
  h.cpu_free += std::min(cpu, h.agent->cpus());
  cpu_cv_.notify_all();
}

std::string Engine::start(std::shared_ptr<Activation> act, int64_t wait_ms, json *record, bool *finished) {
  act->id = random_hex(16);
  act->requested_ms = now_ms();
  act->record = {{"activationId", act->id}, {"namespace", act->ns}, {"name", act->name}, {"subject", act->ns},
                 {"version", std::to_string(act->doc.value("version", int64_t(1)))}, {"start", act->requested_ms},
                 {"end", 0}, {"duration", 0}, {"response", {{"status", "running"}, {"success", false}}},
                 {"logs", json::array()},
                 {"annotations", json::array({{{"key", "kind"}, {"value", act->kind == "app" ? "scad:app" : "python:3"}},
                                              {{"key", "path"}, {"value", act->ns + "/" + act->name}}})}};
  {
    std::lock_guard<std::mutex> lk(mu_);
    Usage &u = usage_[act->ns];
    if (u.activations >= quotas_.activations) {
      *finished = false;
      *record = {{"error", "namespace '" + act->ns + "' has its quota of " + std::to_string(quotas_.activations) +
                               " activations in flight; try again when some have finished"}};
      return "";
    }
    u.activations++;
    running_[act->id] = act;
  }
  if (metrics_) metrics_->activation_started();
  store_.put_activation(act->record);
  std::thread([this, act] {
    run(act);
    std::lock_guard<std::mutex> lk(mu_);
    running_.erase(act->id);
    cpu_cv_.notify_all();
  }).detach();
  *finished = false;
  if (wait_ms > 0) {
    std::unique_lock<std::mutex> lk(act->mu);
    if (act->cv.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return act->done; })) {
      *finished = true;
      *record = act->record;
    }
  }
  return act->id;
}

std::string Engine::invoke_app(const std::string &ns, const json &app, const json &params, int64_t wait_ms,
                               json *record, bool *finished) {
  auto act = std::make_shared<Activation>();
  act->ns = ns;
  act->name = app["name"];
  act->kind = "app";
  act->doc = app;
  act->params = params.is_object() ? params : json::object();
  return start(act, wait_ms, record, finished);
}

std::string Engine::invoke_action(const std::string &ns, const json &action, const json &params, int64_t wait_ms,
                                  json *record, bool *finished) {
  auto act = std::make_shared<Activation>();
  act->ns = ns;
  act->name = action["name"];
  act->kind = "action";
  act->doc = action;
  act->params = json::object();
  for (auto &p : action.value("parameters", json::array()))
    if (auto key = get_string(p, "key")) act->params[*key] = p["value"];
  if (params.is_object()) act->params.update(params);
  return start(act, wait_ms, record, finished);
}

void Engine::finish(const std::shared_ptr<Activation> &act, const std::string &status, const json &result) {
  {
    // Before the caller can see the record: whoever it tells may invoke again at once.
    std::lock_guard<std::mutex> lk(mu_);
    usage_[act->ns].activations--;
  }
  int64_t end = now_ms();
  std::lock_guard<std::mutex> lk(act->mu);
  act->record["end"] = end;
  act->record["duration"] = end - act->record["start"].get<int64_t>();
  act->record["response"] = {{"status", status}, {"statusCode", status_code(status)}, {"success", status == "success"},
                             {"result", result}};
  act->record["logs"] = act->logs;
  if (metrics_) {
    metrics_->activation_finished(act->kind == "app" ? "app" : "action", status,
                                  double(end - act->record["start"].get<int64_t>()) / 1000);
    for (auto &[how, n] : act->starts) metrics_->instance_started(how, n);
  }
  int64_t wait = act->first_start_ms ? act->first_start_ms - act->requested_ms : 0;
  act->record["annotations"].push_back({{"key", "waitTime"}, {"value", wait}});
  act->record["annotations"].push_back({{"key", "initTime"}, {"value", act->init_ms}});
  act->record["annotations"].push_back({{"key", "starts"}, {"value", act->starts}});
  if (!act->wiring.empty()) act->record["annotations"].push_back({{"key", "wiring"}, {"value", act->wiring}});
  try {
    store_.put_activation(act->record);
  } catch (const std::exception &e) {  // the waiting caller still gets the record
    fprintf(stderr, "scad-server: cannot store activation %s: %s\n", act->id.c_str(), e.what());
  }
  act->done = true;
  act->cv.notify_all();
}

void Engine::run(const std::shared_ptr<Activation> &act) {
  std::string what;
  try {
    if (act->kind == "app") run_app(act);
    else run_action(act);
    return;
  } catch (const std::exception &e) {
    what = e.what();
  } catch (...) {
    what = "unknown exception";
  }
  fprintf(stderr, "scad-server: activation %s failed inside the scheduler: %s\n", act->id.c_str(), what.c_str());
  bool done;
  {
    std::lock_guard<std::mutex> lk(act->mu);
    done = act->done;
  }
  if (!done) {
    try {
      finish(act, "whisk internal error",
             {{"error", "the scheduler failed while running this activation: " + valid_utf8(what)}});
    } catch (...) {  // finish stores nothing it cannot dump; still, never out of the thread
    }
  }
}

void Engine::run_action(const std::shared_ptr<Activation> &act) {
  ComputeSpec spec;
  spec.aid = act->ns + "-" + act->name + "-" + act->id.substr(0, 8);
  spec.tenant = act->ns;
  spec.code = "action.py";
  spec.code_key = code_key(act, "actions");
  spec.code_files = {{"action.py", act->doc["exec"]["code"]}};
  spec.main = act->doc["exec"].value("main", "main");
  spec.args = act->params;
  ActionLimits limits = effective_limits(act->doc, limits_);
  spec.timeout_ms = limits.timeout_ms;
  spec.memory = limits.memory_bytes;
  spec.log_bytes = limits.log_bytes;
  int h = place_compute(1, -1);
  if (h < 0) {
    finish(act, "whisk internal error", {{"error", "no host with cpus is available to run the action"}});
    return;
  }
  acquire_cpu(h, 1);
  act->first_start_ms = now_ms();
  ComputeOutcome o = host(h)->run_compute(spec);
  release_cpu(h, 1);
  act->logs = o.logs;
  act->init_ms = o.init_ms;
  if (!o.start.empty()) act->starts[o.start]++;
  finish(act, o.status, o.ok ? (o.result.is_object() ? o.result : json{{"result", o.result}}) : json{{"error", o.error}});
}

void Engine::run_app(const std::shared_ptr<Activation> &act) {
  std::set<std::string> files;
  for (auto &[f, c] : act->doc["files"].items()) files.insert(f);
  auto problems = validate_manifest(act->doc["manifest"], files, Capacity{}, &act->manifest);
  if (!problems.empty()) {
    finish(act, "whisk internal error", {{"error", "the stored manifest is no longer valid: " + problems[0]}});
    return;
  }
  act->code_key = code_key(act, "apps");
  act->code_files = act->doc["files"];
  const Manifest &m = act->manifest;

  // Memory elements live as long as the activation (or until released).
  auto cleanup = [&] {
    std::vector<Activation::Placed> placed;
    {
      std::lock_guard<std::mutex> lk(act->mu);
      for (auto &[n, p] : act->memory) placed.push_back(p);
      for (auto &[k, p] : act->runtime_elements) placed.push_back(p);
      act->memory.clear();
      act->runtime_elements.clear();
    }
    for (auto &p : placed) {
      host(p.host)->remove_element(p.id);
      unplace_memory(act->ns, p.host, p.size);
    }
    std::lock_guard<std::mutex> lk(mu_);
    for (auto &t : act->tokens) tokens_.erase(t);
  };
  for (auto &[name, d] : m.elements) {
    if (d.kind != "memory") continue;
    std::string id = act->id + "-" + name, why;
    int h = place_memory(act->ns, d.size, -1, &why);
    if (h >= 0 && host(h)->create_element(id, d.size, &why)) {
      unplace_memory(act->ns, h, d.size);
      h = -1;
    }
    if (h < 0) {
      cleanup();
      finish(act, "whisk internal error", {{"error", "cannot place memory element '" + name + "': " + why}});
      return;
    }
    std::lock_guard<std::mutex> lk(act->mu);
    act->memory[name] = {id, h, d.size};
  }

  // Waves: an element starts once all its parents are done; its instances run side by side.
  std::map<std::string, json> results;  // element -> list of its instances' results
  std::map<std::string, int> level;
  int max_level = 0;
  for (auto &n : m.order) {
    int l = 0;
    for (auto &p : m.parents.count(n) ? m.parents.at(n) : std::vector<std::string>{}) l = std::max(l, level[p] + 1);
    level[n] = l;
    max_level = std::max(max_level, l);
  }
  json failure;
  std::string failure_status;
  for (int l = 0; l <= max_level && failure.is_null(); l++) {
    struct Run {
      std::string element;
      int instance;
      ComputeOutcome outcome;
    };
    std::vector<Run> runs;
    for (auto &n : m.order)
      if (level[n] == l)
        for (int i = 0; i < m.elements.at(n).parallelism; i++) runs.push_back({n, i, {}});
    // The wave's instances run on the shared instance pool (bounded threads); this activation's
    // thread waits for all of them.
    std::latch wave_done(std::ptrdiff_t(runs.size()));
    for (auto &r : runs) {
      json parents = json::object();
      for (auto &p : m.parents.count(r.element) ? m.parents.at(r.element) : std::vector<std::string>{})
        parents[p] = results.at(p);
      instance_pool_->enqueue([this, &act, &wave_done, rp = &r, parents = std::move(parents)] {
        try {
          rp->outcome = run_instance(act, rp->element, rp->instance, parents);
        } catch (const std::exception &e) {
          rp->outcome = ComputeOutcome{};
          rp->outcome.status = "whisk internal error";
          rp->outcome.error = {{"type", "InternalError"}, {"message", "the scheduler failed: " + valid_utf8(e.what())}};
        }
        wave_done.count_down();
      });
    }
    wave_done.wait();
    for (auto &r : runs) {
      std::string tag = r.element + "#" + std::to_string(r.instance);
      {
        std::lock_guard<std::mutex> lk(act->mu);
        if (!r.outcome.start.empty()) act->starts[r.outcome.start]++;
        // "2024-01-01T00:00:00.000Z stderr: ..." gets the instance after its time stamp; a line
        // from an agent that does not start with one gets it in front.
        for (auto &line : r.outcome.logs)
          act->logs.push_back(line.size() >= 25 && line[24] == ' ' ? line.substr(0, 25) + tag + " " + line.substr(25)
                                                                  : tag + " " + line);
        act->init_ms = std::max(act->init_ms, r.outcome.init_ms);
      }
      if (!r.outcome.ok && r.outcome.status != "skipped" && failure.is_null()) {
        failure = {{"error", "element '" + tag + "' failed: " + r.outcome.error.value("message", std::string("?"))},
                   {"element", r.element}, {"instance", r.instance}, {"cause", r.outcome.error}};
        failure_status = r.outcome.status;
      }
      if (!results.count(r.element)) results[r.element] = json::array();
    }
    for (auto &r : runs)
      if (r.outcome.ok) results[r.element].push_back(r.outcome.result);
  }
  cleanup();
  if (!failure.is_null()) {
    finish(act, failure_status, failure);
    return;
  }
  // The invocation's result is the sinks' result (one sink of one instance: its return value).
  auto sink_result = [&](const std::string &s) {
    return m.elements.at(s).parallelism == 1 ? results[s][0] : results[s];
  };
  json result;
  if (m.sinks.size() == 1) {
    result = sink_result(m.sinks[0]);
  } else {
    result = json::object();
    for (auto &s : m.sinks) result[s] = sink_result(s);
  }
  if (!result.is_object()) result = json{{"result", result}};  // OpenWhisk results are objects
  finish(act, "success", result);
}

ComputeOutcome Engine::run_instance(const std::shared_ptr<Activation> &act, const std::string &element, int instance,
                                    const json &parents) {
  const Manifest &m = act->manifest;
  const ElementDecl &d = m.elements.at(element);
  ComputeOutcome outcome;
  auto fail = [&](const char *status, const char *type, const std::string &message) {
    outcome.status = status;
    outcome.error = {{"type", type}, {"message", message}};
    return outcome;
  };
  ComputeSpec spec;
  spec.aid = act->id + "-" + element + "-" + std::to_string(instance);
  spec.tenant = act->ns;
  spec.code = d.code;
  spec.code_key = act->code_key;
  spec.code_files = act->code_files;
  spec.main = d.main;
  spec.timeout_ms = d.timeout_ms;
  spec.cpu = d.cpu;
  spec.memory = d.memory;
  spec.log_bytes = uint64_t(limits_.logs_mb.dflt) << 20;
  spec.args = act->params;
  spec.args["_instance"] = instance;
  spec.args["_parallelism"] = d.parallelism;
  for (auto &[p, r] : parents.items()) spec.args[p] = r;
  // Next to the memory it reaches, when that host has cpus (then the transport is shm).
  int near = -1;
  if (!d.transports.empty()) {
    std::lock_guard<std::mutex> lk(act->mu);
    near = act->memory.at(d.transports.begin()->second.element).host;
  }
  int h = place_compute(d.cpu, near);
  if (h < 0) return fail("whisk internal error", "PlacementError", "no host with cpus is available");
  if (!d.network) {
    // Without network only the memory pool's socket is in reach: every element it uses must be on
    // the host it runs on (then its transports are shm).
    std::lock_guard<std::mutex> lk(act->mu);
    for (auto &[tname, t] : d.transports)
      if (act->memory.at(t.element).host != h)
        return fail("whisk internal error", "PlacementError",
                    "element '" + element + "' has no network (network: false) and memory element '" + t.element +
                        "' is on another host than the one with cpus for it");
  }
  Activation::Instance me{element, instance, h, "", {}, {}};
  for (auto &[tname, t] : d.transports) {
    TransportGrant g;
    std::string why;
    Activation::Placed mem;
    {
      std::lock_guard<std::mutex> lk(act->mu);
      mem = act->memory.at(t.element);
    }
    if (host(mem.host)->grant(mem.id, spec.aid, t.rights, tname, transport_between(mem.host, h), &g, &why))
      return fail("whisk internal error", "GrantError", why);
    spec.transports.push_back(g);
    me.memory.push_back(t.element);
    me.grants.emplace_back(mem.host, g.grant_id);
  }
  spec.network = d.network;
  if (d.network) spec.runtime_url = runtime_url_;  // out of reach without network
  spec.runtime_token = me.token = random_hex(24);
  {
    std::lock_guard<std::mutex> lk(mu_);
    tokens_[spec.runtime_token] = {act, spec.aid, h};
  }
  {
    std::lock_guard<std::mutex> lk(act->mu);
    act->tokens.push_back(spec.runtime_token);
  }
  acquire_cpu(h, d.cpu);
  // Given back however this function ends.
  struct CpuHold {
    Engine *e;
    int host;
    double cpu;
    ~CpuHold() { e->release_cpu(host, cpu); }
  } hold{this, h, d.cpu};
  std::string host_id = host(h)->id();  // engine lock before, never inside, the activation's lock
  {
    std::lock_guard<std::mutex> lk(act->mu);
    if (act->failed)  // a peer failed while this one waited: the activation fails anyway
      return fail("skipped", "Skipped", "not started: a peer instance failed first");
    act->instances[spec.aid] = std::move(me);
    if (!act->first_start_ms) act->first_start_ms = now_ms();
    for (auto &tg : spec.transports) act->wiring[spec.aid + ":" + tg.durl] = host_id;
  }
  outcome = host(h)->run_compute(spec);
  if (!outcome.ok) instance_failed(act, spec.aid, outcome);
  {
    // The instance is over: its runtime token with it (what it invoked lives on until the
    // activation ends or it is released, but nothing may create more in its name).
    std::lock_guard<std::mutex> lk(mu_);
    tokens_.erase(spec.runtime_token);
  }
  std::lock_guard<std::mutex> lk(act->mu);
  act->instances.erase(spec.aid);
  return outcome;
}

void Engine::instance_failed(const std::shared_ptr<Activation> &act, const std::string &aid, const ComputeOutcome &o) {
  Activation::Instance me;
  std::vector<std::pair<std::string, Activation::Instance>> peers;
  std::vector<Activation::Placed> invoked;
  {
    std::lock_guard<std::mutex> lk(act->mu);
    auto it = act->instances.find(aid);
    if (it == act->instances.end()) return;
    me = it->second;
    act->failed = true;  // no instance starts after this one: every one that runs gets the notice
    for (auto &[peer_aid, peer] : act->instances)
      if (peer_aid != aid) peers.emplace_back(peer_aid, peer);
    for (auto r = act->runtime_elements.begin(); r != act->runtime_elements.end();)
      if (r->first.rfind(aid + "/", 0) == 0) {
        invoked.push_back(r->second);
        r = act->runtime_elements.erase(r);
      } else {
        ++r;
      }
  }
  // Free what it held at once rather than when the activation ends: its grants (connections and
  // remote keys), the memory it invoked at run time, its runtime token.
  std::string why;
  for (auto &[h, grant] : me.grants)
    host(h)->revoke(grant, &why);  // an element already gone took its grants along
  for (auto &p : invoked) {
    host(p.host)->remove_element(p.id);
    unplace_memory(act->ns, p.host, p.size);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    tokens_.erase(me.token);
  }
  // Tell the instances still running: the activation is going to fail, and those that share
  // memory with it may be waiting for something it will never write.
  for (auto &[peer_aid, peer] : peers) {
    json shared = json::array();
    for (auto &m : me.memory)
      if (std::find(peer.memory.begin(), peer.memory.end(), m) != peer.memory.end()) shared.push_back(m);
    json notice = {{"aid", aid}, {"element", me.element}, {"instance", me.instance}, {"status", o.status},
                   {"reason", o.error.value("message", o.status)}, {"type", o.error.value("type", "")},
                   {"shared", shared}};
    host(peer.host)->notify(peer_aid, notice);  // the agent keeps it if the instance has not started yet
  }
}

bool Engine::find_caller(const std::string &token, const std::string &aid, Caller *out, json *reply) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = tokens_.find(token);
  if (it == tokens_.end() || it->second.aid != aid) {
    *reply = {{"error", "unknown or expired token for action '" + aid + "'"}};
    return false;
  }
  *out = it->second;
  return true;
}

int Engine::runtime_invoke(const std::string &token, const std::string &aid, const json &body, json *reply) {
  Caller c;
  if (!find_caller(token, aid, &c, reply)) return 401;
  if (!body.is_object() || !body.contains("template") || !body["template"].is_string() || !body.contains("name") ||
      !body["name"].is_string()) {
    *reply = {{"error", "the body must be {\"template\": NAME, \"name\": TRANSPORT, \"props\": {...}}"}};
    return 400;
  }
  std::string tmpl = body["template"], name = body["name"];
  const Manifest &m = c.act->manifest;
  auto it = m.elements.find(tmpl);
  if (c.act->kind != "app" || it == m.elements.end() || it->second.kind != "memory") {
    *reply = {{"error", "template '" + tmpl + "' is not a memory element of application '" + c.act->name + "'"}};
    return 409;
  }
  uint64_t size = it->second.size;
  json props = body.value("props", json::object());
  if (props.contains("size")) {
    const json &s = props["size"];
    if (!((s.is_number_unsigned() && (size = s.get<uint64_t>()) > 0) ||
          (s.is_string() && parse_byte_size(s.get<std::string>(), &size) && size > 0))) {
      *reply = {{"error", "props.size must be a positive number of bytes or a size such as 1GiB"}};
      return 400;
    }
  }
  std::string key = aid + "/" + name;
  std::string id = c.act->id + "-rt" + std::to_string(++counter_) + "-" + name, why;
  {
    std::lock_guard<std::mutex> lk(c.act->mu);
    if (c.act->runtime_elements.count(key)) {
      *reply = {{"error", "this action already has an element named '" + name + "'"}};
      return 409;
    }
  }
  int h = place_memory(c.act->ns, size, c.host, &why);
  if (h >= 0 && host(h)->create_element(id, size, &why)) {
    unplace_memory(c.act->ns, h, size);
    h = -1;
  }
  if (h < 0) {
    *reply = {{"error", "cannot place a memory element of " + std::to_string(size) + " bytes: " + why}};
    return 409;
  }
  TransportGrant g;
  if (host(h)->grant(id, aid, 3, name, transport_between(h, c.host), &g, &why)) {
    host(h)->remove_element(id);
    unplace_memory(c.act->ns, h, size);
    *reply = {{"error", why}};
    return 500;
  }
  {
    std::lock_guard<std::mutex> lk(c.act->mu);
    c.act->runtime_elements[key] = {id, h, size};
  }
  *reply = {{"name", name}, {"durl", g.durl}, {"config", g.config}};
  return 201;
}

int Engine::runtime_release(const std::string &token, const std::string &aid, const std::string &name, json *reply) {
  Caller c;
  if (!find_caller(token, aid, &c, reply)) return 401;
  Activation::Placed p;
  {
    std::lock_guard<std::mutex> lk(c.act->mu);
    auto it = c.act->runtime_elements.find(aid + "/" + name);
    if (it == c.act->runtime_elements.end()) {
      *reply = {{"error", "this action has no element named '" + name + "'"}};
      return 404;
    }
    p = it->second;
    c.act->runtime_elements.erase(it);
  }
  host(p.host)->remove_element(p.id);  // revokes the grant: the caller's connection closes at once
  unplace_memory(c.act->ns, p.host, p.size);
  return 204;
}

void Engine::forget_code(const std::string &ns, const std::string &kind, const std::string &name) {
  std::vector<std::shared_ptr<HostAgent>> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto &h : hosts_) all.push_back(h.agent);
  }
  for (auto &h : all) h->remove_code(ns + "/" + kind + "/" + name);
}

json Engine::elements(const std::string &ns) {
  json out = json::array();
  std::lock_guard<std::mutex> lk(mu_);
  for (auto &[id, act] : running_) {
    if (act->ns != ns) continue;
    std::lock_guard<std::mutex> alk(act->mu);
    for (auto &[name, p] : act->memory)
      out.push_back({{"id", p.id}, {"name", name}, {"kind", "memory"}, {"app", act->name}, {"activation", act->id},
                     {"host", hosts_[size_t(p.host)].agent->id()}, {"size", p.size}});
    for (auto &[k, p] : act->runtime_elements)
      out.push_back({{"id", p.id}, {"name", k.substr(k.find('/') + 1)}, {"kind", "memory"}, {"app", act->name},
                     {"activation", act->id}, {"host", hosts_[size_t(p.host)].agent->id()}, {"size", p.size},
                     {"invoked_by", k.substr(0, k.find('/'))}});
  }
  return out;
}

json Engine::host_info() {
  std::lock_guard<std::mutex> lk(mu_);
  json out = json::array();
  for (auto &h : hosts_)
    out.push_back({{"id", h.agent->id()}, {"cpus", h.agent->cpus()}, {"cpus_free", h.cpu_free},
                   {"memory_pool", h.agent->pool_bytes()}, {"memory_pool_used", h.pool_used},
                   {"rdma", h.agent->rdma()}, {"state", h.agent->alive() ? "up" : "down"},
                   {"isolation", h.agent->isolation()}});
  return out;
}

}  // namespace scad
