// The agent's HTTP API for the scheduler (bearer: the cluster token), and the JSON forms of what
// crosses it. The scheduler's RemoteHost is the client.
//
//   POST   /agent/v1/elements        {"id", "size"}                         201 | 409 {"error"}
//   DELETE /agent/v1/elements/{id}                                          204
//   POST   /agent/v1/grants          {"element","client","rights","name","impl"} -> grant
//   DELETE /agent/v1/grants/{id}                                            204 | 404 {"error"}
//   POST   /agent/v1/run             compute spec -> outcome
//   POST   /agent/v1/notices         {"aid", "notice"}: a peer failed        204 | 404 {"error"}
//   POST   /agent/v1/code/remove     {"prefix": "ns/kind/name"}: a deleted action's code   204 | 400
#pragma once
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "agent.h"

namespace scad {

nlohmann::json to_json(const ComputeSpec &s);
ComputeSpec spec_from_json(const nlohmann::json &j);
nlohmann::json to_json(const ComputeOutcome &o);
// The outcome an agent sent back; false and *why when it is not one (an agent is a separate
// process on another host: its reply is checked like any input).
bool outcome_from_json(const nlohmann::json &j, ComputeOutcome *out, std::string *why);

void install_agent_routes(httplib::Server &srv, Agent &agent, const std::string &token);

}  // namespace scad
