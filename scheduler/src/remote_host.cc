#include "remote_host.h"

#include <httplib.h>

#include "agent_api.h"
#include "safe_json.h"

namespace scad {

namespace {
int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
constexpr int64_t kDeadAfterMs = 6000;  // three missed heartbeats
}  // namespace

bool RemoteHost::alive() const { return steady_ms() - last_seen_ms_.load() < kDeadAfterMs; }
void RemoteHost::heartbeat() { last_seen_ms_ = steady_ms(); }

static std::unique_ptr<httplib::Client> client(const std::string &url, const std::string &token, int timeout_s) {
  auto c = std::make_unique<httplib::Client>(url);
  c->set_bearer_token_auth(token.c_str());
  c->set_tcp_nodelay(true);  // a request's headers and body are separate writes (see main.cc)
  c->set_connection_timeout(3);
  c->set_read_timeout(timeout_s);
  c->set_write_timeout(timeout_s);
  return c;
}

static std::string error_of(const httplib::Result &res, const std::string &url) {
  if (!res) return "agent at " + url + " unreachable: " + httplib::to_string(res.error());
  json j;
  std::string why;
  auto error = parse_json(res->body, &j, &why) ? get_string(j, "error") : std::nullopt;
  return error ? valid_utf8(*error) : "agent answered HTTP " + std::to_string(res->status);
}

int RemoteHost::create_element(const std::string &id, uint64_t size, bool prefetch, std::string *why) {
  json body = {{"id", id}, {"size", size}};
  if (prefetch) body["prefetch"] = true;  // an agent of an earlier version takes the element without it
  auto res = client(url_, token_, 30)->Post("/agent/v1/elements", dump_json(body), "application/json");
  if (res && res->status == 201) return 0;
  *why = error_of(res, url_);
  return -1;
}

void RemoteHost::remove_element(const std::string &id) { client(url_, token_, 30)->Delete("/agent/v1/elements/" + id); }

int RemoteHost::grant(const std::string &element, const std::string &client_id, unsigned rights,
                      const std::string &trans_name, const std::string &impl, TransportGrant *out, std::string *why) {
  json body = {{"element", element}, {"client", client_id}, {"rights", rights}, {"name", trans_name}, {"impl", impl}};
  auto res = client(url_, token_, 30)->Post("/agent/v1/grants", dump_json(body), "application/json");
  if (!res || res->status != 200) {
    *why = error_of(res, url_);
    return -1;
  }
  json j;
  std::string bad;
  auto durl = parse_json(res->body, &j, &bad) ? get_string(j, "durl") : std::nullopt;
  auto config = get_string(j, "config"), grant_id = get_string(j, "grant_id");
  if (!durl || !config || !grant_id) {
    *why = "agent at " + url_ + " answered a grant without string \"durl\", \"config\" and \"grant_id\"";
    return -1;
  }
  *out = {*durl, *config, *grant_id};
  return 0;
}

int RemoteHost::revoke(const std::string &grant_id, std::string *why) {
  auto res = client(url_, token_, 10)->Delete("/agent/v1/grants/" + grant_id);
  if (res && res->status == 204) return 0;
  *why = error_of(res, url_);
  return -1;
}

int RemoteHost::notify(const std::string &aid, const json &notice) {
  auto res = client(url_, token_, 10)->Post("/agent/v1/notices", dump_json(json{{"aid", aid}, {"notice", notice}}),
                                           "application/json");
  return res && res->status == 204 ? 0 : -1;
}

void RemoteHost::remove_code(const std::string &prefix) {
  client(url_, token_, 10)->Post("/agent/v1/code/remove", dump_json(json{{"prefix", prefix}}), "application/json");
}

ComputeOutcome RemoteHost::run_compute(const ComputeSpec &spec) {
  auto res = client(url_, token_, int(spec.timeout_ms / 1000) + 30)->Post("/agent/v1/run", dump_json(to_json(spec)), "application/json");
  json j;
  std::string why = error_of(res, url_);
  ComputeOutcome o;
  if (res && res->status == 200 && parse_json(res->body, &j, &why) && outcome_from_json(j, &o, &why)) return o;
  o = ComputeOutcome{};
  o.status = "whisk internal error";
  o.error = {{"type", "AgentError"}, {"message", "running on host '" + id_ + "' failed: " + why}};
  return o;
}

}  // namespace scad
