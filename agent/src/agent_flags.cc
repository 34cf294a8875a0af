#include "agent_flags.h"

namespace scad {

void add_agent_flags(Flags &f, AgentOptions *o) {
  f.text("--python", "PATH", "the interpreter compute processes run (default /usr/bin/python3)", &o->python)
      .text("--pythonpath", "P", "PYTHONPATH of compute processes (where disagg and scad are)", &o->pythonpath)
      .bytes("--pool", "the memory pool's size (default 4GiB)", &o->pool_bytes)
      .number("--cpus", "cpus offered to compute elements (0: a host that only serves memory)", 0, 1e6, &o->cpus)
      .integer("--prewarm", "started interpreters waiting for any action (default 2)", 0, 1024, &o->prewarm)
      .integer("--max-warm", "idle processes kept for the action they ran (default 16)", 0, 100000, &o->max_warm)
      .integer("--keep-alive", "ms an idle warm process is kept (default 60000)", int64_t(0), int64_t(86400000),
               &o->keep_alive_ms)
      .integer("--warm-wait-ms", "the longest a run waits for a running process of its action to free up "
               "instead of starting one, when its runs are shorter than a start (default 500, 0: never)", int64_t(0),
               int64_t(10000),
               &o->warm_wait_ms)
      .custom("--verbs", "auto|off|KEY=VALUE,...", "RDMA verbs on the pool (dev=NAME,gid_index=N,mw=0)",
              [o](const std::string &v, std::string *why) {
                if (v.empty()) {
                  *why = "takes auto, off or the device's keys";
                  return false;
                }
                o->verbs = v;
                return true;
              })
      .choice("--cgroup", {"auto", "off"}, "cgroup v2 limits on compute processes", &o->cgroup)
      .choice("--sandbox", {"auto", "on", "off"}, "bubblewrap sandbox of compute processes", &o->sandbox)
      .choice("--fork-server", {"auto", "off"}, "fork sandboxed compute processes from one with the launcher "
              "imported (auto: where the agent runs as root) or start each afresh (off)", &o->fork_server);
}

}  // namespace scad
