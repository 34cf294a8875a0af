// Transport counters in the Prometheus text format, shared by scad-agent's and scad-server's
// /metrics: operations and bytes by transport kind and direction, and errors by kind, as reported
// by the compute runs that used them (transport_usage.h).
#pragma once
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/registry.h>

#include <string>

#include "transport_usage.h"

namespace scad {

class TransportMetrics {
 public:
  // prefix: "scad_agent" or "scad" (names: PREFIX_transport_operations_total, ..._bytes_total,
  // ..._errors_total).
  TransportMetrics(prometheus::Registry &registry, const std::string &prefix);
  void add(const TransportUsage &usage);

 private:
  prometheus::Family<prometheus::Counter> &ops_, &bytes_, &errors_;
};

}  // namespace scad
