#include "api.h"

#include <openssl/evp.h>

#include <functional>
#include <set>

#include "action_limits.h"
#include "host_registry.h"
#include "secrets.h"
#include "safe_json.h"

namespace scad {

namespace {

bool valid_name(const std::string &name) { return valid_entity_name(name); }

std::string txid() { return random_hex(16); }

void reply(httplib::Response &res, int status, const json &body) {
  res.status = status;
  if (!body.is_null()) res.set_content(dump_json(body), "application/json");
}

// The HTTP status of each kind of refusal from the engine.
int http_status(Refusal kind) {
  switch (kind) {
    case Refusal::kNone: return 200;
    case Refusal::kUnauthorized: return 401;
    case Refusal::kInvalid: return 400;
    case Refusal::kNotFound: return 404;
    case Refusal::kConflict: return 409;
    case Refusal::kBusy: return 429;
    case Refusal::kInternal: return 500;
  }
  return 500;
}

void error(httplib::Response &res, int status, const std::string &msg, json extra = json::object()) {
  json body = {{"error", msg}, {"code", txid()}};
  body.update(extra);
  reply(res, status, body);
}

std::string b64decode(const std::string &in) {
  if (in.empty() || in.size() % 4) return "";
  std::string out(in.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char *>(out.data()), reinterpret_cast<const unsigned char *>(in.data()),
                          int(in.size()));
  if (n < 0) return "";
  size_t pad = (in.end()[-1] == '=') + (in.end()[-2] == '=');
  out.resize(size_t(n) - pad);
  return out;
}

// The namespace the request's Basic credentials authenticate, or "" (and the error sent).
std::string authenticate(Store &store, const httplib::Request &req, httplib::Response &res) {
  std::string h = req.get_header_value("Authorization");
  if (h.rfind("Basic ", 0) != 0) {
    res.set_header("WWW-Authenticate", "Basic realm=\"scad\"");
    error(res, 401, "The supplied authentication is invalid: use Basic auth with the uuid:key from $SCAD_HOME/wskprops");
    return "";
  }
  std::string creds = b64decode(h.substr(6));
  auto colon = creds.find(':');
  std::optional<std::string> ns;
  if (colon != std::string::npos) ns = store.authenticate(creds.substr(0, colon), creds.substr(colon + 1));
  if (!ns) {
    error(res, 401, "The supplied authentication is invalid");
    return "";
  }
  return *ns;
}

// Authenticates and checks that the path's namespace is the caller's ("_" means the caller's own).
std::string authorize(Store &store, const httplib::Request &req, httplib::Response &res, const std::string &path_ns) {
  std::string ns = authenticate(store, req, res);
  if (ns.empty()) return "";
  if (path_ns != "_" && path_ns != ns) {
    error(res, 403, "The supplied authentication is not authorized to access '" + path_ns + "'");
    return "";
  }
  return ns;
}

bool parse_body(const httplib::Request &req, httplib::Response &res, json *out, bool allow_empty = true) {
  if (req.body.empty() && allow_empty) {
    *out = json::object();
    return true;
  }
  std::string why;
  if (!parse_json(req.body, out, &why)) {
    error(res, 400, "The request content was malformed: the body is not accepted: " + why);
    return false;
  }
  return true;
}

bool check_name(httplib::Response &res, const std::string &what, const std::string &name) {
  if (valid_name(name)) return true;
  error(res, 400, "The " + what + " name '" + valid_utf8(name.substr(0, 300)) +
                      "' is not valid: up to 256 letters, digits, '_', '.', '@', '-'");
  return false;
}

int int_param(const httplib::Request &req, const char *key, int dflt, int max) {
  if (!req.has_param(key)) return dflt;
  try {
    return std::clamp(std::stoi(req.get_param_value(key)), 0, max);
  } catch (...) {
    return dflt;
  }
}

// OpenWhisk's answer to an invocation: 202 with the id, or the record (or its result).
void invocation_reply(httplib::Response &res, const std::string &id, bool finished, const json &record, bool result_only) {
  if (!finished) {
    reply(res, 202, {{"activationId", id}});
    return;
  }
  bool ok = record["response"]["success"].get<bool>();
  int status = ok ? 200 : (record["response"]["status"] == "whisk internal error" ? 500 : 502);
  reply(res, status, result_only ? record["response"]["result"] : record);
}

json action_view(const json &doc) {
  json v = doc;
  v["exec"].erase("code");
  v["exec"]["binary"] = false;
  v["version"] = "0.0." + std::to_string(doc.value("version", int64_t(1)));
  return v;
}

json app_view(const json &doc) {
  json files = json::array();
  for (auto &[f, c] : doc["files"].items()) files.push_back(f);
  return {{"namespace", doc["namespace"]}, {"name", doc["name"]}, {"version", doc["version"]},
          {"updated", doc.value("updated", int64_t(0))}, {"manifest", doc["manifest"]}, {"files", files}};
}

void internal_error(const httplib::Request &, httplib::Response &res, std::exception_ptr ep) {
  std::string what = "unknown";
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception &e) {
    what = e.what();
  } catch (...) {
  }
  error(res, 500, "internal error: " + valid_utf8(what));
}

// The public API's routes: each tells the connection guard when its handling begins (the body is
// read by then), so the time a handler takes is the server's and never counts against the client.
struct Routes {
  httplib::Server &srv;
  ConnectionGuard *guard;

