// scad-server's Prometheus metrics (GET /metrics, the text format): activations by kind and
// status and their durations, instance starts (warm, prewarmed, cold), activations in flight,
// each host's pool and cpus, what compute runs' transports moved, and the connections the API's
// guard ended. Aggregates only: nothing
// names a namespace, an action or an activation, so the endpoint needs no credentials (as
// Prometheus scrapes). Built on prometheus-cpp's core (Debian's prometheus-cpp-dev).
#pragma once
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "connection_guard.h"
#include "transport_metrics.h"

namespace scad {

class Metrics {
 public:
  Metrics();
  // kind: "action" or "app"; status as in the activation record.
  void activation_started();
  void activation_finished(const std::string &kind, const std::string &status, double seconds);
  // start: "warm", "prewarmed" or "cold"; n instances.
  void instance_started(const std::string &start, int n = 1);
  // What a compute run's transports moved (every host's runs: the cluster's view).
  void transports_used(const TransportUsage &usage) { transports_.add(usage); }
  // The text exposition, with the hosts (Engine::host_info) and the guard's counts as of now.
  std::string render(const nlohmann::json &hosts, const ConnectionGuard::Counts &ended);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter> &activations_;
  prometheus::Family<prometheus::Histogram> &durations_;
  prometheus::Family<prometheus::Counter> &starts_;
  prometheus::Gauge &in_flight_;
  prometheus::Family<prometheus::Gauge> &host_gauges_;
  prometheus::Family<prometheus::Counter> &ended_;
  std::mutex mu_;  // render() turns the guard's totals into counter increments
  ConnectionGuard::Counts ended_seen_;
  TransportMetrics transports_;
};

}  // namespace scad
