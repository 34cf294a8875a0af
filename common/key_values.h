// "KEY=VALUE[,KEY=VALUE...]", as the daemons' compound flags take them (--quotas, --action-limits).
#pragma once
#include <map>
#include <string>

namespace scad {

// False if an item has no '=', an empty key, or a key given twice.
inline bool parse_key_values(const std::string &text, std::map<std::string, std::string> *out) {
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || !out->emplace(item.substr(0, eq), item.substr(eq + 1)).second)
      return false;
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return true;
}

}  // namespace scad
