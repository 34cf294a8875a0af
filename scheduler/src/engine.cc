#include "engine.h"

#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "core/params.h"

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
void mkdirs(const std::string &path) {
  for (size_t i = 1; i <= path.size(); i++)
    if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0700);
}
}  // namespace

struct Activation {
  std::string id, ns, name, kind;  // kind: app | action
  json doc;                         // the app or action document
  json params;
  Manifest manifest;
  std::string dir;                  // where its code files are
  int64_t requested_ms = 0;
  json record;
  std::vector<std::string> logs;
  std::map<std::string, uint64_t> memory;              // element id -> size, alive during the activation
  std::map<std::string, std::string> runtime_elements;  // aid/name -> element id (action.runtime.invoke)
  std::vector<std::string> tokens;
  bool done = false;
  int64_t first_start_ms = 0, init_ms = 0;
  std::map<std::string, int> starts;  // warm / prewarmed / cold: how its compute elements started
  std::mutex mu;
  std::condition_variable cv;
};

Engine::Engine(Store &store, Agent &agent, std::string home, std::string runtime_url)
    : store_(store), agent_(agent), home_(std::move(home)), runtime_url_(std::move(runtime_url)),
      cpu_free_(agent.options().cpus) {}

Engine::~Engine() {
  // Let running activations end (each is bounded by its elements' timeouts).
  std::unique_lock<std::mutex> lk(mu_);
  cpu_cv_.wait(lk, [&] { return running_.empty(); });
}

void Engine::acquire_cpu(double cpu) {
  std::unique_lock<std::mutex> lk(mu_);
  // An element asking for more than the host has still runs, alone (validation refuses such
  // manifests; actions have no cpu request).
  cpu = std::min(cpu, agent_.options().cpus);
  cpu_cv_.wait(lk, [&] { return cpu_free_ >= cpu - 1e-9; });
  cpu_free_ -= cpu;
}

void Engine::release_cpu(double cpu) {
  std::lock_guard<std::mutex> lk(mu_);
  cpu_free_ += std::min(cpu, agent_.options().cpus);
  cpu_cv_.notify_all();
}

