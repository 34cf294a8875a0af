#include "transport_metrics.h"

namespace scad {

using prometheus::BuildCounter;

TransportMetrics::TransportMetrics(prometheus::Registry &registry, const std::string &prefix)
    : ops_(BuildCounter()
               .Name(prefix + "_transport_operations_total")
               .Help("Reads and writes compute runs made, by transport kind (shm, tcp, verbs, local) and op")
               .Register(registry)),
      bytes_(BuildCounter()
                 .Name(prefix + "_transport_bytes_total")
                 .Help("Bytes compute runs moved, by transport kind and op")
                 .Register(registry)),
      errors_(BuildCounter()
                  .Name(prefix + "_transport_errors_total")
                  .Help("Operations that failed, by transport kind")
                  .Register(registry)) {}

void TransportMetrics::add(const TransportUsage &usage) {
  for (auto &[kind, c] : usage) {
    ops_.Add({{"transport", kind}, {"op", "read"}}).Increment(double(c.read_ops));
    ops_.Add({{"transport", kind}, {"op", "write"}}).Increment(double(c.write_ops));
    bytes_.Add({{"transport", kind}, {"op", "read"}}).Increment(double(c.read_bytes));
    bytes_.Add({{"transport", kind}, {"op", "write"}}).Increment(double(c.write_bytes));
    errors_.Add({{"transport", kind}}).Increment(double(c.errors));
  }
}

}  // namespace scad
