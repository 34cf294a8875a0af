// Per-action limits, as OpenWhisk has them: each limit has a range the operator sets
// (scad-server --action-limits) and a default. They are validated when an action is stored, so a
// bad value is refused with its name instead of failing every invocation, and read back
// defensively at invocation (a document stored by an older version may hold anything).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace scad {

struct LimitRange {
  int64_t min, max, dflt;
};

struct LimitRanges {
  // OpenWhisk's defaults (core/controller application.conf): 100 ms - 5 min, 128 - 512 MB, 0 - 10 MB.
  LimitRange timeout_ms{100, 300000, 60000};
  LimitRange memory_mb{128, 512, 256};
  LimitRange logs_mb{0, 10, 10};
  LimitRange concurrency{1, 1, 1};  // one activation per process, as the action proxy runs them
};

// The limits one activation runs under.
struct ActionLimits {
  int64_t timeout_ms = 60000;
  uint64_t memory_bytes = 256ull << 20;
  uint64_t log_bytes = 10ull << 20;
};

// Reads the operator's "timeout=MIN:MAX[:DEFAULT],memory=...,logs=..." (ms, MB, MB). false and
// *why when a key is unknown or a range is empty or negative.
bool parse_limit_ranges(const std::string &spec, LimitRanges *out, std::string *why);

// Checks a `limits` object from a request body: an object whose members are integers inside their
// ranges. *out gets every limit, defaults filled in. false and *why (naming the limit and its range).
bool validate_limits(const nlohmann::json &limits, const LimitRanges &r, nlohmann::json *out, std::string *why);

// The limits of a stored action document: its valid values, the defaults for anything missing or
// out of range.
ActionLimits effective_limits(const nlohmann::json &doc, const LimitRanges &r);

}  // namespace scad
