#include "metrics.h"

#include <prometheus/text_serializer.h>

namespace scad {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      activations_(BuildCounter()
                       .Name("scad_activations_total")
                       .Help("Activations that ended, by kind (action, app) and status")
                       .Register(*registry_)),
      durations_(BuildHistogram()
                     .Name("scad_activation_duration_seconds")
                     .Help("Time from an activation's request to its end, by kind")
                     .Register(*registry_)),
      starts_(BuildCounter()
                  .Name("scad_instance_starts_total")
                  .Help("Compute instances started, by how: warm, prewarmed or cold")
                  .Register(*registry_)),
      in_flight_(BuildGauge()
                     .Name("scad_activations_in_flight")
                     .Help("Activations accepted and not yet ended")
                     .Register(*registry_)
                     .Add({})),
      host_gauges_(BuildGauge().Name("scad_host").Help("Each host's pool and cpus (see the 'what' label)").Register(*registry_)),
      ended_(BuildCounter()
                 .Name("scad_api_connections_ended_total")
                 .Help("Public API connections the guard ended, by reason (deadline, stalled)")
                 .Register(*registry_)),
      transports_(*registry_, "scad") {}

void Metrics::activation_started() { in_flight_.Increment(); }

void Metrics::activation_finished(const std::string &kind, const std::string &status, double seconds) {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                                   1,     2.5,  5,     10,   30,  60,  300};
  in_flight_.Decrement();
  activations_.Add({{"kind", kind}, {"status", status}}).Increment();
  durations_.Add({{"kind", kind}}, kBuckets).Observe(seconds);
}

void Metrics::instance_started(const std::string &start, int n) { starts_.Add({{"start", start}}).Increment(n); }

std::string Metrics::render(const nlohmann::json &hosts, const ConnectionGuard::Counts &ended) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto &h : hosts) {
      if (!h.is_object() || !h.contains("id") || !h["id"].is_string()) continue;
      std::string id = h["id"];
      auto set = [&](const char *what, const char *field) {
        if (h.contains(field) && h[field].is_number()) host_gauges_.Add({{"host", id}, {"what", what}}).Set(h[field].get<double>());
      };
      set("pool_bytes", "memory_pool");
      set("pool_used_bytes", "memory_pool_used");
      set("cpus", "cpus");
      set("cpus_free", "cpus_free");
      host_gauges_.Add({{"host", id}, {"what", "up"}}).Set(h.value("state", "") == "up" ? 1 : 0);
    }
    ended_.Add({{"reason", "deadline"}}).Increment(double(ended.timed_out - ended_seen_.timed_out));
    ended_.Add({{"reason", "stalled"}}).Increment(double(ended.over_cap - ended_seen_.over_cap));
    ended_seen_ = ended;
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace scad
