#include "launcher_reply.h"

#include "safe_json.h"

namespace scad {

using nlohmann::json;

bool parse_launcher_reply(const std::string &line, LauncherReply *out, std::string *why) {
  json j;
  if (!parse_json(line, &j, why)) return false;
  auto ok = get_bool(j, "ok");
  if (!ok) {
    *why = "it is not an object with a boolean \"ok\"";
    return false;
  }
  LauncherReply r;
  r.ok = *ok;
  r.init_ms = std::max<int64_t>(0, get_int(j, "init_ms").value_or(0));
  if (j.contains("transports")) r.transports = transport_usage_from_json(j["transports"]);
  if (j.contains("transfers")) r.transfers = transfers_from_json(j["transfers"]);
  if (r.ok) {
    if (!j.contains("result")) {
      *why = "it has \"ok\": true but no \"result\"";
      return false;
    }
    r.result = j["result"];
  } else {
    // The error as the launcher builds it; whatever else is there is kept as the message.
    const json e = j.contains("error") ? j["error"] : json();
    auto type = get_string(e, "type");
    auto message = get_string(e, "message");
    r.error = {{"type", type.value_or("Error")},
               {"message", message ? *message : e.is_string() ? e.get<std::string>() : dump_json(e)}};
    r.traceback = get_string(e, "traceback").value_or("");
    auto init = get_string(e, "init");
    if (init && (*init == "build" || *init == "start")) r.init = *init;
  }
  *out = std::move(r);
  return true;
}

}  // namespace scad