  httplib::Server::Handler timed(httplib::Server::Handler h) const {
    if (!guard) return h;
    return [g = guard, h = std::move(h)](const httplib::Request &req, httplib::Response &res) {
      g->handling(req);
      h(req, res);
    };
  }
  void Get(const std::string &p, httplib::Server::Handler h) { srv.Get(p, timed(std::move(h))); }
  void Post(const std::string &p, httplib::Server::Handler h) { srv.Post(p, timed(std::move(h))); }
  void Put(const std::string &p, httplib::Server::Handler h) { srv.Put(p, timed(std::move(h))); }
  void Delete(const std::string &p, httplib::Server::Handler h) { srv.Delete(p, timed(std::move(h))); }
};

const std::string NS = "/api/v1/namespaces/([^/]+)";
// POST to an action or an application (install_routes makes it: it holds the blocking waits).
using InvokeRoute = std::function<httplib::Server::Handler(const std::string &table)>;

// OpenWhisk actions: list, put (validated limits), get, delete, invoke.
void action_routes(Routes &routes, Store &store, Engine &engine, const ApiOptions &opts, const InvokeRoute &invoke_route) {
  routes.Get(NS + "/actions", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    json out = json::array();
    for (auto &d : store.list_docs("actions", ns)) out.push_back(action_view(d));
    reply(res, 200, out);
  });
  routes.Put(NS + "/actions/([^/]+)", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]), name = req.matches[2];
    json body;
    if (ns.empty() || !check_name(res, "action", name) || !parse_body(req, res, &body, false)) return;
    auto old = store.get_doc("actions", ns, name);
    if (old && req.get_param_value("overwrite") != "true") {
      error(res, 409, "resource already exists: use ?overwrite=true to replace action '" + name + "'");
      return;
    }
    if (!body.is_object()) {
      error(res, 400, "the body must be an action: {\"exec\": {\"kind\": \"python:3\", \"code\": \"...\"}, ...}");
      return;
    }
    const json exec = body.value("exec", json::object());
    std::string kind = get_string(exec, "kind").value_or("");
    if (kind.rfind("python", 0) != 0 || !get_string(exec, "code")) {
      error(res, 400, "exec must be {\"kind\": \"python:3\", \"code\": \"...\"} (kind '" + kind.substr(0, 64) +
                          "' is not supported)");
      return;
    }
    json params = body.value("parameters", json::array());
    for (auto &p : params.is_array() ? params : json::array())
      if (!get_string(p, "key") || !p.contains("value")) params = nullptr;
    if (!params.is_array()) {
      error(res, 400, "parameters must be a list of {\"key\": NAME, \"value\": VALUE}");
      return;
    }
    json limits;
    std::string why;
    if (!validate_limits(body.value("limits", json::object()), opts.limits, &limits, &why)) {
      error(res, 400, why);
      return;
    }
    if (exec.contains("main") && !exec["main"].is_string()) {
      error(res, 400, "exec.main must be the name of the function to call");
      return;
    }
    json annotations = body.value("annotations", json::array());
    if (!annotations.is_array()) {
      error(res, 400, "annotations must be a list of {\"key\": NAME, \"value\": VALUE}");
      return;
    }
    json doc = {{"namespace", ns}, {"name", name},
                {"exec", {{"kind", kind}, {"code", exec["code"]}, {"main", exec.value("main", "main")}}},
                {"parameters", params}, {"limits", limits},
                {"annotations", annotations}, {"publish", false},
                {"version", store.next_version("actions", ns, name)}, {"code_hash", sha256_hex(exec["code"].get<std::string>())}};
    store.put_doc("actions", ns, name, doc);
    reply(res, 200, action_view(doc));
  });
  routes.Get(NS + "/actions/([^/]+)", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto doc = store.get_doc("actions", ns, req.matches[2]);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    json v = action_view(*doc);
    if (req.get_param_value("code") != "false") v["exec"]["code"] = (*doc)["exec"]["code"];
    reply(res, 200, v);
  });
  routes.Delete(NS + "/actions/([^/]+)", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto doc = store.get_doc("actions", ns, req.matches[2]);
    if (!doc || !store.delete_doc("actions", ns, req.matches[2])) return error(res, 404, "The requested resource does not exist.");
    engine.forget_code(ns, "actions", req.matches[2]);
    reply(res, 200, action_view(*doc));
  });
  routes.Post(NS + "/actions/([^/]+)", invoke_route("actions"));
}

