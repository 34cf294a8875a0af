// OpenWhisk web actions: /api/v1/web/NAMESPACE/PACKAGE/ACTION.EXT without credentials, for actions
// annotated web-export: true ("default" is the package of actions in none). The action gets the
// query's and the JSON body's members as parameters with __ow_method, __ow_headers and __ow_path.
// .json answers the result as JSON; .http (and no extension) reads the result as an HTTP response
// ({"body", "statusCode", "headers"}). Other extensions (.html, .text, .svg), raw HTTP
// (raw-http), require-whisk-auth and projections are not supported.
#include <cctype>

#include "api_util.h"
#include "host_registry.h"
#include "safe_json.h"

namespace scad::api {

namespace {

bool annotated(const json &doc, const char *key) { return key_value(doc.value("annotations", json::array()), key) == true; }

// The result of an .http action as the response: statusCode, headers (text values), body (text
// as it is, anything else as JSON).
void http_result(httplib::Response &res, const json &result) {
  int status = 200;
  if (auto code = get_int(result, "statusCode"); code && *code >= 100 && *code <= 599) status = int(*code);
  res.status = status;
  std::string type = "application/json";
  if (result.contains("headers") && result["headers"].is_object())
    for (auto &[k, v] : result["headers"].items()) {
      if (!v.is_string() || k.find_first_of("\r\n:") != std::string::npos) continue;
      std::string value = v.get<std::string>();
      if (value.find_first_of("\r\n") != std::string::npos) continue;
      std::string lower = k;
      for (auto &c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
      if (lower == "content-type") type = value;
      else if (lower != "content-length" && lower != "connection" && lower != "transfer-encoding") res.set_header(k, value);
    }
  if (!result.contains("body")) return res.set_content("", type);
  const json &body = result["body"];
  if (body.is_string()) {
    if (type == "application/json") type = "text/html";
    return res.set_content(body.get<std::string>(), type);
  }
  res.set_content(dump_json(body), type);
}

}  // namespace

void web_routes(Routes &routes, Store &store, Engine &engine, std::shared_ptr<Invoker> invoker) {
  auto handler = [&, invoker](const httplib::Request &req, httplib::Response &res) {
    std::string ns = req.matches[1], pkg = req.matches[2], action = req.matches[3], ext = req.matches[4];
    if (!valid_entity_name(ns) || !valid_entity_name(pkg) || !valid_entity_name(action))
      return error(res, 404, "The requested resource does not exist.");
    if (!ext.empty() && ext != ".json" && ext != ".http")
      return error(res, 400, "Extension must be specified and one of [.json, .http].");
    auto doc = store.get_doc("actions", ns, pkg == "default" ? action : pkg + "/" + action);
    if (!doc || !annotated(*doc, "web-export")) return error(res, 404, "The requested resource does not exist.");
    json params = json::object();
    for (auto &[k, v] : req.params) params[k] = v;
    if (!req.body.empty()) {
      json body;
      if (req.get_header_value("Content-Type").find("json") == std::string::npos || !parse_json(req.body, &body, nullptr) ||
          !body.is_object())
        return error(res, 400, "Content type is not supported.");
      params.update(body);
    }
    json headers = json::object();
    for (auto &[k, v] : req.headers) {
      std::string lower = k;
      for (auto &c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
      if (lower != "authorization") headers[lower] = valid_utf8(v);
    }
    std::string method = req.method;
    for (auto &c : method) c = char(std::tolower(static_cast<unsigned char>(c)));
    params["__ow_method"] = method;
    params["__ow_headers"] = headers;
    params["__ow_path"] = "";
    // A web request waits for its result like a blocking invoke, and counts among those waits.
    int64_t wait = invoker->opts.blocking_wait_ms;
    if (invoker->waiting->fetch_add(1) >= invoker->opts.max_blocking_waits) wait = 0;
    struct Done {
      std::atomic<int> *n;
      ~Done() { n->fetch_sub(1); }
    } done{invoker->waiting.get()};
    Engine::Started st;
    // Run in the action's own namespace, without a caller's key: a web action is public.
    EngineError e = engine.invoke_action(ns, *doc, params, wait, &st, {"", txid(), "", false});
    if (e) return error(res, http_status(e.kind), e.message);
    res.set_header("x-openwhisk-activation-id", st.id);
    if (!st.finished) return error(res, 202, "Response not yet ready.");
    const json &r = st.record["response"];
    if (!r.value("success", false)) {
      std::string msg = r["result"].contains("error") && r["result"]["error"].is_string() ? r["result"]["error"].get<std::string>()
                                                                                           : dump_json(r["result"]);
      return error(res, r.value("status", std::string()) == "application error" ? 400 : 502, msg);
    }
    if (ext == ".json") return reply(res, 200, r["result"]);
    http_result(res, r["result"]);
  };
  const std::string path = "/api/v1/web/([^/]+)/([^/]+)/([^/.]+)(\\.[a-z]+)?";
  routes.Get(path, handler);
  routes.Post(path, handler);
  routes.Put(path, handler);
  routes.Delete(path, handler);
}

}  // namespace scad::api
