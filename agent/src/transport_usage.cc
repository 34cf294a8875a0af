#include "transport_usage.h"

namespace scad {

using nlohmann::json;

namespace {
constexpr uint64_t kMaxCount = uint64_t(1) << 53;  // what a JSON number holds exactly

uint64_t count_of(const json &o, const char *key) {
  auto it = o.find(key);
  if (it == o.end() || !it->is_number_integer()) return 0;
  if (it->is_number_unsigned()) return std::min(it->get<uint64_t>(), kMaxCount);
  int64_t v = it->get<int64_t>();
  return v < 0 ? 0 : std::min(uint64_t(v), kMaxCount);
}
}  // namespace

TransportUsage transport_usage_from_json(const json &j) {
  TransportUsage out;
  if (!j.is_object()) return out;
  for (const char *kind : {"shm", "tcp", "verbs", "local"}) {
    auto it = j.find(kind);
    if (it == j.end() || !it->is_object()) continue;
    TransportCounts c;
    c.read_ops = count_of(*it, "read_ops");
    c.write_ops = count_of(*it, "write_ops");
    c.read_bytes = count_of(*it, "read_bytes");
    c.write_bytes = count_of(*it, "write_bytes");
    c.errors = count_of(*it, "errors");
    out[kind] = c;
  }
  return out;
}

json to_json(const TransportUsage &usage) {
  json out = json::object();
  for (auto &[kind, c] : usage)
    out[kind] = {{"read_ops", c.read_ops}, {"write_ops", c.write_ops}, {"read_bytes", c.read_bytes},
                 {"write_bytes", c.write_bytes}, {"errors", c.errors}};
  return out;
}

}  // namespace scad