// Activations: list, get, logs, result (each namespace its own only).
void activation_routes(Routes &routes, Store &store, const ApiOptions &opts) {
  routes.Get(NS + "/activations", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto list = store.list_activations(ns, req.get_param_value("name"), int_param(req, "limit", 30, 200),
                                       int_param(req, "skip", 0, 1 << 30));
    json out = json::array();
    bool docs = req.get_param_value("docs") == "true";
    for (auto &r : list) {
      if (!docs) {
        r.erase("logs");
        r["response"].erase("result");
      }
      out.push_back(r);
    }
    reply(res, 200, out);
  });
  routes.Get(NS + "/activations/([^/]+)(/logs|/result)?", [&, opts](const httplib::Request &req, httplib::Response &res) {
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

// Applications: list, deploy (a validated manifest, a new version), get, delete, invoke.
void app_routes(Routes &routes, Store &store, Engine &engine, const ApiOptions &opts, const InvokeRoute &invoke_route) {
  routes.Get(NS + "/apps", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    json out = json::array();
    for (auto &d : store.list_docs("apps", ns)) out.push_back(app_view(d));
    reply(res, 200, out);
  });
  routes.Put(NS + "/apps/([^/]+)", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]), name = req.matches[2];
    json body;
    if (ns.empty() || !check_name(res, "application", name) || !parse_body(req, res, &body, false)) return;
    if (!body.contains("manifest") || !body.contains("files") || !body["files"].is_object()) {
      error(res, 400, "the body must be {\"manifest\": TEXT-or-OBJECT, \"files\": {NAME: CONTENT}}");
      return;
    }
    json manifest = body["manifest"];
    std::string why;
    if (manifest.is_string() && !manifest_to_json(manifest.get<std::string>(), &manifest, &why))
      return error(res, 400, why, {{"problems", {why}}});
    std::set<std::string> files;
    for (auto &[f, c] : body["files"].items()) {
      if (!c.is_string() || f.find("..") != std::string::npos || f.empty() || f[0] == '/')
        return error(res, 400, "file '" + f + "': names must be relative paths inside the application, content text");
      files.insert(f);
    }
    Capacity cap = engine.capacity();
    cap.max_timeout_ms = opts.limits.timeout_ms.max;
    Manifest parsed;
    auto problems = validate_manifest(manifest, files, cap, &parsed);
    if (problems.empty() && widest_wave(parsed) > engine.quotas().instances)
      problems.push_back("the application runs " + std::to_string(widest_wave(parsed)) +
                         " compute instances side by side; a namespace may run " +
                         std::to_string(engine.quotas().instances));
    if (auto mname = get_string(manifest, "name"); mname && *mname != name)
      problems.push_back("the manifest's name '" + *mname + "' differs from '" + name + "'");
    if (!problems.empty())
      return error(res, 400, "invalid manifest: " + std::to_string(problems.size()) + " problem(s); nothing was deployed",
                   {{"problems", problems}});
    json doc = {{"namespace", ns}, {"name", name}, {"manifest", manifest}, {"files", body["files"]},
                {"version", store.next_version("apps", ns, name)}, {"code_hash", sha256_hex(dump_json(body["files"]))}};
    store.put_doc("apps", ns, name, doc);
    reply(res, 200, app_view(doc));
  });
  routes.Get(NS + "/apps/([^/]+)", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto doc = store.get_doc("apps", ns, req.matches[2]);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    reply(res, 200, app_view(*doc));
  });
  routes.Delete(NS + "/apps/([^/]+)", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    if (!store.delete_doc("apps", ns, req.matches[2])) return error(res, 404, "The requested resource does not exist.");
    engine.forget_code(ns, "apps", req.matches[2]);
    reply(res, 200, {{"deleted", req.matches[2].str()}});
  });
  routes.Post(NS + "/apps/([^/]+)", invoke_route("apps"));
}

