#include "agent_metrics.h"

#include <prometheus/text_serializer.h>

namespace scad {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

AgentMetrics::AgentMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      runs_(BuildCounter().Name("scad_agent_runs_total").Help("Compute runs that ended, by status").Register(*registry_)),
      durations_(BuildHistogram()
                     .Name("scad_agent_run_duration_seconds")
                     .Help("Time a compute run took on this host")
                     .Register(*registry_)),
      starts_(BuildCounter()
                  .Name("scad_agent_starts_total")
                  .Help("Compute runs by how their process started: warm, prewarmed or cold")
                  .Register(*registry_)),
      pool_bytes_(BuildGauge().Name("scad_agent_pool_bytes").Help("The memory pool's size").Register(*registry_).Add({})),
      pool_used_(BuildGauge()
                     .Name("scad_agent_pool_used_bytes")
                     .Help("Bytes of the pool held by memory elements")
                     .Register(*registry_)
                     .Add({})),
      transports_(*registry_, "scad_agent") {}

void AgentMetrics::run_finished(const std::string &status, const std::string &start, double seconds,
                                const TransportUsage &transports) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                                   1,     2.5,  5,     10,   30,  60,  300};
  runs_.Add({{"status", status}}).Increment();
  durations_.Add({}, kBuckets).Observe(seconds);
  if (!start.empty()) starts_.Add({{"start", start}}).Increment();
  transports_.add(transports);
}

std::string AgentMetrics::render(uint64_t pool_bytes, uint64_t pool_used) {
  pool_bytes_.Set(double(pool_bytes));
  pool_used_.Set(double(pool_used));
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace scad
