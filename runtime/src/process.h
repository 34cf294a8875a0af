// A child process with its stdin fed, stdout and stderr collected, and a deadline: what the agent
// needs to run one compute element.
#pragma once
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace scad {

struct ProcessResult {
  int exit_code = -1;   // when it exited
  int signal = 0;       // when a signal ended it
  bool timed_out = false;
  std::string out, err;
};

// Runs argv with exactly `env` as its environment, writes `input` to its stdin, and waits up to
// timeout_ms (then SIGKILL). 0, or a negative errno if it could not be started.
int run_process(const std::vector<std::string> &argv, const std::map<std::string, std::string> &env,
                const std::string &input, int64_t timeout_ms, ProcessResult *out);

}  // namespace scad