// A namespace's live elements, the hosts, and hosts registering (host_registry.h).
void element_and_host_routes(Routes &routes, Store &store, Engine &engine, const ApiOptions &opts) {
  routes.Get(NS + "/elements", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (!ns.empty()) reply(res, 200, engine.elements(ns));
  });
  routes.Get("/api/v1/hosts", [&, opts](const httplib::Request &req, httplib::Response &res) {
    if (authenticate(store, req, res).empty()) return;
    reply(res, 200, engine.host_info());
  });

  // ---- agents of other hosts register (and heartbeat) (host_registry.h) ----
  auto registry = std::make_shared<HostRegistry>(store, engine, opts.cluster_token, opts.host_keys);
  routes.Post("/api/v1/hosts/register", [registry](const httplib::Request &req, httplib::Response &res) {
    std::string h = req.get_header_value("Authorization");
    std::string bearer = h.rfind("Bearer ", 0) == 0 ? h.substr(7) : "";
    if (!registry->accepts_hosts())
      return error(res, 401, "registering a host needs the cluster token (scad-server --cluster-token-file)");
    json b;
    if (!parse_body(req, res, &b, false)) return;
    HostRegistry::Outcome o = registry->register_host(bearer, b);
    if (o.status != 200) return error(res, o.status, o.error);
    reply(res, 200, {{"registered", b["id"]}});
  });
}

}  // namespace

