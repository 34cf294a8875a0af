// OpenWhisk packages: a folder of actions with parameters bound for all of them (under each
// action's own and the invocation's: engine.cc, invoke_action). Bindings to other namespaces'
// packages are not supported (400). A package is deleted only when empty (409), as OpenWhisk.
#include "api_util.h"
#include "safe_json.h"

namespace scad::api {

namespace {

json package_actions(Store &store, const std::string &ns, const std::string &pkg) {
  json out = json::array();
  for (auto &d : store.list_page("actions", ns, 0, -1))
    if (d.value("package", std::string()) == pkg)
      out.push_back({{"name", d["name"]}, {"version", "0.0." + std::to_string(d.value("version", int64_t(1)))},
                     {"annotations", d.value("annotations", json::array())}});
  return out;
}

json package_view(const json &doc) {
  json v = doc;
  v["version"] = "0.0." + std::to_string(doc.value("version", int64_t(1)));
  v["binding"] = json::object();
  return v;
}

}  // namespace

void package_routes(Routes &routes, Store &store, Engine &) {
  routes.Get(NS + "/packages/?", [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    list_collection(store, req, res, ns, "packages", package_view);
  });
  const std::string one = NS + "/packages/([^/]+)";
  routes.Put(one, [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]), name = req.matches[2];
    json body;
    if (ns.empty() || !check_name(res, "package", name) || !parse_body(req, res, &body)) return;
    if (!body.is_object()) return error(res, 400, "The request content was malformed: the body must be a package");
    if (body.contains("binding") && !(body["binding"].is_object() && body["binding"].empty()))
      return error(res, 400, "package bindings are not supported by this platform");
    auto old = store.get_doc("packages", ns, name);
    json doc;
    if (!may_write(req, res, old, "package", name) || !entity_fields(res, body, old, &doc)) return;
    doc.update({{"namespace", ns}, {"name", name}, {"version", store.next_version("packages", ns, name)}});
    store.put_doc("packages", ns, name, doc);
    reply(res, 200, package_view(doc));
  });
  routes.Get(one, [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]);
    if (ns.empty()) return;
    auto doc = store.get_doc("packages", ns, req.matches[2]);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    json v = package_view(*doc);
    v["actions"] = package_actions(store, ns, req.matches[2]);
    v["feeds"] = json::array();
    reply(res, 200, v);
  });
  routes.Delete(one, [&](const httplib::Request &req, httplib::Response &res) {
    std::string ns = authorize(store, req, res, req.matches[1]), name = req.matches[2];
    if (ns.empty()) return;
    auto doc = store.get_doc("packages", ns, name);
    if (!doc) return error(res, 404, "The requested resource does not exist.");
    size_t n = package_actions(store, ns, name).size();
    if (n) return error(res, 409, "Package not empty (contains " + std::to_string(n) + (n == 1 ? " entity)" : " entities)"));
    store.delete_doc("packages", ns, name);
    reply(res, 200, package_view(*doc));
  });
}

}  // namespace scad::api
