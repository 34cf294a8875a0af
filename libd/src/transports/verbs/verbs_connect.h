// The client's connection set-up, on its own so tests can reach a real queue pair directly:
// authenticate on the memory element's control connection, send our handshake record, read the
// server's, bring our queue pair to RTS and start the engine on it.
#pragma once
#include <memory>
#include <string>

#include "core/clock.h"
#include "proto/auth.h"
#include "proto/client_handshake.h"
#include "transports/verbs/verbs_engine.h"
#include "verbs/record.h"

namespace libd::verbs {

struct Connected {
  std::shared_ptr<Engine> engine;
  proto::GrantBody grant;
  Record peer;
};

// 0, or a negative errno with libd_last_error saying which step failed and where.
int connect_engine(std::shared_ptr<Device> dev, const Engine::Config &cfg, const std::string &host,
                   const std::string &port, const proto::Credentials &creds, Deadline deadline,
                   Engine::FailFn on_fail, Connected *out);

}  // namespace libd::verbs
