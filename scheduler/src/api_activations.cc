// Activations: OpenWhisk's listing (short entries with a top-level statusCode, or the whole
// records with docs=true; since, upto, name, skip, limit, count) and one record, its logs and its
// result. A running activation is not found yet (404): clients poll until it is.
#include <algorithm>

#include "action_response.h"
#include "api_util.h"
#include "entity_ref.h"
#include "safe_json.h"

namespace scad::api {

namespace {

// An integer query parameter (since, upto): its value, dflt when absent, or nullopt (and the 400
// with `bad` sent).
std::optional<int64_t> int_query(const httplib::Request &req, httplib::Response &res, const char *key, int64_t dflt,
                                 const std::string &bad) {
  if (!req.has_param(key)) return dflt;
  std::string v = req.get_param_value(key);
  bool digits = !v.empty() && v.size() <= 15 &&
                std::all_of(v.begin() + (v[0] == '-'), v.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                v != "-";
  if (!digits) {
    error(res, 400, bad);
    return std::nullopt;
  }
  return std::stoll(v);
}

// OpenWhisk's short form of a listed activation: no result, no logs, the status as a code.
json brief(const json &r) {
  json b = {{"activationId", r["activationId"]}, {"namespace", r["namespace"]}, {"name", r["name"]},
            {"version", r["version"]}, {"publish", r.value("publish", false)}, {"start", r["start"]},
            {"end", r["end"]}, {"duration", r["duration"]}, {"annotations", r.value("annotations", json::array())},
            {"statusCode", status_code(r["response"].value("status", std::string()))}};
  if (r.contains("cause")) b["cause"] = r["cause"];
  return b;
}

}  // namespace

void activation_routes(Routes &routes, Store &store) {
  routes.Get(NS + "/activations/?", [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    Store::ActivationQuery q;
    ListPage page;
    if (!list_page(req, res, "activations", &page)) return;
    for (auto [key, field] : {std::pair{"since", &q.since}, std::pair{"upto", &q.upto}}) {
      auto v = int_query(req, res, key, 0,
                         "Parameter is not a valid value for epoch seconds: " + valid_utf8(req.get_param_value(key).substr(0, 64)));
      if (!v) return;
      *field = std::max<int64_t>(0, *v);
    }
    q.limit = page.limit;
    q.skip = int(page.skip);
    if (req.has_param("name")) {
      std::string name = req.get_param_value("name");
      EntityRef ref;
      if (!parse_entity_ref(name, ns, &ref) || name[0] == '/')
        return error(res, 400, "Parameter may be a 'simple' name or 'package-name/simple' name: " + valid_utf8(name.substr(0, 300)));
      q.name = ref.entity();
    }
    bool docs = req.get_param_value("docs") == "true";
    if (req.get_param_value("count") == "true") {
      if (docs) return error(res, 400, "The parameter 'docs' is not permitted with 'count'.");
      return reply(res, 200, {{"activations", store.count_activations(ns, q)}});
    }
    json out = json::array();
    for (auto &r : store.list_activations(ns, q)) out.push_back(docs ? r : brief(r));
    reply(res, 200, out);
  });
  routes.Get(NS + "/activations/([^/]+)(/logs|/result)?", [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto r = store.get_activation(ns, req.matches[2]);
    if (!r) return error(res, 404, "The requested resource does not exist.");
    std::string part = req.matches[3];
    if (part == "/logs") return reply(res, 200, {{"logs", (*r)["logs"]}});
    if (part == "/result") return reply(res, 200, (*r)["response"]);
    reply(res, 200, *r);
  });
}

}  // namespace scad::api
