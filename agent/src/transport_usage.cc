#include "transport_usage.h"

#include <algorithm>

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

bool known_kind(const std::string &kind) {
  return kind == "shm" || kind == "tcp" || kind == "verbs" || kind == "local";
}

TransportCounts counts_of(const json &o) {
  TransportCounts c;
  c.read_ops = count_of(o, "read_ops");
  c.write_ops = count_of(o, "write_ops");
  c.read_bytes = count_of(o, "read_bytes");
  c.write_bytes = count_of(o, "write_bytes");
  c.errors = count_of(o, "errors");
  c.busy_ns = count_of(o, "busy_ns");
  return c;
}

json counts_json(const TransportCounts &c) {
  return {{"read_ops", c.read_ops}, {"write_ops", c.write_ops}, {"read_bytes", c.read_bytes},
          {"write_bytes", c.write_bytes}, {"errors", c.errors}, {"busy_ns", c.busy_ns}};
}
}  // namespace

TransportUsage transport_usage_from_json(const json &j) {
  TransportUsage out;
  if (!j.is_object()) return out;
  for (const char *kind : {"shm", "tcp", "verbs", "local"}) {
    auto it = j.find(kind);
    if (it == j.end() || !it->is_object()) continue;
    out[kind] = counts_of(*it);
  }
  return out;
}

json to_json(const TransportUsage &usage) {
  json out = json::object();
  for (auto &[kind, c] : usage) out[kind] = counts_json(c);
  return out;
}

std::vector<TransferRecord> transfers_from_json(const json &j) {
  std::vector<TransferRecord> out;
  if (!j.is_array()) return out;
  for (auto &e : j) {
    if (out.size() >= kMaxTransferRecords) break;
    if (!e.is_object()) continue;
    auto name = e.find("transport"), kind = e.find("kind");
    if (name == e.end() || kind == e.end() || !name->is_string() || !kind->is_string()) continue;
    const std::string &n = name->get_ref<const std::string &>(), &k = kind->get_ref<const std::string &>();
    if (n.empty() || n.size() > 64 || !known_kind(k)) continue;
    out.push_back({n, k, counts_of(e)});
  }
  return out;
}

json to_json(const std::vector<TransferRecord> &transfers) {
  json out = json::array();
  for (auto &t : transfers) {
    json e = counts_json(t.counts);
    e["transport"] = t.transport;
    e["kind"] = t.kind;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace scad
