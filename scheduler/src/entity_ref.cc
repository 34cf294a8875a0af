#include "entity_ref.h"

#include <vector>

#include "host_registry.h"

namespace scad {

bool parse_entity_ref(const std::string &text, const std::string &caller_ns, EntityRef *out) {
  if (text.empty() || text.size() > 1024) return false;
  std::vector<std::string> parts;
  size_t from = text[0] == '/' ? 1 : 0;
  while (true) {
    size_t slash = text.find('/', from);
    parts.push_back(text.substr(from, slash == std::string::npos ? std::string::npos : slash - from));
    if (slash == std::string::npos) break;
    from = slash + 1;
  }
  EntityRef r;
  if (text[0] == '/') {
    if (parts.size() < 2 || parts.size() > 3) return false;
    r.ns = parts[0] == "_" ? caller_ns : parts[0];
    parts.erase(parts.begin());
  } else {
    if (parts.size() > 2) return false;
    r.ns = caller_ns;
  }
  if (parts.size() == 2) r.package = parts[0];
  r.name = parts.back();
  if (!valid_entity_name(r.ns) || !valid_entity_name(r.name) || (parts.size() == 2 && !valid_entity_name(r.package)))
    return false;
  *out = r;
  return true;
}

}  // namespace scad