std::string Engine::code_dir(const std::string &ns, const std::string &kind, const json &doc) {
  // One folder per version: the files of a deployed version never change.
  std::string dir = home_ + "/code/" + ns + "/" + kind + "/" + doc["name"].get<std::string>() + "/" +
                    std::to_string(doc.value("version", int64_t(1)));
  struct stat st;
  if (stat((dir + "/.complete").c_str(), &st) == 0) return dir;
  mkdirs(dir);
  if (kind == "apps") {
    for (auto &[file, content] : doc["files"].items()) {
      std::string path = dir + "/" + file;
      auto slash = path.rfind('/');
      mkdirs(path.substr(0, slash));
      std::ofstream(path, std::ios::binary) << content.get<std::string>();
    }
  } else {
    std::ofstream(dir + "/action.py", std::ios::binary) << doc["exec"]["code"].get<std::string>();
  }
  std::ofstream(dir + "/.complete") << "";
  return dir;
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
  store_.put_activation(act->record);
  {
    std::lock_guard<std::mutex> lk(mu_);
    running_[act->id] = act;
  }
  std::thread([this, act] {
    if (act->kind == "app") run_app(act);
    else run_action(act);
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
  for (auto &p : action.value("parameters", json::array())) act->params[p["key"].get<std::string>()] = p["value"];
  if (params.is_object()) act->params.update(params);
  return start(act, wait_ms, record, finished);
}

void Engine::finish(const std::shared_ptr<Activation> &act, const std::string &status, const json &result) {
  int64_t end = now_ms();
  std::lock_guard<std::mutex> lk(act->mu);
  act->record["end"] = end;
  act->record["duration"] = end - act->record["start"].get<int64_t>();
  act->record["response"] = {{"status", status}, {"statusCode", status_code(status)}, {"success", status == "success"},
                             {"result", result}};
  act->record["logs"] = act->logs;
  int64_t wait = act->first_start_ms ? act->first_start_ms - act->requested_ms : 0;
  act->record["annotations"].push_back({{"key", "waitTime"}, {"value", wait}});
  act->record["annotations"].push_back({{"key", "initTime"}, {"value", act->init_ms}});
  act->record["annotations"].push_back({{"key", "starts"}, {"value", act->starts}});
  store_.put_activation(act->record);
  act->done = true;
  act->cv.notify_all();
}

void Engine::run_action(const std::shared_ptr<Activation> &act) {
  ComputeSpec spec;
  spec.aid = act->ns + "-" + act->name + "-" + act->id.substr(0, 8);
  spec.code = code_dir(act->ns, "actions", act->doc) + "/action.py";
  spec.main = act->doc["exec"].value("main", "main");
  spec.args = act->params;
  spec.timeout_ms = act->doc.value("limits", json::object()).value("timeout", int64_t(60000));
  acquire_cpu(1);
  act->first_start_ms = now_ms();
  ComputeOutcome o = agent_.run_compute(spec);
  release_cpu(1);
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
  act->dir = code_dir(act->ns, "apps", act->doc);
  const Manifest &m = act->manifest;

  // Memory elements live as long as the activation (or until released).
  auto cleanup = [&] {
    std::vector<std::string> ids;
    {
      std::lock_guard<std::mutex> lk(act->mu);
      for (auto &[id, size] : act->memory) ids.push_back(id);
      for (auto &[k, id] : act->runtime_elements) ids.push_back(id);
      act->memory.clear();
      act->runtime_elements.clear();
    }
    for (auto &id : ids) agent_.remove_element(id);
    std::lock_guard<std::mutex> lk(mu_);
    for (auto &t : act->tokens) tokens_.erase(t);
  };
  for (auto &[name, d] : m.elements) {
    if (d.kind != "memory") continue;
    std::string id = act->id + "-" + name, why;
    if (agent_.create_element(id, d.size, &why)) {
      cleanup();
      finish(act, "whisk internal error", {{"error", "cannot place memory element '" + name + "': " + why}});
      return;
    }
    std::lock_guard<std::mutex> lk(act->mu);
    act->memory[id] = d.size;
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
    std::vector<std::thread> threads;
    for (auto &r : runs) {
      threads.emplace_back([&, rp = &r] {
        const ElementDecl &d = m.elements.at(rp->element);
        ComputeSpec spec;
        spec.aid = act->id + "-" + rp->element + "-" + std::to_string(rp->instance);
        spec.code = act->dir + "/" + d.code;
        spec.main = d.main;
        spec.timeout_ms = d.timeout_ms;
        spec.args = act->params;
        spec.args["_instance"] = rp->instance;
        spec.args["_parallelism"] = d.parallelism;
        for (auto &p : m.parents.count(rp->element) ? m.parents.at(rp->element) : std::vector<std::string>{})
          spec.args[p] = results.at(p);
        for (auto &[tname, t] : d.transports) {
          TransportGrant g;
          std::string why;
          if (agent_.grant(act->id + "-" + t.element, spec.aid, t.rights, tname, &g, &why)) {
            rp->outcome.status = "whisk internal error";
            rp->outcome.error = {{"type", "GrantError"}, {"message", why}};
            return;
          }
          spec.transports.push_back(g);
        }
        spec.runtime_url = runtime_url_;
        spec.runtime_token = random_hex(24);
        {
          std::lock_guard<std::mutex> lk(mu_);
          tokens_[spec.runtime_token] = {act, spec.aid};
        }
        {
          std::lock_guard<std::mutex> lk(act->mu);
          act->tokens.push_back(spec.runtime_token);
        }
        acquire_cpu(d.cpu);
        {
          std::lock_guard<std::mutex> lk(act->mu);
          if (!act->first_start_ms) act->first_start_ms = now_ms();
        }
        rp->outcome = agent_.run_compute(spec);
        release_cpu(d.cpu);
      });
    }
    for (auto &t : threads) t.join();
    for (auto &r : runs) {
      std::string tag = r.element + "#" + std::to_string(r.instance);
      {
        std::lock_guard<std::mutex> lk(act->mu);
        if (!r.outcome.start.empty()) act->starts[r.outcome.start]++;
        for (auto &line : r.outcome.logs) act->logs.push_back(line.substr(0, 25) + tag + " " + line.substr(25));
        act->init_ms = std::max(act->init_ms, r.outcome.init_ms);
      }
      if (!r.outcome.ok && failure.is_null()) {
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
          (s.is_string() && libd::parse_size(s.get<std::string>(), &size) && size > 0))) {
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
  if (agent_.create_element(id, size, &why)) {
    *reply = {{"error", "cannot place a memory element of " + std::to_string(size) + " bytes: " + why}};
    return 409;
  }
  TransportGrant g;
  if (agent_.grant(id, aid, 3, name, &g, &why)) {
    agent_.remove_element(id);
    *reply = {{"error", why}};
    return 500;
  }
  {
    std::lock_guard<std::mutex> lk(c.act->mu);
    c.act->runtime_elements[key] = id;
  }
  *reply = {{"name", name}, {"durl", g.durl}, {"config", g.config}};
  return 201;
}

int Engine::runtime_release(const std::string &token, const std::string &aid, const std::string &name, json *reply) {
  Caller c;
  if (!find_caller(token, aid, &c, reply)) return 401;
  std::string id;
  {
    std::lock_guard<std::mutex> lk(c.act->mu);
    auto it = c.act->runtime_elements.find(aid + "/" + name);
    if (it == c.act->runtime_elements.end()) {
      *reply = {{"error", "this action has no element named '" + name + "'"}};
      return 404;
    }
    id = it->second;
    c.act->runtime_elements.erase(it);
  }
  agent_.remove_element(id);  // revokes the grant: the caller's connection closes at once
  return 204;
}

json Engine::elements(const std::string &ns) {
  json out = json::array();
  std::lock_guard<std::mutex> lk(mu_);
  for (auto &[id, act] : running_) {
    if (act->ns != ns) continue;
    std::lock_guard<std::mutex> alk(act->mu);
    for (auto &[eid, size] : act->memory)
      out.push_back({{"id", eid}, {"kind", "memory"}, {"app", act->name}, {"activation", act->id},
                     {"host", agent_.options().host_id}, {"size", size}});
    for (auto &[k, eid] : act->runtime_elements)
      out.push_back({{"id", eid}, {"kind", "memory"}, {"app", act->name}, {"activation", act->id},
                     {"host", agent_.options().host_id}, {"invoked_by", k.substr(0, k.find('/'))}});
  }
  return out;
}

json Engine::host_info() {
  std::lock_guard<std::mutex> lk(mu_);
  const auto &o = agent_.options();
  return {{"id", o.host_id}, {"address", o.tcp_host}, {"cpus", o.cpus}, {"cpus_free", cpu_free_},
          {"memory_pool", o.pool_bytes}, {"memory_pool_used", agent_.pool_used()}, {"state", "up"},
          {"running_activations", running_.size()}};
}

}  // namespace scad
