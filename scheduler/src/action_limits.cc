#include "action_limits.h"
#include <algorithm>

#include "key_values.h"
#include "safe_json.h"

namespace scad {

using nlohmann::json;

namespace {

struct Known {
  const char *name, *unit;
  LimitRange LimitRanges::*range;
};
const Known kKnown[] = {{"timeout", "ms", &LimitRanges::timeout_ms},
                        {"memory", "MB", &LimitRanges::memory_mb},
                        {"logs", "MB", &LimitRanges::logs_mb},
                        {"concurrency", "", &LimitRanges::concurrency}};

std::string range_text(const Known &k, const LimitRange &r) {
  std::string unit = *k.unit ? std::string(" ") + k.unit : "";
  return "from " + std::to_string(r.min) + " to " + std::to_string(r.max) + unit;
}

// OpenWhisk's words for a limit outside its range (TimeLimit, MemoryLimit, LogLimit,
// ConcurrencyLimit), after its prefix for a body it cannot accept.
std::string out_of_range(const Known &k, int64_t v, const LimitRange &r) {
  std::string what = std::string(k.name) == "timeout" ? "duration" : std::string(k.name) == "logs" ? "log size" : k.name;
  std::string unit = std::string(k.name) == "timeout" ? " milliseconds" : *k.unit ? std::string(" ") + k.unit : "";
  bool low = v < r.min;
  return "The request content was malformed:\nrequirement failed: " + what + " " + std::to_string(v) + unit +
         (low ? " below" : " exceeds") + " allowed threshold of " + std::to_string(low ? r.min : r.max) + unit +
         " (limits." + k.name + ")";
}

bool parse_int(const std::string &s, int64_t *out) {
  if (s.empty() || s.size() > 15) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

}  // namespace

bool parse_limit_ranges(const std::string &spec, LimitRanges *out, std::string *why) {
  std::map<std::string, std::string> kv;
  if (!parse_key_values(spec, &kv)) {
    *why = "--action-limits takes NAME=MIN:MAX[:DEFAULT],... (timeout in ms, memory and logs in MB)";
    return false;
  }
  for (auto &[key, value] : kv) {
    const Known *k = nullptr;
    for (auto &c : kKnown)
      if (key == c.name) k = &c;
    if (!k) {
      *why = "--action-limits: unknown limit '" + key + "' (timeout, memory, logs, concurrency)";
      return false;
    }
    LimitRange r = out->*(k->range);
    auto c1 = value.find(':');
    auto c2 = c1 == std::string::npos ? c1 : value.find(':', c1 + 1);
    bool ok = c1 != std::string::npos && parse_int(value.substr(0, c1), &r.min) &&
              parse_int(value.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1), &r.max) &&
              (c2 == std::string::npos || parse_int(value.substr(c2 + 1), &r.dflt));
    if (!ok || r.min > r.max) {
      *why = "--action-limits: '" + key + "=" + value + "' must be MIN:MAX[:DEFAULT] with MIN <= MAX";
      return false;
    }
    r.dflt = std::clamp(r.dflt, r.min, r.max);
    out->*(k->range) = r;
  }
  return true;
}

bool validate_limits(const json &limits, const LimitRanges &r, json *out, std::string *why) {
  if (!limits.is_object()) {
    *why = "limits must be an object such as {\"timeout\": 60000, \"memory\": 256, \"logs\": 10}";
    return false;
  }
  json result = json::object();
  for (auto &k : kKnown) result[k.name] = (r.*(k.range)).dflt;
  for (auto &[key, value] : limits.items()) {
    const Known *k = nullptr;
    for (auto &c : kKnown)
      if (key == c.name) k = &c;
    if (!k) {
      *why = "limits: unknown limit '" + valid_utf8(key) + "' (timeout, memory, logs, concurrency)";
      return false;
    }
    const LimitRange &range = r.*(k->range);
    auto v = get_int(limits, k->name);
    if (!v) {
      *why = "limits: '" + key + "' must be an integer " + range_text(*k, range) + "; got " + dump_json(value).substr(0, 64);
      return false;
    }
    if (*v < range.min || *v > range.max) {
      *why = out_of_range(*k, *v, range);
      return false;
    }
    result[k->name] = *v;
  }
  *out = std::move(result);
  return true;
}

ActionLimits effective_limits(const json &doc, const LimitRanges &r) {
  json limits = doc.is_object() && doc.contains("limits") ? doc["limits"] : json::object();
  auto read = [&](const char *key, const LimitRange &range) {
    auto v = get_int(limits, key);
    return v && *v >= range.min && *v <= range.max ? *v : range.dflt;
  };
  ActionLimits a;
  a.timeout_ms = read("timeout", r.timeout_ms);
  a.memory_bytes = uint64_t(read("memory", r.memory_mb)) << 20;
  a.log_bytes = uint64_t(read("logs", r.logs_mb)) << 20;
  return a;
}

}  // namespace scad
