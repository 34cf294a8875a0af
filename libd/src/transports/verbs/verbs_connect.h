// The client's connection set-up, on its own so tests can reach a real queue pair directly:
// authenticate on the memory element's control connection, then connect our queue pair either
// through librdmacm with a ticket from that connection (verbs/cm.h) or by exchanging handshake
// records on it (out of band, as perftest does by default), and start the driver.
#pragma once
#include <memory>
#include <string>

#include "core/clock.h"
#include "proto/auth.h"
#include "proto/client_handshake.h"
#include "transports/verbs/qp_driver.h"
#include "ibv/record.h"

namespace libd::ibv {

// auto: rdma_cm when the server offers it and the route resolves to our device, else the record
// exchange. cm / oob: only that one.
enum class Setup { kAuto, kCm, kOob };
// "auto", "cm", "oob"; false if none.
bool parse_setup(const std::string &s, Setup *out);

struct Connected {
  std::shared_ptr<QpDriver> driver;
  proto::GrantBody grant;
  Record peer;
  bool via_cm = false;
  std::string cm_skipped;  // auto mode: why rdma_cm was not used ("" if it was)
};

// 0, or a negative errno with libd_last_error saying which step failed and where.
int connect_driver(std::shared_ptr<Device> dev, const QpDriver::Config &cfg, const std::string &host,
                   const std::string &port, const proto::Credentials &creds, Setup setup, Deadline deadline,
                   QpDriver::FailFn on_fail, Connected *out);

}  // namespace libd::ibv
