// scad-agent's Prometheus metrics (GET /metrics on its API port, no credentials: aggregates that
// name no tenant, action or activation): compute runs by status and their durations, how their
// processes started, what their transports moved, and the memory pool's size and use. scad-server's own /metrics covers its
// embedded agent through the activations it records.
#pragma once
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "transport_metrics.h"

namespace scad {

class AgentMetrics {
 public:
  AgentMetrics();
  void run_finished(const std::string &status, const std::string &start, double seconds,
                    const TransportUsage &transports);
  std::string render(uint64_t pool_bytes, uint64_t pool_used);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter> &runs_;
  prometheus::Family<prometheus::Histogram> &durations_;
  prometheus::Family<prometheus::Counter> &starts_;
  prometheus::Gauge &pool_bytes_, &pool_used_;
  TransportMetrics transports_;
};

}  // namespace scad
