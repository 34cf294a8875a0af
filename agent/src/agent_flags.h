// The flags of the host agent's part, the same on scad-server (its embedded agent) and scad-agent.
#pragma once
#include "agent.h"
#include "flags.h"

namespace scad {

// --python, --pythonpath, --pool, --cpus, --prewarm, --max-warm, --keep-alive, --verbs, --cgroup,
// --sandbox, --fork-server, into *o.
void add_agent_flags(Flags &flags, AgentOptions *o);

}  // namespace scad
