#include "api.h"

#include "api_util.h"

#include <openssl/evp.h>

#include <functional>
#include <set>

#include "action_limits.h"
#include "host_registry.h"
#include "secrets.h"
#include "safe_json.h"

namespace scad {

namespace {

using namespace api;

json app_view(const json &doc) {
  json files = json::array();
  for (auto &[f, c] : doc["files"].items()) files.push_back(f);
  return {{"namespace", doc["namespace"]}, {"name", doc["name"]}, {"version", doc["version"]},
          {"updated", doc.value("updated", int64_t(0))}, {"manifest", doc["manifest"]}, {"files", files}};
}

// Applications: list, deploy (a validated manifest, a new version), get, delete, invoke.
void app_routes(Routes &routes, Store &store, Engine &engine, const ApiOptions &opts, std::shared_ptr<Invoker> invoker) {
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
  routes.Post(NS + "/apps/([^/]+)", [&, invoker](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    json params;
    if (ns.empty() || !parse_body(req, res, &params)) return;
    auto doc = store.get_doc("apps", ns, req.matches[2]);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    invoker->invoke(req, res, ns, "", "apps", *doc, params);
  });
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
  // Blocking invokes (actions, applications, web actions) hold a server thread while they wait:
  // at most max_blocking_waits do, and the others are answered at once with the activation id
  // (202), as OpenWhisk does when its wait ends. The handlers that invoke share it.
  auto invoker = std::make_shared<Invoker>(Invoker{store, engine, opts});

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

  action_routes(routes, store, engine, opts, invoker);
  activation_routes(routes, store);
  package_routes(routes, store, engine);
  trigger_routes(routes, store, engine, invoker);
  web_routes(routes, store, engine, invoker);
  app_routes(routes, store, engine, opts, invoker);
  element_and_host_routes(routes, store, engine, opts);
  routes.fallback();
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
