#include "agent_api.h"

#include "agent_metrics.h"

#include "action_env.h"
#include "secrets.h"
#include "safe_json.h"

namespace scad {

using nlohmann::json;

json to_json(const ComputeSpec &s) {
  json t = json::array();
  for (auto &g : s.transports) t.push_back({{"durl", g.durl}, {"config", g.config}, {"grant_id", g.grant_id}});
  return {{"aid", s.aid}, {"code", s.code}, {"code_key", s.code_key}, {"code_files", s.code_files},
          {"code_zip", s.code_zip}, {"main", s.main}, {"args", s.args}, {"transports", t},
          {"runtime_url", s.runtime_url}, {"runtime_token", s.runtime_token}, {"timeout_ms", s.timeout_ms},
          {"cpu", s.cpu}, {"memory", s.memory}, {"log_bytes", s.log_bytes}, {"tenant", s.tenant}, {"network", s.network},
          {"env", s.env}};
}

ComputeSpec spec_from_json(const json &j) {
  ComputeSpec s;
  s.aid = j.at("aid");
  s.code = j.at("code");
  s.code_key = j.at("code_key");
  s.code_files = j.at("code_files");
  s.code_zip = j.value("code_zip", "");
  s.main = j.value("main", "main");
  s.args = j.value("args", json::object());
  for (auto &t : j.value("transports", json::array())) s.transports.push_back({t.at("durl"), t.at("config"), t.value("grant_id", "")});
  s.runtime_url = j.value("runtime_url", "");
  s.runtime_token = j.value("runtime_token", "");
  s.timeout_ms = j.value("timeout_ms", int64_t(60000));
  s.cpu = j.value("cpu", 1.0);
  s.memory = j.value("memory", uint64_t(256) << 20);
  s.log_bytes = j.value("log_bytes", uint64_t(10) << 20);
  s.tenant = j.value("tenant", "");
  s.network = j.value("network", true);
  // OpenWhisk's variables and names a manifest may set (the scheduler's rules for names and
  // values; the scheduler alone bounds their number and size), as text; anything else is dropped.
  if (j.contains("env") && j["env"].is_object())
    for (auto &[k, v] : j["env"].items())
      if (v.is_string() && (is_platform_env(k) || env_name_problem(k).empty()) &&
          env_value_problem(v.get<std::string>()).empty())
        s.env[k] = v.get<std::string>();
  return s;
}

json to_json(const ComputeOutcome &o) {
  return {{"ok", o.ok}, {"result", o.result}, {"error", o.error}, {"status", o.status}, {"logs", o.logs},
          {"duration_ms", o.duration_ms}, {"init_ms", o.init_ms}, {"start", o.start},
          {"transports", to_json(o.transports)}, {"transfers", to_json(o.transfers)}};
}

bool outcome_from_json(const json &j, ComputeOutcome *out, std::string *why) {
  static const char *const kStatuses[] = {"success", "application error", "action developer error",
                                          "whisk internal error"};
  ComputeOutcome o;
  auto ok = get_bool(j, "ok");
  auto status = get_string(j, "status");
  bool known = false;
  for (auto *k : kStatuses) known |= status && *status == k;
  if (!ok || !known || (*ok != (*status == "success"))) {
    *why = "the outcome needs a boolean \"ok\" and a \"status\" that agrees with it";
    return false;
  }
  o.ok = *ok;
  o.status = *status;
  o.result = j.contains("result") ? j["result"] : json();
  o.error = j.contains("error") ? j["error"] : json();
  if (!o.ok && !(get_string(o.error, "message") && get_string(o.error, "type")))
    o.error = {{"type", "AgentError"}, {"message", "the agent reported an error without a message: " + dump_json(o.error)}};
  if (j.contains("logs") && j["logs"].is_array())
    for (auto &line : j["logs"]) o.logs.push_back(line.is_string() ? line.get<std::string>() : dump_json(line));
  o.duration_ms = std::max<int64_t>(0, get_int(j, "duration_ms").value_or(0));
  o.init_ms = std::max<int64_t>(0, get_int(j, "init_ms").value_or(0));
  o.start = get_string(j, "start").value_or("");
  if (j.contains("transports")) o.transports = transport_usage_from_json(j["transports"]);
  if (j.contains("transfers")) o.transfers = transfers_from_json(j["transfers"]);
  *out = std::move(o);
  return true;
}

void install_agent_routes(httplib::Server &srv, Agent &agent, const std::string &token) {
  auto metrics = std::make_shared<AgentMetrics>();
  auto authorized = [token](const httplib::Request &req, httplib::Response &res) {
    std::string h = req.get_header_value("Authorization");
    if (h.rfind("Bearer ", 0) == 0 && constant_time_equal(h.substr(7), token)) return true;
    res.status = 401;
    res.set_content(json{{"error", "the cluster token is missing or wrong"}}.dump(), "application/json");
    return false;
  };
  auto body_of = [](const httplib::Request &req, httplib::Response &res, json *out) {
    std::string why = "it is not an object";
    if (parse_json(req.body, out, &why) && out->is_object()) return true;
    res.status = 400;
    res.set_content(dump_json(json{{"error", "the body is not accepted: " + why}}), "application/json");
    return false;
  };
  auto fail = [](httplib::Response &res, int status, const std::string &why) {
    res.status = status;
    res.set_content(dump_json(json{{"error", why}}), "application/json");
  };
  srv.Post("/agent/v1/elements", [&, authorized, body_of, fail](const httplib::Request &req, httplib::Response &res) {
    json b;
    if (!authorized(req, res) || !body_of(req, res, &b)) return;
    std::string why;
    if (!b.contains("id") || !b["id"].is_string() || !b.contains("size") || !b["size"].is_number_unsigned() ||
        (b.contains("prefetch") && !b["prefetch"].is_boolean()))
      return fail(res, 400, "needs {\"id\": NAME, \"size\": BYTES[, \"prefetch\": true|false]}");
    if (agent.create_element(b["id"], b["size"], b.value("prefetch", false), &why)) return fail(res, 409, why);
    res.status = 201;
  });
  srv.Delete("/agent/v1/elements/([^/]+)", [&, authorized](const httplib::Request &req, httplib::Response &res) {
    if (!authorized(req, res)) return;
    agent.remove_element(req.matches[1]);
    res.status = 204;
  });
  srv.Post("/agent/v1/grants", [&, authorized, body_of, fail](const httplib::Request &req, httplib::Response &res) {
    json b;
    if (!authorized(req, res) || !body_of(req, res, &b)) return;
    TransportGrant g;
    std::string why;
    try {
      if (agent.grant(b.at("element"), b.at("client"), b.at("rights"), b.at("name"), b.at("impl"), &g, &why))
        return fail(res, 409, why);
    } catch (const json::exception &e) {
      return fail(res, 400, std::string("bad grant request: ") + e.what());
    }
    res.set_content(json{{"durl", g.durl}, {"config", g.config}, {"grant_id", g.grant_id}}.dump(), "application/json");
  });
  srv.Delete("/agent/v1/grants/([^/]+)", [&, authorized, fail](const httplib::Request &req, httplib::Response &res) {
    if (!authorized(req, res)) return;
    std::string why;
    if (agent.revoke(req.matches[1], &why)) return fail(res, 404, why);
    res.status = 204;
  });
  srv.Post("/agent/v1/notices", [&, authorized, body_of, fail](const httplib::Request &req, httplib::Response &res) {
    json b;
    if (!authorized(req, res) || !body_of(req, res, &b)) return;
    if (!b.contains("aid") || !b["aid"].is_string() || !b.contains("notice") || !b["notice"].is_object())
      return fail(res, 400, "needs {\"aid\": INSTANCE, \"notice\": {...}}");
    if (agent.notify(b["aid"], b["notice"])) return fail(res, 404, "no compute instance '" + b["aid"].get<std::string>() + "' runs here");
    res.status = 204;
  });
  srv.Post("/agent/v1/code/remove", [&, authorized, body_of, fail](const httplib::Request &req, httplib::Response &res) {
    json b;
    if (!authorized(req, res) || !body_of(req, res, &b)) return;
    auto prefix = get_string(b, "prefix");
    if (!prefix || agent.remove_code(*prefix)) return fail(res, 400, "needs {\"prefix\": \"NS/KIND/NAME\"}");
    res.status = 204;
  });
  srv.Post("/agent/v1/run", [&, authorized, body_of, fail, metrics](const httplib::Request &req, httplib::Response &res) {
    json b;
    if (!authorized(req, res) || !body_of(req, res, &b)) return;
    ComputeSpec spec;
    try {
      spec = spec_from_json(b);
    } catch (const json::exception &e) {
      return fail(res, 400, std::string("bad compute spec: ") + e.what());
    }
    ComputeOutcome o = agent.run_compute(spec);
    metrics->run_finished(o.status, o.start, double(o.duration_ms) / 1000, o.transports);
    res.set_content(dump_json(to_json(o)), "application/json");
  });
  // Prometheus scrapes without credentials: the metrics are aggregates that name no tenant.
  srv.Get("/metrics", [&agent, metrics](const httplib::Request &, httplib::Response &res) {
    res.set_content(metrics->render(agent.options().pool_bytes, agent.pool_used()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
}

}  // namespace scad
