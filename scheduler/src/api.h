// The REST API: the subset of Apache OpenWhisk's controller API that clients and habits rely on
// (actions, activations, Basic auth with uuid:key, namespaces), Scad's own resources (applications,
// elements, hosts), and the runtime endpoint for running actions (docs/rest-api.md).
#pragma once
#include <httplib.h>

#include "action_limits.h"
#include "connection_guard.h"
#include "engine.h"
#include "store.h"

namespace scad {

struct ApiOptions {
  int64_t blocking_wait_ms = 60000;  // OpenWhisk's: a blocking invoke answers 202 after this
  int max_blocking_waits = 16;       // blocking invokes waiting at once (of the server's 32 threads)
  size_t max_body = 64ull << 20;     // an application's files, inline
  std::string cluster_token;         // what agents of other hosts present; "" = none may register
  std::string host_keys;             // a file of per-host keys (host_keys.h); then each host presents its own
  LimitRanges limits;                // what an action's limits may be (scad-server --action-limits)
  ConnectionGuard *guard = nullptr;  // times requests and caps connections per client, when set
  Metrics *metrics = nullptr;        // GET /metrics, when set
};

void install_routes(httplib::Server &srv, Store &store, Engine &engine, ApiOptions opts);

// The runtime endpoint that running actions call (docs/runtime-endpoint.md), on a listener and
// thread pool of its own: clients of the public API, however slow or many, cannot keep a running
// action from growing or shrinking its memory.
void install_runtime_routes(httplib::Server &srv, Engine &engine);

}  // namespace scad
