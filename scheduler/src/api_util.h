// What the REST API's route files share (api.cc, api_actions.cc, api_activations.cc,
// api_packages.cc, api_triggers.cc, api_web.cc): OpenWhisk's error bodies, Basic authentication
// and its namespace check, bodies parsed with limits, and the table of routes (which also answers
// unknown paths with 404 and unsupported methods with 405). Not part of the API's interface.
#pragma once
#include <httplib.h>

#include <functional>
#include <memory>
#include <optional>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "api.h"
#include "list_page.h"

namespace scad::api {

using nlohmann::json;

// A transaction id: the `code` of OpenWhisk's error bodies, __OW_TRANSACTION_ID of actions.
std::string txid();
void reply(httplib::Response &res, int status, const json &body);
// OpenWhisk's error body: {"error": msg, "code": transaction id} (plus extra members).
void error(httplib::Response &res, int status, const std::string &msg, json extra = json::object());
// The HTTP status of each kind of refusal from the engine.
int http_status(Refusal kind);

// The namespace the request's Basic credentials authenticate, or "" (and the error sent). *creds
// gets the "uuid:key" itself when asked (for actions annotated provide-api-key; never logged).
std::string authenticate(Store &store, const httplib::Request &req, httplib::Response &res,
                         std::string *creds = nullptr);
// Authenticates and checks that the path's namespace is the caller's ("_" means the caller's own).
std::string authorize(Store &store, const httplib::Request &req, httplib::Response &res, const std::string &path_ns,
                      std::string *creds = nullptr);

bool parse_body(const httplib::Request &req, httplib::Response &res, json *out, bool allow_empty = true);
bool check_name(httplib::Response &res, const std::string &what, const std::string &name);
// {"key", "value"} lists (parameters, annotations): false when it is not one.
bool key_value_list(const json &j);
// The value of a key in such a list, or null.
json key_value(const json &list, const std::string &key);

// The fields every entity (package, trigger) has: parameters, annotations and publish, from a PUT's
// body, and where the body leaves one out, from the stored document `old` (what ?overwrite=true
// keeps). Starts *doc with them, or answers 400 and returns false.
bool entity_fields(httplib::Response &res, const json &body, const std::optional<json> &old, json *doc);
// A PUT on an entity that exists needs ?overwrite=true: false with the 409 sent otherwise.
bool may_write(const httplib::Request &req, httplib::Response &res, const std::optional<json> &old,
               const std::string &kind, const std::string &name);

// GET of a collection (actions, packages, triggers, rules) as OpenWhisk answers it: `limit` and
// `skip` (list_page.h; 400 with its message), `count=true` for {"<collection>": N} (those past
// skip), the entries most recently updated first, each as `view` shows it.
void list_collection(Store &store, const httplib::Request &req, httplib::Response &res, const std::string &ns,
                     const std::string &collection, const std::function<json(const json &)> &view);
// The page a listing asks for; false with the 400 sent.
bool list_page(const httplib::Request &req, httplib::Response &res, const std::string &collection, ListPage *out);

// The exception handler: a 500 with OpenWhisk's body.
void internal_error(const httplib::Request &, httplib::Response &res, std::exception_ptr ep);

// The public API's routes: each tells the connection guard when its handling begins (the body is
// read by then), so the time a handler takes is the server's and never counts against the client.
// Every pattern is remembered: a path that some route takes with another method gets 405.
struct Routes {
  httplib::Server &srv;
  ConnectionGuard *guard;
  std::shared_ptr<std::vector<std::pair<std::string, std::regex>>> known =
      std::make_shared<std::vector<std::pair<std::string, std::regex>>>();

  httplib::Server::Handler timed(httplib::Server::Handler h) const;
  void Get(const std::string &p, httplib::Server::Handler h);
  void Post(const std::string &p, httplib::Server::Handler h);
  void Put(const std::string &p, httplib::Server::Handler h);
  void Delete(const std::string &p, httplib::Server::Handler h);
  // Last: every other request gets 405 (its path is known with other methods) or 404, with
  // OpenWhisk's error body.
  void fallback();
};

extern const std::string NS;  // "/api/v1/namespaces/([^/]+)"

// POST to an action or an application: holds the blocking waits (install_routes makes it).
struct Invoker {
  Store &store;
  Engine &engine;
  ApiOptions opts;
  std::shared_ptr<std::atomic<int>> waiting = std::make_shared<std::atomic<int>>(0);
  // Invokes doc (an action, or an app when table is "apps") as the request asks (blocking, result,
  // timeout) and answers as OpenWhisk does.
  void invoke(const httplib::Request &req, httplib::Response &res, const std::string &ns, const std::string &creds,
              const std::string &table, const json &doc, const json &params) const;
};

void action_routes(Routes &routes, Store &store, Engine &engine, const ApiOptions &opts, std::shared_ptr<Invoker> invoker);
void activation_routes(Routes &routes, Store &store);
void package_routes(Routes &routes, Store &store, Engine &engine);
void trigger_routes(Routes &routes, Store &store, Engine &engine, std::shared_ptr<Invoker> invoker);
void web_routes(Routes &routes, Store &store, Engine &engine, std::shared_ptr<Invoker> invoker);

// An action's document as clients see it (no code unless asked; OpenWhisk's semantic version).
json action_view(const json &doc, bool with_code = false);

}  // namespace scad::api
