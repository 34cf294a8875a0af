// libFuzzer target: what the daemons read from processes that run user code or sit on other
// hosts — the launcher's result line, an agent's outcome and compute spec — and the UTF-8
// repair applied to log lines. Any bytes must be taken or refused; nothing may throw or crash.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "agent_api.h"
#include "launcher_reply.h"
#include "safe_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  std::string fixed = scad::valid_utf8(text);
  if (scad::valid_utf8(fixed) != fixed) abort();         // the repair is complete
  nlohmann::json line = fixed;
  if (scad::dump_json(line).empty()) abort();

  scad::LauncherReply reply;
  std::string why;
  if (scad::parse_launcher_reply(text, &reply, &why)) {
    if (!reply.ok && !(reply.error["message"].is_string() && reply.error["type"].is_string())) abort();
    if (reply.init_ms < 0) abort();
  } else if (why.empty()) {
    abort();
  }
  nlohmann::json j;
  if (scad::parse_json(text, &j, &why)) {
    scad::ComputeOutcome o;
    if (scad::outcome_from_json(j, &o, &why) && o.ok != (o.status == "success")) abort();
    try {
      scad::spec_from_json(j);  // the agent's route catches json::exception: nothing else may escape
    } catch (const nlohmann::json::exception &) {
    }
  }
  return 0;
}
