#include "api_util.h"

#include <openssl/evp.h>

#include <set>

#include "host_registry.h"
#include "safe_json.h"
#include "secrets.h"

namespace scad::api {

const std::string NS = "/api/v1/namespaces/([^/]+)";

std::string txid() { return random_hex(16); }

void reply(httplib::Response &res, int status, const json &body) {
  res.status = status;
  if (!body.is_null()) res.set_content(dump_json(body), "application/json");
}

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

void error(httplib::Response &res, int status, const std::string &msg, json extra) {
  json body = {{"error", msg}, {"code", txid()}};
  body.update(extra);
  reply(res, status, body);
}

static std::string b64decode(const std::string &in) {
  if (in.empty() || in.size() % 4) return "";
  std::string out(in.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char *>(out.data()), reinterpret_cast<const unsigned char *>(in.data()),
                          int(in.size()));
  if (n < 0) return "";
  size_t pad = (in.end()[-1] == '=') + (in.end()[-2] == '=');
  out.resize(size_t(n) - pad);
  return out;
}

std::string authenticate(Store &store, const httplib::Request &req, httplib::Response &res, std::string *creds_out) {
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
  if (creds_out) *creds_out = creds;
  return *ns;
}

std::string authorize(Store &store, const httplib::Request &req, httplib::Response &res, const std::string &path_ns,
                      std::string *creds) {
  std::string ns = authenticate(store, req, res, creds);
  if (ns.empty()) return "";
  if (path_ns != "_" && path_ns != ns) {
    error(res, 403, "The supplied authentication is not authorized to access '" + valid_utf8(path_ns.substr(0, 300)) + "'.");
    return "";
  }
  return ns;
}

bool parse_body(const httplib::Request &req, httplib::Response &res, json *out, bool allow_empty) {
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
  if (valid_entity_name(name)) return true;
  error(res, 400, "The " + what + " name '" + valid_utf8(name.substr(0, 300)) +
                      "' is not valid: up to 256 letters, digits, '_', '.', '@', '-'");
  return false;
}

bool key_value_list(const json &j) {
  if (!j.is_array()) return false;
  for (auto &p : j)
    if (!get_string(p, "key") || !p.contains("value")) return false;
  return true;
}

json key_value(const json &list, const std::string &key) {
  if (list.is_array())
    for (auto &p : list)
      if (get_string(p, "key").value_or("") == key && p.contains("value")) return p["value"];
  return nullptr;
}

bool entity_fields(httplib::Response &res, const json &body, const std::optional<json> &old, json *doc) {
  auto field = [&](const char *key, json dflt) {
    return body.contains(key) ? body[key] : old ? old->value(key, dflt) : dflt;
  };
  json params = field("parameters", json::array()), annotations = field("annotations", json::array());
  json publish = field("publish", false);
  if (!key_value_list(params) || !key_value_list(annotations)) {
    error(res, 400, "parameters and annotations must be lists of {\"key\": NAME, \"value\": VALUE}");
    return false;
  }
  if (!publish.is_boolean()) {
    error(res, 400, "publish must be true or false");
    return false;
  }
  *doc = {{"parameters", params}, {"annotations", annotations}, {"publish", publish}};
  return true;
}

bool may_write(const httplib::Request &req, httplib::Response &res, const std::optional<json> &old,
               const std::string &kind, const std::string &name) {
  if (!old || req.get_param_value("overwrite") == "true") return true;
  error(res, 409, "resource already exists: use ?overwrite=true to replace " + kind + " '" + name + "'");
  return false;
}

bool list_page(const httplib::Request &req, httplib::Response &res, const std::string &collection, ListPage *out) {
  const std::string limit = req.get_param_value("limit"), skip = req.get_param_value("skip");
  std::string why = parse_list_page(collection, req.has_param("limit") ? &limit : nullptr,
                                    req.has_param("skip") ? &skip : nullptr, out);
  if (why.empty()) return true;
  error(res, 400, why);
  return false;
}

void list_collection(Store &store, const httplib::Request &req, httplib::Response &res, const std::string &ns,
                     const std::string &collection, const std::function<json(const json &)> &view) {
  ListPage page;
  if (!list_page(req, res, collection, &page)) return;
  if (req.get_param_value("count") == "true")
    return reply(res, 200, {{collection, std::max<int64_t>(0, store.count_docs(collection, ns) - page.skip)}});
  json out = json::array();
  for (auto &d : store.list_page(collection, ns, page.skip, page.limit)) out.push_back(view(d));
  reply(res, 200, out);
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

httplib::Server::Handler Routes::timed(httplib::Server::Handler h) const {
  if (!guard) return h;
  return [g = guard, h = std::move(h)](const httplib::Request &req, httplib::Response &res) {
    g->handling(req);
    h(req, res);
  };
}
void Routes::Get(const std::string &p, httplib::Server::Handler h) {
  known->emplace_back("GET", std::regex(p));
  srv.Get(p, timed(std::move(h)));
}
void Routes::Post(const std::string &p, httplib::Server::Handler h) {
  known->emplace_back("POST", std::regex(p));
  srv.Post(p, timed(std::move(h)));
}
void Routes::Put(const std::string &p, httplib::Server::Handler h) {
  known->emplace_back("PUT", std::regex(p));
  srv.Put(p, timed(std::move(h)));
}
void Routes::Delete(const std::string &p, httplib::Server::Handler h) {
  known->emplace_back("DELETE", std::regex(p));
  srv.Delete(p, timed(std::move(h)));
}

void Routes::fallback() {
  auto answer = [known = known](const httplib::Request &req, httplib::Response &res) {
    std::set<std::string> allowed;
    for (auto &[method, pattern] : *known)
      if (std::regex_match(req.path, pattern)) allowed.insert(method);
    if (allowed.empty()) return error(res, 404, "The requested resource does not exist.");
    std::string allow;
    for (auto &m : allowed) allow += (allow.empty() ? "" : ", ") + m;
    res.set_header("Allow", allow);
    error(res, 405, "HTTP method not allowed, supported methods: " + allow);
  };
  const std::string any = ".*";
  srv.Get(any, timed(answer));
  srv.Post(any, timed(answer));
  srv.Put(any, timed(answer));
  srv.Delete(any, timed(answer));
  srv.Patch(any, timed(answer));
  srv.Options(any, timed(answer));
}

json action_view(const json &doc, bool with_code) {
  json v = doc;
  json &exec = v["exec"];
  if (!with_code) exec.erase("code");
  if (!exec.contains("binary") && exec.value("kind", std::string()) != "sequence") exec["binary"] = false;
  if (doc.contains("package")) {
    v["namespace"] = doc["namespace"].get<std::string>() + "/" + doc["package"].get<std::string>();
    v.erase("package");
  }
  v.erase("code_hash");
  v["version"] = "0.0." + std::to_string(doc.value("version", int64_t(1)));
  return v;
}

}  // namespace scad::api
