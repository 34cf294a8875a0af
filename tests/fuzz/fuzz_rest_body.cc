// libFuzzer target: a REST request body as the scheduler reads it — parsed with the depth limit,
// then the parts every route checks (action limits, an action's code, list parameters, an inline
// manifest) — and dumped back, as a reply or a stored document is. Nothing may throw, crash or overflow the stack.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "action_code.h"
#include "action_limits.h"
#include "action_response.h"
#include "entity_ref.h"
#include "list_page.h"
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
  // An action's code: a zip's is base64 of a zip, or refused with a reason.
  if (body.is_object() && body.contains("exec") && body["exec"].is_object()) {
    auto code = scad::get_string(body["exec"], "code");
    if (code && scad::is_zip_code(body["exec"]) && !scad::check_zip_code(*code).empty() &&
        scad::check_zip_code(*code).rfind("exec.code", 0) != 0)
      abort();
    if (code) scad::check_exec_size(*code, "main");
  }
  // A listing's limit and skip, were the body's strings its query.
  auto limit = scad::get_string(body, "limit"), skip = scad::get_string(body, "skip");
  scad::ListPage page;
  if (scad::parse_list_page("actions", limit ? &*limit : nullptr, skip ? &*skip : nullptr, &page).empty() &&
      (page.limit < 1 || page.limit > scad::kMaxListLimit || page.skip < 0))
    abort();
  // Names of entities (sequence components, rules' triggers and actions) and an action's result
  // as the controller reads them.
  if (body.is_object() && body.contains("components") && body["components"].is_array())
    for (auto &c : body["components"])
      if (c.is_string()) {
        scad::EntityRef ref;
        if (scad::parse_entity_ref(c.get<std::string>(), "ns", &ref) && (ref.name.empty() || ref.ns.empty())) abort();
      }
  scad::ComputeOutcome o;
  o.ok = !body.contains("error");
  o.result = body;
  o.error = body.contains("error") ? body["error"] : nlohmann::json();
  o.status = o.ok ? "success" : "application error";
  auto r = scad::action_response(o, 256);
  if (!r.result.is_object() && !r.result.is_array()) abort();
  scad::dump_json(r.result);
  if (body.is_object() && body.contains("manifest") && body["manifest"].is_object())
    scad::validate_manifest(body["manifest"], {"a.py"}, scad::Capacity{}, nullptr);
  return 0;
}