void install_routes(httplib::Server &srv, Store &store, Engine &engine, ApiOptions opts) {
  srv.set_payload_max_length(opts.max_body);
  // Credentials before the body: a request that carries one (up to max_body) is authenticated
  // from its headers before a byte of it is read, so strangers cannot make the server read
  // 64 MiB each. (The pre-routing handler runs before httplib reads the content.)
  if (opts.guard)
    srv.set_post_routing_handler([guard = opts.guard](const httplib::Request &req, httplib::Response &res) {
      guard->response_ready(req, res);
    });
  srv.set_pre_routing_handler([&store, guard = opts.guard](const httplib::Request &req, httplib::Response &res) {
    if (guard) guard->headers_read(req);
    bool has_body = req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0";
    bool chunked = req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos;
    if ((!has_body && !chunked) || req.path.rfind("/api/v1/namespaces/", 0) != 0) return httplib::Server::HandlerResponse::Unhandled;
    if (!authenticate(store, req, res).empty()) return httplib::Server::HandlerResponse::Unhandled;
    res.set_header("Connection", "close");  // the unread body must not be taken for a request
    return httplib::Server::HandlerResponse::Handled;
  });
  Routes routes{srv, opts.guard};

  // POST to an action or an application: the same OpenWhisk semantics for both. A blocking invoke
  // holds one of the server's threads while it waits: at most max_blocking_waits do, and the
  // others are answered at once with the activation id (202), as OpenWhisk does when its wait ends.
  auto waiting = std::make_shared<std::atomic<int>>(0);
  InvokeRoute invoke_route = [&, opts, waiting](const std::string &table) -> httplib::Server::Handler {
    return [&, opts, table, waiting](const httplib::Request &req, httplib::Response &res) {
      std::string ns = authorize(store, req, res, req.matches[1]);
      json params;
      if (ns.empty() || !parse_body(req, res, &params)) return;
      auto doc = store.get_doc(table, ns, req.matches[2]);
      if (!doc) return error(res, 404, "The requested resource does not exist.");
      int64_t wait = req.get_param_value("blocking") == "true" ? opts.blocking_wait_ms : 0;
      if (wait && waiting->fetch_add(1) >= opts.max_blocking_waits) {
        waiting->fetch_sub(1);
        wait = 0;
      }
      struct Done {
        std::atomic<int> *n;
        bool counted;
        ~Done() { if (counted) n->fetch_sub(1); }
      } done{waiting.get(), wait > 0};
      Engine::Started started;
      EngineError e = table == "apps" ? engine.invoke_app(ns, *doc, params, wait, &started)
                                      : engine.invoke_action(ns, *doc, params, wait, &started);
      if (e) return error(res, http_status(e.kind), e.message);
      invocation_reply(res, started.id, started.finished, started.record, req.get_param_value("result") == "true");
    };
  };

  routes.Get("/api/v1", [](const httplib::Request &, httplib::Response &res) {
    reply(res, 200, {{"description", "Scad: a serverless runtime for disaggregated applications"},
                     {"api_paths", {"/api/v1"}}, {"openwhisk_compatible", true}});
  });
  // Prometheus scrapes without credentials: the metrics are aggregates that name no tenant.
  if (opts.metrics)
    routes.Get("/metrics", [&engine, opts](const httplib::Request &, httplib::Response &res) {
      res.set_content(opts.metrics->render(engine.host_info(), opts.guard ? opts.guard->counts() : ConnectionGuard::Counts{}),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
  routes.Get("/api/v1/namespaces", [&, opts](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authenticate(store, req, res);
    if (!ns.empty()) reply(res, 200, json::array({ns}));
  });

  action_routes(routes, store, engine, opts, invoke_route);
  activation_routes(routes, store, opts);
  app_routes(routes, store, engine, opts, invoke_route);
  element_and_host_routes(routes, store, engine, opts);
  srv.set_exception_handler(internal_error);
}

void install_runtime_routes(httplib::Server &srv, Engine &engine) {
  srv.set_payload_max_length(1 << 20);
  // ---- the runtime endpoint for running actions (bearer token per compute instance) ----
  auto bearer = [](const httplib::Request &req) {
    std::string h = req.get_header_value("Authorization");
    return h.rfind("Bearer ", 0) == 0 ? h.substr(7) : std::string();
  };
  srv.Post("/v1/actions/([^/]+)/elements", [&engine, bearer](const httplib::Request &req, httplib::Response &res) {
    json body, out;
    if (!parse_body(req, res, &body, false)) return;
    if (EngineError e = engine.runtime_invoke(bearer(req), req.matches[1], body, &out))
      return reply(res, http_status(e.kind), {{"error", e.message}});
    reply(res, 201, out);
  });
  srv.Delete("/v1/actions/([^/]+)/elements/([^/]+)", [&engine, bearer](const httplib::Request &req, httplib::Response &res) {
    if (EngineError e = engine.runtime_release(bearer(req), req.matches[1], req.matches[2]))
      return reply(res, http_status(e.kind), {{"error", e.message}});
    reply(res, 204, json());
  });

  srv.set_exception_handler(internal_error);
}

}  // namespace scad
