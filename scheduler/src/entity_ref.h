// Names of OpenWhisk entities as requests give them: "/ns/name", "/ns/package/name" (fully
// qualified; "_" for the caller's namespace) or "name", "package/name" (in the caller's).
#pragma once
#include <string>

namespace scad {

struct EntityRef {
  std::string ns, package, name;
  // The name inside the namespace: "name" or "package/name" (how actions are stored).
  std::string entity() const { return package.empty() ? name : package + "/" + name; }
  std::string qualified() const { return "/" + ns + "/" + entity(); }
};

// false when the text is not such a name, or a part of it is not a valid entity name.
bool parse_entity_ref(const std::string &text, const std::string &caller_ns, EntityRef *out);

}  // namespace scad
