// The agent's end of the fork server (bindings/python/scad/zygote.py): one process, started in the
// sandbox with the launcher imported, that forks a compute process per request in a few
// milliseconds, where starting an interpreter and importing the launcher takes about fifty. Each
// child makes the pid, mount, ipc, uts and cgroup namespaces and the /proc, /tmp and /code that
// bubblewrap makes for a process started afresh, and keeps no more capabilities than such a
// process has. Used when the agent runs as root; processes without network are still started
// afresh (bubblewrap's --unshare-net).
#pragma once
#include <spawn.h>
#include <sys/types.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace scad {

class Zygote {
 public:
  // Starts `command` (Sandbox::zygote_command) with `env`: its control socket at fd 3, stdin and
  // stdout /dev/null, stderr the agent's. nullptr with *why if it cannot be started.
  static std::unique_ptr<Zygote> start(const std::vector<std::string> &command, const std::vector<std::string> &env,
                                       std::string *why);
  ~Zygote();  // ends the fork server, and with it every process it forked

  struct Child {
    pid_t pid = -1;   // in this pid namespace
    int pidfd = -1;   // signals it safely, whatever its pid is given to later
    int status = -1;  // read end of the pipe that says how it ended (parse_zygote_status)
    std::string said;  // what was read from it past "ready"
  };
  // A compute process with these as its stdin, stdout and stderr (the caller keeps its copies).
  // Waits at most timeout_ms for the answer, and for the first child as long for it to be ready
  // (its sandbox made: later ones make theirs while the caller goes on, and read nothing before).
  // false with *why; the fork server is then of no further use (a request it did not answer may
  // still be answered, and the next would read that answer; a first child that could not make its
  // sandbox means none will).
  bool fork(int in, int out, int err, int64_t timeout_ms, Child *child, std::string *why);

 private:
  Zygote() = default;
  // Reads the status pipe up to its first line: "" for "ready", else what went wrong.
  static std::string wait_ready(int status, int64_t timeout_ms, std::string *said);
  pid_t pid_ = -1;  // bubblewrap's
  bool proven_ = false;  // a child of it was ready
  int control_ = -1;
  std::mutex mu_;
};

// Spawn attributes for the agent's children: no signal blocked (the agent blocks the ones its
// signal thread takes) and SIGPIPE at its default.
void plain_signals(posix_spawnattr_t *attr);

// How a forked process ended, from everything read from its status pipe up to its end: false
// when the pipe carried no verdict (the process's init was killed: by the agent, with SIGKILL).
bool parse_zygote_status(const std::string &text, int *exit_code, int *signal);

}  // namespace scad
