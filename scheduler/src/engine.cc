// The engine: activations from request to record, and the DAG of an application (its waves of
// compute instances on the shared instance pool). Hosts and placement are in engine_hosts.cc, the
// runtime endpoint in engine_runtime.cc, what it keeps of an activation in engine_activation.h.
#include "engine.h"

#include <httplib.h>

#include <latch>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <thread>

#include "action_response.h"
#include "engine_activation.h"
#include "flags.h"
#include "safe_json.h"

namespace scad {

namespace {
int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace


// "ns/kind/name/VERSION-HASH": the agents keep one copy of each; versions never repeat, and the
// hash of the content makes a key that names other files impossible even if they did.
// The code key's name part: "package@name" for an action in a package (the agents take keys of
// exactly three parts, ns/kind/name).
static std::string code_name(const std::string &entity) {
  std::string n = entity;
  std::replace(n.begin(), n.end(), '/', '@');
  return n;
}

static std::string code_key(const std::shared_ptr<Activation> &act, const char *kind) {
  std::string hash = get_string(act->doc, "code_hash").value_or("");
  if (hash.empty())  // stored before documents carried their hash
    hash = sha256_hex(act->kind == "app" ? dump_json(act->doc["files"]) : dump_json(act->doc["exec"]["code"]));
  return act->ns + "/" + kind + "/" + code_name(act->entity.empty() ? act->name : act->entity) + "/" + std::to_string(get_int(act->doc, "version").value_or(1)) +
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

// The limits an action runs under, as OpenWhisk's records annotate them.
static json limits_annotation(const ActionLimits &l) {
  return {{"timeout", l.timeout_ms}, {"memory", l.memory_bytes >> 20}, {"logs", l.log_bytes >> 20}, {"concurrency", 1}};
}

EngineError Engine::start(std::shared_ptr<Activation> act, int64_t wait_ms, Started *out) {
  act->id = random_hex(16);
  act->requested_ms = now_ms();
  if (act->entity.empty()) act->entity = act->name;
  // OpenWhisk's record: a semantic version, the entity's path and kind, the limits it runs under.
  json annotations = json::array({{{"key", "path"}, {"value", act->ns + "/" + act->entity}}});
  if (act->kind == "app") {
    annotations.push_back({{"key", "kind"}, {"value", "scad:app"}});
  } else {
    const json exec = act->doc.value("exec", json::object());
    annotations.push_back({{"key", "kind"}, {"value", exec.value("kind", std::string("python:3"))}});
    annotations.push_back({{"key", "limits"}, {"value", limits_annotation(effective_limits(act->doc, limits_))}});
  }
  if (act->kind == "sequence" && act->ctx.cause.empty()) annotations.push_back({{"key", "topmost"}, {"value", true}});
  if (act->ctx.in_sequence) annotations.push_back({{"key", "causedBy"}, {"value", "sequence"}});
  act->record = {{"activationId", act->id}, {"namespace", act->ns}, {"name", act->name}, {"subject", act->ns},
                 {"version", "0.0." + std::to_string(act->doc.value("version", int64_t(1)))}, {"publish", false},
                 {"start", act->requested_ms}, {"end", 0}, {"duration", 0},
                 {"response", {{"status", "running"}, {"success", false}}}, {"logs", json::array()},
                 {"annotations", annotations}};
  if (!act->ctx.cause.empty()) act->record["cause"] = act->ctx.cause;
  {
    std::lock_guard<std::mutex> lk(mu_);
    Usage &u = usage_[act->ns];
    if (u.activations >= quotas_.activations)
      return refuse(Refusal::kBusy, "namespace '" + act->ns + "' has its quota of " +
                                        std::to_string(quotas_.activations) +
                                        " activations in flight; try again when some have finished");
    u.activations++;
    running_[act->id] = act;
  }
  if (metrics_) metrics_->activation_started();
  store_.put_activation(act->record, act->entity);
  std::thread([this, act] {
    run(act);
    std::lock_guard<std::mutex> lk(mu_);
    running_.erase(act->id);
    cpu_cv_.notify_all();
  }).detach();
  out->id = act->id;
  out->finished = false;
  if (wait_ms > 0) {
    std::unique_lock<std::mutex> lk(act->mu);
    if (act->cv.wait_for(lk, std::chrono::milliseconds(wait_ms), [&] { return act->done; })) {
      out->finished = true;
      out->record = act->record;
    }
  }
  return {};
}

EngineError Engine::invoke_app(const std::string &ns, const json &app, const json &params, int64_t wait_ms,
                               Started *out) {
  auto act = std::make_shared<Activation>();
  act->ns = ns;
  act->name = app["name"];
  act->kind = "app";
  act->doc = app;
  act->params = params.is_object() ? params : json::object();
  return start(act, wait_ms, out);
}

EngineError Engine::invoke_action(const std::string &ns, const json &action, const json &params, int64_t wait_ms,
                                  Started *out, const InvokeContext &ctx) {
  auto act = std::make_shared<Activation>();
  act->ns = ns;
  act->name = action["name"];
  act->entity = action.contains("package") ? action["package"].get<std::string>() + "/" + act->name : act->name;
  const json exec = action.value("exec", json::object());
  act->kind = exec.value("kind", std::string()) == "sequence" ? "sequence" : "action";
  act->doc = action;
  act->ctx = ctx;
  // OpenWhisk's order: the package's parameters, the action's over them, the invocation's over both.
  json package = json::object();
  if (action.contains("package"))
    package = store_.get_doc("packages", ns, action["package"].get<std::string>()).value_or(json::object());
  act->params = json::object();
  for (const json &bound : {package.value("parameters", json::array()), action.value("parameters", json::array())})
    for (auto &p : bound.is_array() ? bound : json::array())
      if (auto key = get_string(p, "key")) act->params[*key] = p["value"];
  if (params.is_object()) act->params.update(params);
  if (params.is_array()) act->params = params;  // a sequence passing on an array result, as OpenWhisk
  return start(act, wait_ms, out);
}

void Engine::finish(const std::shared_ptr<Activation> &act, const std::string &status, const json &result,
                    int64_t size) {
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
  if (size >= 0) act->record["response"]["size"] = size;
  act->record["logs"] = act->logs;
  if (metrics_) {
    metrics_->activation_finished(act->kind == "app" ? "app" : "action", status,
                                  double(end - act->record["start"].get<int64_t>()) / 1000);
    for (auto &[how, n] : act->starts) metrics_->instance_started(how, n);
  }
  json &annotations = act->record["annotations"];
  if (act->kind != "sequence") {
    int64_t wait = act->first_start_ms ? act->first_start_ms - act->requested_ms : 0;
    annotations.push_back({{"key", "waitTime"}, {"value", wait}});
    // As OpenWhisk: initTime only when a process had to load the code (not a warm one).
    bool initialized = false;
    for (auto &[how, n] : act->starts) initialized |= how != "warm" && n > 0;
    if (initialized) annotations.push_back({{"key", "initTime"}, {"value", act->init_ms}});
    annotations.push_back({{"key", "starts"}, {"value", act->starts}});
  }
  if (act->timed_out) annotations.push_back({{"key", "timeout"}, {"value", true}});
  if (!act->wiring.empty()) annotations.push_back({{"key", "wiring"}, {"value", act->wiring}});
  // Where the time went: per instance, what each transport moved and how long it took.
  if (!act->transfers.empty()) annotations.push_back({{"key", "transfers"}, {"value", act->transfers}});
  try {
    store_.put_activation(act->record, act->entity);
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
    else if (act->kind == "sequence") run_sequence(act);
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

std::map<std::string, std::string> Engine::ow_env(const std::shared_ptr<Activation> &act, int64_t deadline_ms) {
  std::map<std::string, std::string> env = {
      {"__OW_API_HOST", api_host_},
      {"__OW_ACTIVATION_ID", act->id},
      {"__OW_DEADLINE", std::to_string(deadline_ms)},
      {"__OW_ACTION_NAME", "/" + act->ns + "/" + act->entity},
      {"__OW_ACTION_VERSION", act->record.value("version", std::string("0.0.1"))},
      {"__OW_NAMESPACE", act->ns},
      {"__OW_TRANSACTION_ID", act->ctx.txid},
  };
  // The caller's key only for an action that asks for it, as OpenWhisk (which annotates every new
  // action provide-api-key: false unless its author says otherwise).
  for (auto &a : act->doc.value("annotations", json::array()))
    if (get_string(a, "key").value_or("") == "provide-api-key" && a.contains("value") && a["value"] == true &&
        !act->ctx.api_key.empty())
      env["__OW_API_KEY"] = act->ctx.api_key;
  return env;
}

void Engine::run_action(const std::shared_ptr<Activation> &act) {
  ComputeSpec spec;
  spec.aid = act->ns + "-" + code_name(act->entity) + "-" + act->id.substr(0, 8);
  spec.tenant = act->ns;
  spec.code_key = code_key(act, "actions");
  if (act->doc["exec"].value("binary", false)) {  // a zip: the launcher unpacks it (docs/openwhisk.md)
    spec.code = "__main__.py";
    spec.code_zip = act->doc["exec"]["code"];
  } else {
    spec.code = "action.py";
    spec.code_files = {{"action.py", act->doc["exec"]["code"]}};
  }
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
  spec.env = ow_env(act, act->first_start_ms + limits.timeout_ms);
  ComputeOutcome o = host(h)->run_compute(spec);
  release_cpu(h, 1);
  if (metrics_) metrics_->transports_used(o.transports);
  act->logs = o.logs;
  act->init_ms = o.init_ms;
  if (!o.start.empty()) act->starts[o.start]++;
  keep_transfers(act, act->name, o);
  ActionResponse r = action_response(o);
  act->timed_out = r.timed_out;
  finish(act, r.status, r.result, r.size);
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
  std::string why;
  if (!create_app_memory(act, &why)) {
    release_app_memory(act);
    finish(act, "whisk internal error", {{"error", why}});
    return;
  }
  WaveResults out;
  run_waves(act, &out);
  release_app_memory(act);
  if (!out.failure.is_null()) {
    finish(act, out.failure_status, out.failure);
    return;
  }
  finish(act, "success", app_result(act->manifest, out.results));
}

bool Engine::create_app_memory(const std::shared_ptr<Activation> &act, std::string *why) {
  for (auto &[name, d] : act->manifest.elements) {
    if (d.kind != "memory") continue;
    PlacedMemory placed;
    if (create_memory(act->ns, act->id + "-" + name, d.size, d.prefetch, -1, &placed, why)) {
      *why = "cannot place memory element '" + name + "': " + *why;
      return false;
    }
    std::lock_guard<std::mutex> lk(act->mu);
    act->memory[name] = placed;
  }
  return true;
}

void Engine::release_app_memory(const std::shared_ptr<Activation> &act) {
  std::vector<PlacedMemory> placed;
  {
    std::lock_guard<std::mutex> lk(act->mu);
    for (auto &[n, p] : act->memory) placed.push_back(p);
    for (auto &[k, p] : act->runtime_elements) placed.push_back(p);
    act->memory.clear();
    act->runtime_elements.clear();
  }
  for (auto &p : placed) release_memory(act->ns, p);
  std::lock_guard<std::mutex> lk(mu_);
  for (auto &t : act->tokens) tokens_.erase(t);
}

void Engine::run_waves(const std::shared_ptr<Activation> &act, WaveResults *out) {
  // Waves: an element starts once all its parents are done; its instances run side by side.
  const Manifest &m = act->manifest;
  std::map<std::string, int> level;
  int max_level = 0;
  for (auto &n : m.order) {
    int l = 0;
    for (auto &p : m.parents.count(n) ? m.parents.at(n) : std::vector<std::string>{}) l = std::max(l, level[p] + 1);
    level[n] = l;
    max_level = std::max(max_level, l);
  }
  for (int l = 0; l <= max_level && out->failure.is_null(); l++) {
    std::vector<WaveRun> runs;
    for (auto &n : m.order)
      if (level[n] == l)
        for (int i = 0; i < m.elements.at(n).parallelism; i++) runs.push_back({n, i, {}});
    run_wave(act, out->results, &runs);
    for (auto &r : runs) {
      std::string tag = r.element + "#" + std::to_string(r.instance);
      keep_instance_logs(act, tag, r.outcome);
      if (!r.outcome.ok && r.outcome.status != "skipped" && out->failure.is_null()) {
        out->failure = {{"error", "element '" + tag + "' failed: " + r.outcome.error.value("message", std::string("?"))},
                        {"element", r.element}, {"instance", r.instance}, {"cause", r.outcome.error}};
        out->failure_status = r.outcome.status;
      }
      if (!out->results.count(r.element)) out->results[r.element] = json::array();
    }
    for (auto &r : runs)
      if (r.outcome.ok) out->results[r.element].push_back(r.outcome.result);
  }
}

void Engine::run_wave(const std::shared_ptr<Activation> &act, const std::map<std::string, json> &results,
                      std::vector<WaveRun> *runs) {
  // The wave's instances run on the shared instance pool (bounded threads); this activation's
  // thread waits for all of them.
  const Manifest &m = act->manifest;
  std::latch wave_done(std::ptrdiff_t(runs->size()));
  for (auto &r : *runs) {
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
}

void Engine::keep_instance_logs(const std::shared_ptr<Activation> &act, const std::string &tag,
                                const ComputeOutcome &o) {
  std::lock_guard<std::mutex> lk(act->mu);
  if (!o.start.empty()) act->starts[o.start]++;
  // "2024-01-01T00:00:00.000Z stderr: ..." gets the instance after its time stamp; a line from an
  // agent that does not start with one gets it in front.
  for (auto &line : o.logs)
    act->logs.push_back(line.size() >= 25 && line[24] == ' ' ? line.substr(0, 25) + tag + " " + line.substr(25)
                                                            : tag + " " + line);
  act->init_ms = std::max(act->init_ms, o.init_ms);
  keep_transfers_locked(act, tag, o);
}

void Engine::keep_transfers(const std::shared_ptr<Activation> &act, const std::string &instance,
                            const ComputeOutcome &o) {
  std::lock_guard<std::mutex> lk(act->mu);
  keep_transfers_locked(act, instance, o);
}

void Engine::keep_transfers_locked(const std::shared_ptr<Activation> &act, const std::string &instance,
                                   const ComputeOutcome &o) {
  if (o.transfers.empty()) return;
  json list = json::array();
  for (auto &t : o.transfers)
    list.push_back({{"transport", t.transport}, {"kind", t.kind}, {"read_ops", t.counts.read_ops},
                    {"write_ops", t.counts.write_ops}, {"read_bytes", t.counts.read_bytes},
                    {"write_bytes", t.counts.write_bytes}, {"errors", t.counts.errors},
                    {"seconds", double(t.counts.busy_ns) / 1e9}});
  act->transfers[instance] = std::move(list);
}

json Engine::app_result(const Manifest &m, const std::map<std::string, json> &results) {
  // The invocation's result is the sinks' result (one sink of one instance: its return value).
  auto sink_result = [&](const std::string &s) {
    return m.elements.at(s).parallelism == 1 ? results.at(s)[0] : results.at(s);
  };
  json result;
  if (m.sinks.size() == 1) {
    result = sink_result(m.sinks[0]);
  } else {
    result = json::object();
    for (auto &s : m.sinks) result[s] = sink_result(s);
  }
  if (!result.is_object()) result = json{{"result", result}};  // OpenWhisk results are objects
  return result;
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
    if (grant_memory(mem, spec.aid, t.rights, tname, h, &g, &why)) {
      revoke_grants(me.grants);  // the ones made for this instance so far
      return fail("whisk internal error", "GrantError", why);
    }
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
  spec.env = ow_env(act, now_ms() + d.timeout_ms);  // as an action's: the instance's own deadline
  spec.env.insert(d.env.begin(), d.env.end());      // the manifest's (never an __OW_ name: validated)
  outcome = host(h)->run_compute(spec);
  if (metrics_) metrics_->transports_used(outcome.transports);
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
  revoke_grants(me.grants);
  for (auto &p : invoked) release_memory(act->ns, p);
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


}  // namespace scad
