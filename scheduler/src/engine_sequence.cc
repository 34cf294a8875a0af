// Sequences, as OpenWhisk runs them: the components in order, each an activation of its own
// (cause: the sequence's), the first given the sequence's parameters and each next one the result
// of the one before. The first component that does not succeed ends the sequence with its
// response. The sequence's record lists its components' activation ids as its logs.
#include "action_response.h"
#include "engine.h"
#include "engine_activation.h"
#include "entity_ref.h"
#include "safe_json.h"

namespace scad {

void Engine::run_sequence(const std::shared_ptr<Activation> &act) {
  const json components = act->doc["exec"].value("components", json::array());
  json params = act->params;
  json result = json::object();
  std::string status = "success";
  int64_t size = -1;
  std::vector<std::string> ids;
  for (auto &c : components) {
    EntityRef ref;
    std::optional<json> doc;
    if (c.is_string() && parse_entity_ref(c.get<std::string>(), act->ns, &ref) && ref.ns == act->ns)
      doc = store_.get_doc("actions", act->ns, ref.entity());
    if (!doc) {  // deleted since the sequence was made
      status = "application error";
      result = {{"error", "Sequence component does not exist."}};
      break;
    }
    Started st;
    // The component runs to its end: each is bounded by its own time limit.
    EngineError e = invoke_action(act->ns, *doc, params, int64_t(1) << 40, &st, {act->ctx.api_key, act->ctx.txid, act->id, true});
    if (e) {
      status = e.kind == Refusal::kBusy ? "application error" : "whisk internal error";
      result = {{"error", "Sequence failed: " + e.message}};
      break;
    }
    ids.push_back(st.id);
    const json &response = st.record["response"];
    result = response.value("result", json::object());
    size = get_int(response, "size").value_or(-1);
    if (!response.value("success", false)) {
      status = response.value("status", std::string("application error"));
      break;
    }
    params = result;
  }
  {
    std::lock_guard<std::mutex> lk(act->mu);
    act->logs = ids;
  }
  finish(act, status, result, size);
}

}  // namespace scad
