// What an OpenWhisk action's run comes to: the status of its activation and the `result` clients
// read, by OpenWhisk's rules (ActivationResponse, and the Python runtime's launcher):
//   - an object with an "error" field is an application error, its result kept as it is;
//   - any other object, or an array, is a success;
//   - any other value is an application error ("The action did not return a dictionary or array.");
//   - an exception in main is an application error whose error is the exception's message, a string;
//   - a result longer than the limit (1 MiB) is an application error naming both sizes;
//   - code that does not load is a developer error with the runtimes' /init message ("Cannot
//     start action. Check logs for details.", or for code that does not compile "The action failed
//     to generate or locate a binary. See logs for details."), the reason in the logs;
//   - a run that timed out, crashed or could not start keeps the agent's status, with its message
//     as the error string.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "agent.h"

namespace scad {

// OpenWhisk's limit on an action's result (whisk.activation.payload.max).
constexpr size_t kMaxResultBytes = 1 << 20;

struct ActionResponse {
  std::string status;      // success | application error | action developer error | whisk internal error
  nlohmann::json result;   // what `response.result` holds
  int64_t size = 0;        // the result's length as JSON text (`response.size`)
  bool timed_out = false;  // OpenWhisk annotates such an activation with "timeout": true
};

ActionResponse action_response(const ComputeOutcome &o, size_t max_result = kMaxResultBytes);

// OpenWhisk's numeric code of a status: 0 success, 1 application error, 2 action developer error,
// 3 whisk internal error (the top-level `statusCode` of listed activations).
int status_code(const std::string &status);

}  // namespace scad
