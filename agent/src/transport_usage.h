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

namespace scad {

struct TransportCounts {
  uint64_t read_ops = 0, write_ops = 0, read_bytes = 0, write_bytes = 0, errors = 0;
};
using TransportUsage = std::map<std::string, TransportCounts>;  // kind -> counts

// {"tcp": {"read_ops": N, ...}, ...}: kinds other than shm, tcp, verbs and local, and values that are
// not integers in [0, 2^53], are left out.
TransportUsage transport_usage_from_json(const nlohmann::json &j);
nlohmann::json to_json(const TransportUsage &usage);

}  // namespace scad
