// libFuzzer target: a REST request body as the scheduler reads it — parsed with the depth limit,
// then the parts every route checks (action limits, parameters, an inline manifest) — and dumped
// back, as a reply or a stored document is. Nothing may throw, crash or overflow the stack.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "action_limits.h"
#include "manifest.h"
#include "safe_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  nlohmann::json body;
  std::string why;
  if (!scad::parse_json(text, &body, &why)) {
    if (why.empty()) abort();
    return 0;
  }
  if (scad::json_depth(body) > scad::kMaxJsonDepth) abort();
  std::string dumped = scad::dump_json(body);
  nlohmann::json again;
  if (!scad::parse_json(dumped, &again, &why) || again != body) abort();  // what was accepted round-trips

  scad::LimitRanges ranges;
  nlohmann::json limits;
  if (body.is_object() && body.contains("limits") && scad::validate_limits(body["limits"], ranges, &limits, &why)) {
    auto t = scad::get_int(limits, "timeout");
    if (!t || *t < ranges.timeout_ms.min || *t > ranges.timeout_ms.max) abort();
  }
  scad::effective_limits(body, ranges);
  if (body.is_object() && body.contains("manifest") && body["manifest"].is_object())
    scad::validate_manifest(body["manifest"], {"a.py"}, scad::Capacity{}, nullptr);
  return 0;
}
