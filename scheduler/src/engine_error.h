// What the engine says when a request cannot be met: a kind the REST layer maps to an HTTP status
// (api.cc, http_status), and a message for the caller. The engine itself knows nothing of HTTP.
#pragma once
#include <string>

namespace scad {

enum class Refusal {
  kNone,
  kUnauthorized,  // no such caller (an unknown or expired runtime token)
  kInvalid,       // the request is malformed
  kNotFound,      // what it names does not exist
  kConflict,      // it cannot be met as things are (a name taken, a template that is not memory, no room)
  kBusy,          // a quota is full now; the same request may succeed later
  kInternal,      // the platform failed (an agent refused a grant)
};

struct EngineError {
  Refusal kind = Refusal::kNone;
  std::string message;
  explicit operator bool() const { return kind != Refusal::kNone; }
};

inline EngineError refuse(Refusal kind, std::string message) { return {kind, std::move(message)}; }

}  // namespace scad
