#include "quotas.h"

#include "flags.h"
#include "key_values.h"

namespace scad {

bool parse_quotas(const std::string &spec, Quotas *out, std::string *why) {
  std::map<std::string, std::string> kv;
  if (!parse_key_values(spec, &kv)) {
    *why = "--quotas takes elements=N,memory=SIZE,activations=N,instances=N";
    return false;
  }
  for (auto &[key, value] : kv) {
    uint64_t v = 0;
    bool ok = parse_byte_size(value, &v) && v > 0;
    if (ok && key == "elements") out->elements = int64_t(v);
    else if (ok && key == "memory") out->element_bytes = v;
    else if (ok && key == "activations") out->activations = int64_t(v);
    else if (ok && key == "instances") out->instances = int64_t(v);
    else {
      *why = "--quotas: '" + key + "=" + value + "' is not a known quota with a positive value "
             "(elements, memory, activations, instances)";
      return false;
    }
  }
  return true;
}

}  // namespace scad
