// The application manifest (scad.yaml; JSON accepted): parsing and validation. Every problem is
// reported, with the element and field it is about — never just the first one.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace scad {

using nlohmann::json;

// A grant's rights, as libd numbers them (LIBD_RIGHT_READ, LIBD_RIGHT_WRITE).
constexpr unsigned kRightRead = 1, kRightWrite = 2;

struct TransportDecl {
  std::string element;                      // the memory element it reaches
  unsigned rights = kRightRead | kRightWrite;
};

struct ElementDecl {
  std::string name;
  std::string kind;  // memory | compute
  uint64_t size = 0;                       // memory
  bool prefetch = false;                   // memory: its pages had ahead of its writers
  std::string code, main = "main";         // compute
  double cpu = 1;
  uint64_t memory = 256ull << 20;
  int parallelism = 1;
  int64_t timeout_ms = 60000;
  bool network = true;  // false: a network namespace of its own (memory on its own host, over shm)
  std::map<std::string, std::string> env;  // `environment:` variables set for its processes
  std::map<std::string, TransportDecl> transports;  // name given to get_transport -> target
  std::vector<std::string> dependents;
};

struct Manifest {
  std::string name;
  std::map<std::string, ElementDecl> elements;
  // Compute elements in an order where every parent comes before its children.
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::string>> parents;
  std::vector<std::string> sinks;
};

// What the largest host can give: a manifest asking for more cannot be met.
struct Capacity {
  uint64_t memory_pool = 0;
  uint64_t compute_memory = 0;
  double cpus = 0;
  int64_t max_timeout_ms = 0;  // the operator's longest timeout (0: only the hard bound of a day)
};

// Parses YAML or JSON text into its JSON form (plain YAML scalars become numbers/bools where they
// look like them; quoted ones stay strings). false and *why on a syntax error.
bool manifest_to_json(const std::string &text, json *out, std::string *why);
// The most compute instances that run side by side: elements of one level of the DAG (all
// parents done) start together, each with its parallelism.
int64_t widest_wave(const Manifest &m);

// Validates; `files` are the names shipped with the application. Empty problems means valid.
std::vector<std::string> validate_manifest(const json &doc, const std::set<std::string> &files, const Capacity &cap,
                                           Manifest *out);

}  // namespace scad
