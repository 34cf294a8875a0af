// OpenWhisk triggers and rules. A rule ties a trigger to an action of the same namespace; firing
// the trigger (POST) invokes the action of each active rule with the trigger's parameters and the
// payload, and records the trigger's own activation, whose logs hold one line per rule (the
// activation it started, or why none). No active rule: 204 and no record, as OpenWhisk. Feeds
// (triggers fed by an external event source) are not supported.
#include "api_util.h"
#include "entity_ref.h"
#include "safe_json.h"
#include "secrets.h"

namespace scad::api {

namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string semver(const json &doc) { return "0.0." + std::to_string(doc.value("version", int64_t(1))); }

// A trigger as OpenWhisk shows it: with the rules that name it.
json trigger_view(Store &store, const json &doc) {
  json v = doc;
  v["version"] = semver(doc);
  json rules = json::object();
  for (auto &r : store.list_docs("rules", doc["namespace"]))
    if (r["trigger"]["name"] == doc["name"])
      rules[doc["namespace"].get<std::string>() + "/" + r["name"].get<std::string>()] = {
          {"action", r["action"]}, {"status", r["status"]}};
  v["rules"] = rules;
  return v;
}

json rule_view(const json &doc) {
  json v = doc;
  v["version"] = semver(doc);
  return v;
}

// A plain name in the caller's namespace from "/ns/name" or "name"; "" when it names another's.
std::string local_name(const json &j, const std::string &ns) {
  EntityRef ref;
  if (!j.is_string() || !parse_entity_ref(j.get<std::string>(), ns, &ref) || ref.ns != ns) return "";
  return ref.entity();
}

void fire(Store &store, Engine &engine, const httplib::Request &req, httplib::Response &res, const std::string &ns,
          const std::string &creds, const std::string &name) {
  json payload;
  if (!parse_body(req, res, &payload)) return;
  if (!payload.is_object()) return error(res, 400, "The request content was malformed: the payload must be a JSON object");
  auto trigger = store.get_doc("triggers", ns, name);
  if (!trigger) return error(res, 404, "The requested resource does not exist.");
  std::vector<json> active;
  for (auto &r : store.list_docs("rules", ns))
    if (r["trigger"]["name"] == name && r.value("status", std::string()) == "active") active.push_back(r);
  if (active.empty()) return reply(res, 204, json());
  json args = json::object();
  for (auto &p : trigger->value("parameters", json::array()))
    if (auto key = get_string(p, "key")) args[*key] = p["value"];
  args.update(payload);
  std::string id = random_hex(16), tx = txid();
  int64_t start = now_ms();
  json logs = json::array();
  for (auto &r : active) {
    std::string action = r["action"]["name"];
    json line = {{"rule", ns + "/" + r["name"].get<std::string>()}, {"action", ns + "/" + action}};
    auto doc = store.get_doc("actions", ns, action);
    Engine::Started st;
    EngineError e;
    if (!doc) e = refuse(Refusal::kNotFound, "The requested resource does not exist.");
    else e = engine.invoke_action(ns, *doc, args, 0, &st, {creds, tx, id, false});
    if (e) line.update({{"statusCode", 1}, {"success", false}, {"error", e.message}});
    else line.update({{"statusCode", 0}, {"success", true}, {"activationId", st.id}});
    logs.push_back(dump_json(line));
  }
  int64_t end = now_ms();
  json record = {{"activationId", id}, {"namespace", ns}, {"name", name}, {"subject", ns}, {"version", semver(*trigger)},
                 {"publish", false}, {"start", start}, {"end", end}, {"duration", end - start},
                 {"response", {{"status", "success"}, {"statusCode", 0}, {"success", true}, {"result", args}}},
                 {"logs", logs},
                 {"annotations", json::array({{{"key", "path"}, {"value", ns + "/" + name}}, {{"key", "kind"}, {"value", "trigger"}}})}};
  store.put_activation(record);
  reply(res, 202, {{"activationId", id}});
}

}  // namespace

