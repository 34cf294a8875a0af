// Every compute process runs in a sandbox made by bubblewrap (Debian's `bubblewrap`), as
// OpenWhisk gives every action a container of its own:
//  - its own mount, pid, ipc and uts namespaces (and a user namespace when the agent is not root);
//  - a root of its own: the interpreter, the Python path, the system's /usr, /etc and /sys read-only
//    (and /dev/infiniband, for verbs),
//    a private /tmp, and of the agent's state only the memory pool's socket (no $SCAD_HOME, no
//    scad.db, no wskprops, no other tenant's code);
//  - no new privileges, its own session, and death with the agent (--die-with-parent); a process
//    the action starts, in whatever session, dies with the sandbox's pid namespace.
// When the agent runs as root, the launcher starts as root inside (with only CAP_SETUID and
// CAP_SETGID), writes the action's code read-only into /code, and switches to the tenant's own
// unprivileged uid (tenant_uid) before it runs any user code; processes of different namespaces
// never share a uid, and none has the agent's.
// Processes with network are forked by the fork server (zygote.h), which runs in a sandbox of
// this view (zygote_command) and makes each child's namespaces and mounts as bubblewrap would.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace scad {

class Sandbox {
 public:
  // mode "auto": bubblewrap where it is installed and works here, else nullptr with *why;
  // "on": the same, but its absence is an error (*why, and `required` set); "off": nullptr.
  // `python` and `pythonpath` are what the sandbox must see; `socket` is the memory pool's.
  static std::unique_ptr<Sandbox> open(const std::string &mode, const std::string &python,
                                       const std::string &pythonpath, const std::string &socket, std::string *why,
                                       bool *required);

  // The command line that runs argv inside a fresh sandbox; without `network`, in a network
  // namespace of its own too (only loopback: the memory pool's socket still works, tcp does not).
  std::vector<std::string> command(const std::vector<std::string> &argv, bool network = true) const;
  // The command line of the fork server (zygote.h), which makes each child's sandbox itself: the
  // same view, but in this pid namespace and with CAP_SYS_ADMIN and CAP_SETPCAP kept.
  std::vector<std::string> zygote_command(const std::vector<std::string> &argv) const;
  // Whether the launcher switches to the tenant's uid (the agent runs as root).
  bool switches_uid() const { return as_root_; }

 private:
  Sandbox() = default;
  std::string bwrap_;
  std::vector<std::string> args_, zygote_args_;
  bool as_root_ = false;
};

// The unprivileged uid (and gid) a namespace's compute processes run as, the same on every host:
// 2^30 plus a hash of the name, far above the ranges distributions hand out.
uint32_t tenant_uid(const std::string &tenant);

}  // namespace scad
