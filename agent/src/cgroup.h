// cgroup v2 limits for compute elements: each compute process runs in a cgroup of its own with
// memory.max (and memory.swap.max 0) from the element's `memory` and cpu.max from its `cpu`, as
// OpenWhisk's invoker sets a container's --memory and --cpu-shares. The kernel enforces them: a
// process over its memory is killed by the OOM killer, and the agent reports that as the reason.
//
// Layout, under the agent's own cgroup B (from /proc/self/cgroup) on the cgroup2 mount: the agent
// moves itself into B/agent (cgroup v2 lets a cgroup that hands controllers to its children hold
// no processes, except the root), enables cpu and memory in B and B/workers, and makes
// B/workers/<pid> per compute process. Needs the cpu and memory controllers in B's
// cgroup.controllers and write access to B (root, or a delegated subtree as systemd's Delegate=
// gives). Where they are missing — cgroup v1 or a hybrid hierarchy, as on this project's CI host —
// limits are off and the agent says why at start.
#pragma once
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <memory>
#include <string>

namespace scad {

class Cgroups {
 public:
  // "auto": use cgroup v2 where it can, else off with *why. "off": never. 0 or -errno.
  static std::unique_ptr<Cgroups> open(const std::string &mode, std::string *why);
  ~Cgroups();

  const std::string &root() const { return workers_; }  // B/workers
  // Puts pid in its own cgroup with these limits (cpu in cores, memory in bytes; 0 = none).
  // "" or why it could not (the process then runs without limits).
  std::string limit(pid_t pid, double cpu, uint64_t memory);
  // After the process was reaped: removes its cgroup, remembering how many times the kernel
  // OOM-killed in it.
  void release(pid_t pid);
  // How many times the kernel OOM-killed in pid's cgroup (remembered once it was released).
  int64_t last_oom_kills(pid_t pid);

 private:
  Cgroups() = default;
  int64_t oom_kills(pid_t pid);
  std::string base_, workers_;
  std::mutex mu_;
  std::map<pid_t, int64_t> released_;  // pid -> OOM kills, the latest few
};

// The mount point of the cgroup2 hierarchy ("" if none) and this process's cgroup path in it.
std::string cgroup2_mount();
std::string own_cgroup();

}  // namespace scad
