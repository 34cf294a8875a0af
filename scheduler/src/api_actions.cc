// OpenWhisk actions: list, put (create, or update merged with the stored action; Python code as
// text or a zip: action_code.h), get, delete and invoke, in the default package (/actions/NAME)
// or in a package (/actions/PACKAGE/NAME); and the invocation's answer (blocking, result,
// timeout), shared with applications.
#include <algorithm>

#include "action_code.h"
#include "action_limits.h"
#include "api_util.h"
#include "entity_ref.h"
#include "safe_json.h"

namespace scad::api {

namespace {

constexpr size_t kMaxSequenceLength = 50;  // OpenWhisk's whisk.actionSequence.maxLength

// The stored limits of an action updated with those of the request, member by member (what
// `wsk action update --timeout` sends is only the one it changes).
json merged_limits(const std::optional<json> &old, const json &body) {
  json limits = old ? old->value("limits", json::object()) : json::object();
  if (!limits.is_object()) limits = json::object();
  if (body.contains("limits") && body["limits"].is_object())
    for (auto &[k, v] : body["limits"].items()) limits[k] = v;
  else if (body.contains("limits"))
    return body["limits"];  // not an object: validate_limits says so
  return limits;
}

// A sequence's exec: its components fully qualified, each an action of this namespace that is not
// the sequence itself. "" or OpenWhisk's message.
std::string sequence_exec(Store &store, const std::string &ns, const std::string &self, const json &exec, json *out) {
  const json components = exec.value("components", json());
  if (!components.is_array() || components.empty()) return "No component specified for the sequence.";
  if (components.size() > kMaxSequenceLength) return "Too many actions in the sequence.";
  json names = json::array();
  for (auto &c : components) {
    EntityRef ref;
    if (!c.is_string() || !parse_entity_ref(c.get<std::string>(), ns, &ref))
      return "The fully qualified name of the entity must contain at least the namespace and the name of the entity.";
    if (ref.ns != ns) return "Sequence component does not exist.";  // another tenant's: never visible
    if (ref.entity() == self) return "Sequence may not refer to itself.";
    if (!store.get_doc("actions", ns, ref.entity())) return "Sequence component does not exist.";
    names.push_back(ref.qualified());
  }
  *out = {{"kind", "sequence"}, {"components", names}};
  return "";
}

// The exec of a Python action: code as text, or a zip (binary, base64) with __main__.py.
std::string python_exec(const json &exec, json *out) {
  auto code = get_string(exec, "code");
  if (!code) return "exec.code must be the action's code";
  if (exec.contains("main") && !exec["main"].is_string()) return "exec.main must be the name of the function to call";
  bool zip = is_zip_code(exec);
  if (zip) {
    std::string why = check_zip_code(*code);
    if (!why.empty()) return why;
  }
  *out = {{"kind", exec["kind"]}, {"code", *code}, {"main", exec.value("main", "main")}, {"binary", zip}};
  return "";
}

void put_action(Store &store, const ApiOptions &opts, const httplib::Request &req, httplib::Response &res,
                const std::string &ns, const std::string &package, const std::string &name) {
  json body;
  if (!check_name(res, "action", name) || (!package.empty() && !check_name(res, "package", package)) ||
      !parse_body(req, res, &body, false))
    return;
  if (!body.is_object())
    return error(res, 400, "The request content was malformed: the body must be an action: "
                           "{\"exec\": {\"kind\": \"python:3\", \"code\": \"...\"}, ...}");
  std::string entity = package.empty() ? name : package + "/" + name;
  if (!package.empty() && !store.get_doc("packages", ns, package))
    return error(res, 404, "The requested resource does not exist.");
  auto old = store.get_doc("actions", ns, entity);
  if (!may_write(req, res, old, "action", entity)) return;
  // An update (overwrite=true) merges: what the request leaves out is kept from the stored action.
  json exec_in = body.contains("exec") ? body["exec"] : old ? (*old)["exec"] : json();
  if (!exec_in.is_object())
    return error(res, 400, "The request content was malformed: exec undefined (an action needs "
                           "{\"exec\": {\"kind\": \"python:3\", \"code\": \"...\"}})");
  std::string kind = get_string(exec_in, "kind").value_or("");
  json exec;
  std::string why;
  if (kind == "sequence") why = sequence_exec(store, ns, entity, exec_in, &exec);
  else if (kind.rfind("python", 0) == 0) why = python_exec(exec_in, &exec);
  else
    why = "The specified runtime '" + valid_utf8(kind.substr(0, 64)) +
          "' is not supported by this platform. Valid values are: 'python:3', 'sequence'.";
  if (!why.empty()) return error(res, 400, why);
  if (kind != "sequence") {
    why = check_exec_size(exec["code"].get_ref<const std::string &>(), exec["main"].get_ref<const std::string &>());
    if (!why.empty()) return error(res, 413, why);
  }
  json params = body.contains("parameters") ? body["parameters"] : old ? old->value("parameters", json::array()) : json::array();
  if (!key_value_list(params)) return error(res, 400, "parameters must be a list of {\"key\": NAME, \"value\": VALUE}");
  json annotations = body.contains("annotations") ? body["annotations"]
                     : old ? old->value("annotations", json::array()) : json::array();
  if (!key_value_list(annotations))
    return error(res, 400, "annotations must be a list of {\"key\": NAME, \"value\": VALUE}");
  // As OpenWhisk: an action is not given its caller's key unless its author asks for it.
  if (key_value(annotations, "provide-api-key").is_null())
    annotations.push_back({{"key", "provide-api-key"}, {"value", false}});
  json limits;
  if (!validate_limits(merged_limits(old, body), opts.limits, &limits, &why)) return error(res, 400, why);
  json publish = body.contains("publish") ? body["publish"] : old ? old->value("publish", json(false)) : json(false);
  if (!publish.is_boolean()) return error(res, 400, "publish must be true or false");
  std::string hashed = kind == "sequence" ? dump_json(exec["components"]) : exec["code"].get<std::string>();
  json doc = {{"namespace", ns}, {"name", name}, {"exec", exec}, {"parameters", params}, {"limits", limits},
              {"annotations", annotations}, {"publish", publish},
              {"version", store.next_version("actions", ns, entity)}, {"code_hash", sha256_hex(hashed)}};
  if (!package.empty()) doc["package"] = package;
  store.put_doc("actions", ns, entity, doc);
  reply(res, 200, action_view(doc));
}

}  // namespace

void Invoker::invoke(const httplib::Request &req, httplib::Response &res, const std::string &ns,
                     const std::string &creds, const std::string &table, const json &doc, const json &params) const {
  if (!params.is_object())
    return error(res, 400, "The request content was malformed: the parameters must be a JSON object");
  bool blocking = req.get_param_value("blocking") == "true";
  int64_t wait = blocking ? opts.blocking_wait_ms : 0;
  // OpenWhisk's ?timeout=: how long a blocking invoke waits (up to the server's longest wait)
  // before it answers 202 with the activation id.
  if (blocking && req.has_param("timeout")) {
    const std::string t = req.get_param_value("timeout");
    bool digits = !t.empty() && t.size() <= 12 && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
    int64_t ms = digits ? std::stoll(t) : -1;
    if (ms <= 0 || ms > opts.blocking_wait_ms)
      return error(res, 400, "Timeout must be number of milliseconds up to " + std::to_string(opts.blocking_wait_ms) + ".");
    wait = ms;
  }
  if (wait && waiting->fetch_add(1) >= opts.max_blocking_waits) {
    waiting->fetch_sub(1);
    wait = 0;
  }
  struct Done {
    std::atomic<int> *n;
    bool counted;
    ~Done() {
      if (counted) n->fetch_sub(1);
    }
  } done{waiting.get(), wait > 0};
  Engine::Started started;
  EngineError e = table == "apps" ? engine.invoke_app(ns, doc, params, wait, &started)
                                  : engine.invoke_action(ns, doc, params, wait, &started, {creds, txid(), ""});
  if (e) return error(res, http_status(e.kind), e.message);
  if (!started.finished) return reply(res, 202, {{"activationId", started.id}});
  const json &r = started.record["response"];
  bool ok = r.value("success", false);
  int status = ok ? 200 : (r.value("status", std::string()) == "whisk internal error" ? 500 : 502);
  reply(res, status, req.get_param_value("result") == "true" ? r["result"] : started.record);
}

void action_routes(Routes &routes, Store &store, Engine &engine, const ApiOptions &opts, std::shared_ptr<Invoker> invoker) {
  routes.Get(NS + "/actions/?", [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    list_collection(store, req, res, ns, "actions", [](const json &d) { return action_view(d); });
  });
  // (PACKAGE/)?NAME: matches[2] is "PACKAGE/" or empty, matches[3] the name.
  const std::string one = NS + "/actions/([^/]+/)?([^/]+)";
  auto entity = [](const httplib::Request &req) {
    std::string pkg = req.matches[2];
    if (!pkg.empty()) pkg.pop_back();
    return std::make_pair(pkg, std::string(req.matches[3]));
  };
  routes.Put(one, [&, opts, entity](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto [pkg, name] = entity(req);
    put_action(store, opts, req, res, ns, pkg, name);
  });
  routes.Get(one, [&, entity](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto [pkg, name] = entity(req);
    auto doc = store.get_doc("actions", ns, pkg.empty() ? name : pkg + "/" + name);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    reply(res, 200, action_view(*doc, req.get_param_value("code") != "false"));
  });
  routes.Delete(one, [&, entity](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto [pkg, name] = entity(req);
    std::string key = pkg.empty() ? name : pkg + "/" + name;
    auto doc = store.get_doc("actions", ns, key);
    if (!doc || !store.delete_doc("actions", ns, key)) return error(res, 404, "The requested resource does not exist.");
    engine.forget_code(ns, "actions", key);
    reply(res, 200, action_view(*doc));
  });
  routes.Post(one, [&, entity, invoker](const httplib::Request &req, httplib::Response &res) {
    std::string creds;
    std::string ns = authorize(store, req, res, req.matches[1], &creds);
    json params;
    if (ns.empty() || !parse_body(req, res, &params)) return;
    auto [pkg, name] = entity(req);
    auto doc = store.get_doc("actions", ns, pkg.empty() ? name : pkg + "/" + name);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    invoker->invoke(req, res, ns, creds, "actions", *doc, params);
  });
}

}  // namespace scad::api
