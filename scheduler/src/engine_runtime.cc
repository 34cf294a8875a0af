// The runtime endpoint's side of the engine: a running instance (by its token) creates and
// releases memory elements of its activation; and the elements a namespace has now.
#include "engine.h"

#include <algorithm>
#include "engine_activation.h"
#include "flags.h"
#include "safe_json.h"

namespace scad {

EngineError Engine::find_caller(const std::string &token, const std::string &aid, Caller *out) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = tokens_.find(token);
  if (it == tokens_.end() || it->second.aid != aid)
    return refuse(Refusal::kUnauthorized, "unknown or expired token for action '" + aid + "'");
  *out = it->second;
  return {};
}

EngineError Engine::runtime_invoke(const std::string &token, const std::string &aid, const json &body, json *reply) {
  Caller c;
  if (auto e = find_caller(token, aid, &c)) return e;
  if (!body.is_object() || !body.contains("template") || !body["template"].is_string() || !body.contains("name") ||
      !body["name"].is_string()) {
    return refuse(Refusal::kInvalid, "the body must be {\"template\": NAME, \"name\": TRANSPORT, \"props\": {...}}");
  }
  std::string tmpl = body["template"], name = body["name"];
  const Manifest &m = c.act->manifest;
  auto it = m.elements.find(tmpl);
  if (c.act->kind != "app" || it == m.elements.end() || it->second.kind != "memory") {
    return refuse(Refusal::kConflict, "template '" + tmpl + "' is not a memory element of application '" + c.act->name + "'");
  }
  uint64_t size = it->second.size;
  json props = body.value("props", json::object());
  if (props.contains("size")) {
    const json &s = props["size"];
    if (!((s.is_number_unsigned() && (size = s.get<uint64_t>()) > 0) ||
          (s.is_string() && parse_byte_size(s.get<std::string>(), &size) && size > 0))) {
      return refuse(Refusal::kInvalid, "props.size must be a positive number of bytes or a size such as 1GiB");
    }
  }
  bool prefetch = it->second.prefetch;  // the template's, unless the caller says otherwise
  if (props.contains("prefetch")) {
    if (!props["prefetch"].is_boolean()) return refuse(Refusal::kInvalid, "props.prefetch must be true or false");
    prefetch = props["prefetch"].get<bool>();
  }
  std::string key = aid + "/" + name;
  std::string id = c.act->id + "-rt" + std::to_string(++counter_) + "-" + name, why;
  {
    std::lock_guard<std::mutex> lk(c.act->mu);
    if (c.act->runtime_elements.count(key)) {
      return refuse(Refusal::kConflict, "this action already has an element named '" + name + "'");
    }
  }
  PlacedMemory placed;
  if (create_memory(c.act->ns, id, size, prefetch, c.host, &placed, &why)) {
    return refuse(Refusal::kConflict, "cannot place a memory element of " + std::to_string(size) + " bytes: " + why);
  }
  TransportGrant g;
  if (grant_memory(placed, aid, kRightRead | kRightWrite, name, c.host, &g, &why)) {
    release_memory(c.act->ns, placed);
    return refuse(Refusal::kInternal, why);
  }
  {
    std::lock_guard<std::mutex> lk(c.act->mu);
    c.act->runtime_elements[key] = placed;
  }
  *reply = {{"name", name}, {"durl", g.durl}, {"config", g.config}};
  return {};
}

EngineError Engine::runtime_release(const std::string &token, const std::string &aid, const std::string &name) {
  Caller c;
  if (auto e = find_caller(token, aid, &c)) return e;
  Activation::Placed p;
  {
    std::lock_guard<std::mutex> lk(c.act->mu);
    auto it = c.act->runtime_elements.find(aid + "/" + name);
    if (it == c.act->runtime_elements.end()) {
      return refuse(Refusal::kNotFound, "this action has no element named '" + name + "'");
    }
    p = it->second;
    c.act->runtime_elements.erase(it);
  }
  release_memory(c.act->ns, p);  // revokes the grant: the caller's connection closes at once
  return {};
}

void Engine::forget_code(const std::string &ns, const std::string &kind, const std::string &name) {
  std::vector<std::shared_ptr<HostAgent>> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto &h : hosts_) all.push_back(h.agent);
  }
  std::string key = name;  // an action in a package is kept as "package@name" (engine.cc, code_name)
  std::replace(key.begin(), key.end(), '/', '@');
  for (auto &h : all) h->remove_code(ns + "/" + kind + "/" + key);
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

}  // namespace scad
