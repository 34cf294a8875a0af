// libFuzzer target: the application manifest (YAML or JSON text, as PUT .../apps/{name} carries
// it), then its validation. Any text must convert or be refused with a reason, and validation must
// list problems or accept; nothing may crash, overflow the stack or expand without bound.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "manifest.h"
#include "safe_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  nlohmann::json doc;
  std::string why;
  if (!scad::manifest_to_json(text, &doc, &why)) {
    if (why.empty()) abort();
    return 0;
  }
  if (scad::json_depth(doc) > 65) abort();
  scad::dump_json(doc);  // it is stored: every converted manifest must dump
  scad::Manifest m;
  auto problems = scad::validate_manifest(doc, {"a.py", "b.py"}, scad::Capacity{1 << 30, 1 << 30, 2, 300000}, &m);
  if (problems.empty() && m.order.empty()) abort();  // a valid manifest has something to run
  return 0;
}
