// What one namespace may hold at once, so that no tenant can take the platform from the others
// (OpenWhisk has the same idea in its per-namespace invocation and concurrency limits). Set by the
// operator (scad-server --quotas); every tenant gets the same.
#pragma once
#include <cstdint>
#include <string>

namespace scad {

struct Quotas {
  int64_t elements = 256;                // memory elements alive at once (manifest and runtime invoke)
  uint64_t element_bytes = 64ull << 30;  // their bytes, each counted as at least one page
  int64_t activations = 64;              // activations in flight
  int64_t instances = 256;               // compute instances side by side in one wave of an application
};

// Every element counts as at least this many bytes: a one-byte element still costs a page, a
// descriptor and a socket on its host.
constexpr uint64_t kElementMinBytes = 4096;

// Reads "elements=N,memory=SIZE,activations=N,instances=N" into *out. false and *why on a bad or
// unknown key.
bool parse_quotas(const std::string &spec, Quotas *out, std::string *why);

}  // namespace scad