void trigger_routes(Routes &routes, Store &store, Engine &engine, std::shared_ptr<Invoker>) {
  routes.Get(NS + "/triggers/?", [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    list_collection(store, req, res, ns, "triggers", [&](const json &d) { return trigger_view(store, d); });
  });
  const std::string trig = NS + "/triggers/([^/]+)";
  routes.Put(trig, [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]), name = req.matches[2];
    json body;
    if (ns.empty() || !check_name(res, "trigger", name) || !parse_body(req, res, &body)) return;
    if (!body.is_object()) return error(res, 400, "The request content was malformed: the body must be a trigger");
    if (!key_value(body.value("annotations", json::array()), "feed").is_null())
      return error(res, 400, "trigger feeds are not supported by this platform");
    auto old = store.get_doc("triggers", ns, name);
    json doc;
    if (!may_write(req, res, old, "trigger", name) || !entity_fields(res, body, old, &doc)) return;
    doc.update({{"namespace", ns}, {"name", name}, {"limits", json::object()},
                {"version", store.next_version("triggers", ns, name)}});
    store.put_doc("triggers", ns, name, doc);
    reply(res, 200, trigger_view(store, doc));
  });
  routes.Get(trig, [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto doc = store.get_doc("triggers", ns, req.matches[2]);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    reply(res, 200, trigger_view(store, *doc));
  });
  routes.Delete(trig, [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto doc = store.get_doc("triggers", ns, req.matches[2]);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    json view = trigger_view(store, *doc);
    store.delete_doc("triggers", ns, req.matches[2]);
    reply(res, 200, view);
  });
  routes.Post(trig, [&](const httplib::Request &req, httplib::Response &res) {
    std::string creds;
    std::string ns = authorize(store, req, res, req.matches[1], &creds);
    if (!ns.empty()) fire(store, engine, req, res, ns, creds, req.matches[2]);
  });

  routes.Get(NS + "/rules/?", [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    list_collection(store, req, res, ns, "rules", rule_view);
  });
  const std::string rule = NS + "/rules/([^/]+)";
  routes.Put(rule, [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]), name = req.matches[2];
    json body;
    if (ns.empty() || !check_name(res, "rule", name) || !parse_body(req, res, &body, false)) return;
    if (!body.is_object()) return error(res, 400, "The request content was malformed: the body must be a rule");
    auto old = store.get_doc("rules", ns, name);
    if (!may_write(req, res, old, "rule", name)) return;
    std::string trigger = local_name(body.value("trigger", old ? json("/" + ns + "/" + (*old)["trigger"]["name"].get<std::string>()) : json()), ns);
    std::string action = local_name(body.value("action", old ? json("/" + ns + "/" + (*old)["action"]["name"].get<std::string>()) : json()), ns);
    if (trigger.empty() || action.empty())
      return error(res, 400, "The request content was malformed: a rule needs \"trigger\" and \"action\", "
                             "names in this namespace (\"name\" or \"/namespace/name\")");
    if (!store.get_doc("triggers", ns, trigger) || !store.get_doc("actions", ns, action))
      return error(res, 404, "The requested resource does not exist.");
    std::string status = body.value("status", old ? old->value("status", std::string("active")) : std::string("active"));
    if (status != "active" && status != "inactive") return error(res, 400, "status must be \"active\" or \"inactive\"");
    json doc = {{"namespace", ns}, {"name", name}, {"publish", false}, {"annotations", json::array()},
                {"status", status}, {"trigger", {{"name", trigger}, {"path", ns}}},
                {"action", {{"name", action}, {"path", ns}}}, {"version", store.next_version("rules", ns, name)}};
    store.put_doc("rules", ns, name, doc);
    reply(res, 200, rule_view(doc));
  });
  routes.Get(rule, [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto doc = store.get_doc("rules", ns, req.matches[2]);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    reply(res, 200, rule_view(*doc));
  });
  routes.Delete(rule, [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto doc = store.get_doc("rules", ns, req.matches[2]);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    store.delete_doc("rules", ns, req.matches[2]);
    reply(res, 200, rule_view(*doc));
  });
  // Enables or disables: {"status": "active" | "inactive"}.
  routes.Post(rule, [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    json body;
    if (ns.empty() || !parse_body(req, res, &body, false)) return;
    auto doc = store.get_doc("rules", ns, req.matches[2]);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    std::string status = body.is_object() ? get_string(body, "status").value_or("") : "";
    if (status != "active" && status != "inactive") return error(res, 400, "status must be \"active\" or \"inactive\"");
    (*doc)["status"] = status;
    store.put_doc("rules", ns, req.matches[2], *doc);
    reply(res, 200, rule_view(*doc));
  });
}

}  // namespace scad::api
