#include "action_response.h"

#include "safe_json.h"

namespace scad {

using nlohmann::json;

int status_code(const std::string &status) {
  if (status == "success") return 0;
  if (status == "application error") return 1;
  if (status == "action developer error") return 2;
  return 3;  // whisk internal error
}

ActionResponse action_response(const ComputeOutcome &o, size_t max_result) {
  ActionResponse r;
  if (!o.ok) {
    // OpenWhisk's error is a string: clients print it, and report "Response Missing Error
    // Message" for anything else.
    r.status = o.status.empty() ? "whisk internal error" : o.status;
    std::string message = o.error.is_object() ? o.error.value("message", std::string())
                          : o.error.is_string() ? o.error.get<std::string>() : std::string();
    // The code did not load: OpenWhisk's runtimes answer /init with these, the reason in the logs.
    std::string init = get_string(o.error, "init").value_or("");
    if (init == "build") message = "The action failed to generate or locate a binary. See logs for details.";
    if (init == "start") message = "Cannot start action. Check logs for details.";
    if (o.error.is_object() && o.error.value("type", std::string()) == "TimeoutError") {
      r.timed_out = true;
      if (auto ms = get_int(o.error, "timeout_ms"))
        message = "The action exceeded its time limits of " + std::to_string(*ms) + " milliseconds.";
    }
    if (message.empty()) message = "The action did not produce a valid response and exited unexpectedly.";
    r.result = {{"error", message}};
    r.size = int64_t(dump_json(r.result).size());
    return r;
  }
  std::string text = dump_json(o.result);
  r.size = int64_t(text.size());
  if (text.size() > max_result) {
    r.status = "application error";
    r.result = {{"error", "The action produced a response that exceeded the allowed length: " +
                              std::to_string(text.size()) + " > " + std::to_string(max_result) +
                              " bytes. The truncated response was: " + valid_utf8(text.substr(0, 1024))}};
    return r;
  }
  if (o.result.is_object() && o.result.contains("error")) {
    r.status = "application error";
    r.result = o.result;
  } else if (o.result.is_object() || o.result.is_array()) {
    r.status = "success";
    r.result = o.result;
  } else {
    r.status = "application error";
    r.result = {{"error", "The action did not return a dictionary or array."}};
  }
  return r;
}

}  // namespace scad
