// The one line the Python launcher writes per run (scad.launcher): {"ok": true, "result": ...} or
// {"ok": false, "error": {"type", "message", "traceback", "init"}}, with "init_ms" and
// "transports". The line comes from a process that runs user code, so it is read as untrusted
// input: any other shape is refused here, and nothing in it can make the agent throw.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "transport_usage.h"

namespace scad {

struct LauncherReply {
  bool ok = false;
  nlohmann::json result;  // main's return value, when ok
  nlohmann::json error;   // {"type": string, "message": string}, when not ok
  std::string traceback;  // when not ok, if the launcher sent one
  std::string init;       // when the code failed to load: "build" (it does not compile) or "start"
  int64_t init_ms = 0;
  TransportUsage transports;  // what the run's transports moved, per kind
  std::vector<TransferRecord> transfers;  // and per transport
};

// false, with *why, when the line is not a launcher reply.
bool parse_launcher_reply(const std::string &line, LauncherReply *out, std::string *why);

}  // namespace scad
