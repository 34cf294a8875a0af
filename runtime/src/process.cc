#include "process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

namespace scad {

int run_process(const std::vector<std::string> &argv, const std::map<std::string, std::string> &env,
                const std::string &input, int64_t timeout_ms, ProcessResult *out) {
  int in[2], o[2], e[2];
  if (pipe2(in, O_CLOEXEC) || pipe2(o, O_CLOEXEC) || pipe2(e, O_CLOEXEC)) return -errno;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, o[1], 1);
  posix_spawn_file_actions_adddup2(&fa, e[1], 2);
  std::vector<char *> cargv, cenv;
  std::vector<std::string> envs;
  for (auto &a : argv) cargv.push_back(const_cast<char *>(a.c_str()));
  cargv.push_back(nullptr);
  for (auto &[k, v] : env) envs.push_back(k + "=" + v);
  for (auto &s : envs) cenv.push_back(s.data());
  cenv.push_back(nullptr);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, cargv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(o[1]);
  close(e[1]);
  if (rc != 0) {
    close(in[1]);
    close(o[0]);
    close(e[0]);
    return -rc;
  }
  fcntl(in[1], F_SETFL, O_NONBLOCK);
  size_t written = 0;
  if (input.empty()) { close(in[1]); in[1] = -1; }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool open_o = true, open_e = true;
  char buf[65536];
  while (open_o || open_e) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      out->timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    struct pollfd p[3];
    int n = 0;
    if (open_o) p[n++] = {o[0], POLLIN, 0};
    if (open_e) p[n++] = {e[0], POLLIN, 0};
    if (in[1] >= 0) p[n++] = {in[1], POLLOUT, 0};
    int r = poll(p, nfds_t(n), int(std::min<int64_t>(left, 1000)));
    if (r < 0 && errno != EINTR) break;
    for (int i = 0; i < n; i++) {
      if (!p[i].revents) continue;
      if (p[i].fd == in[1]) {
        ssize_t w = write(in[1], input.data() + written, input.size() - written);
        if (w > 0) written += size_t(w);
        if (w < 0 || written == input.size()) { close(in[1]); in[1] = -1; }
        continue;
      }
      ssize_t got = read(p[i].fd, buf, sizeof buf);
      if (got <= 0) {
        if (p[i].fd == o[0]) open_o = false; else open_e = false;
        continue;
      }
      (p[i].fd == o[0] ? out->out : out->err).append(buf, size_t(got));
    }
  }
  if (in[1] >= 0) close(in[1]);
  close(o[0]);
  close(e[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) out->exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) out->signal = WTERMSIG(status);
  return 0;
}

}  // namespace scad
