// What a compute run's transports moved, per transport kind (shm, tcp, verbs, local): the launcher
// reads libd's counters of each of the action's transports before the action ends and reports them
// with its result; the agent and the scheduler add them to their /metrics. The numbers come from a
// process that runs user code, so they are read as untrusted: unknown kinds and values that are not
// counts are dropped, never trusted to size anything.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace scad {

struct TransportCounts {
  uint64_t read_ops = 0, write_ops = 0, read_bytes = 0, write_bytes = 0, errors = 0;
  uint64_t busy_ns = 0;  // the time the operations took (libd's estimate from its timed sample)
};
using TransportUsage = std::map<std::string, TransportCounts>;  // kind -> counts

// One transport of a run: its name in the action, its kind and its counts.
struct TransferRecord {
  std::string transport, kind;
  TransportCounts counts;
};
constexpr size_t kMaxTransferRecords = 64;  // per run: a run names its transports, not without end

// {"tcp": {"read_ops": N, ...}, ...}: kinds other than shm, tcp, verbs and local, and values that are
// not integers in [0, 2^53], are left out.
TransportUsage transport_usage_from_json(const nlohmann::json &j);
nlohmann::json to_json(const TransportUsage &usage);
// [{"transport", "kind", "read_ops", ...}]: entries whose kind is unknown or whose name is not a
// short string are left out, and at most kMaxTransferRecords are kept.
std::vector<TransferRecord> transfers_from_json(const nlohmann::json &j);
nlohmann::json to_json(const std::vector<TransferRecord> &transfers);

}  // namespace scad
