// The environment variables an application's manifest may set for its compute elements
// (`environment:` in scad.yaml). The scheduler checks a manifest with these rules and the agent
// checks every spec it is sent with them again, so that a spec can carry nothing a manifest could
// not: the platform's own variables (OpenWhisk's __OW_*, the runtime's SCAD_*) are set by the
// platform alone, and always tell the truth.
#pragma once

#include <cstddef>
#include <string>

namespace scad {

constexpr std::size_t kMaxEnvVariables = 64;
// Names and values together, as AWS Lambda caps a function's environment at 4 KB.
constexpr std::size_t kMaxEnvBytes = 4096;

// "" when a manifest may set `name`, else why not (a sentence fragment naming the rule).
std::string env_name_problem(const std::string &name);
// "" when `value` may be a variable's value, else why not.
std::string env_value_problem(const std::string &value);
// Whether `name` is one the platform sets for every run (OpenWhisk's __OW_*).
bool is_platform_env(const std::string &name);

}  // namespace scad
