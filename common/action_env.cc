#include "action_env.h"

namespace scad {

bool is_platform_env(const std::string &name) { return name.rfind("__OW_", 0) == 0; }

std::string env_name_problem(const std::string &name) {
  if (name.empty() || name.size() > 128) return "a name must be 1 to 128 characters";
  auto letter = [](char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; };
  if (!letter(name[0])) return "a name must start with a letter or '_'";
  for (char c : name)
    if (!letter(c) && !(c >= '0' && c <= '9')) return "a name must be letters, digits and '_'";
  if (is_platform_env(name)) return "__OW_ names are the platform's (it sets them for every run)";
  if (name.rfind("SCAD_", 0) == 0) return "SCAD_ names are the runtime's own";
  return "";
}

std::string env_value_problem(const std::string &value) {
  // setenv stops at a NUL: the process would see another value than the manifest says.
  if (value.find('\0') != std::string::npos) return "a value cannot hold a NUL character";
  return "";
}

}  // namespace scad
