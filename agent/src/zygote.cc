#include "zygote.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

namespace scad {

namespace {
constexpr int kControlFd = 3;  // scad/zygote.py's CONTROL_FD
}

std::unique_ptr<Zygote> Zygote::start(const std::vector<std::string> &command, const std::vector<std::string> &env,
                                      std::string *why) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    *why = std::string("socketpair: ") + strerror(errno);
    return nullptr;
  }
  // dup2 onto itself would keep close-on-exec: the child's end is moved off 3 first if it is there.
  if (sv[1] == kControlFd) {
    int moved = fcntl(sv[1], F_DUPFD_CLOEXEC, kControlFd + 1);
    close(sv[1]);
    sv[1] = moved;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, sv[1], kControlFd);
  std::vector<std::string> args = command, envs = env;
  std::vector<char *> argv, envp;
  for (auto &a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto &e : envs) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawnattr_t attr;
  plain_signals(&attr);
  std::unique_ptr<Zygote> z(new Zygote());
  int rc = posix_spawn(&z->pid_, argv[0], &fa, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  close(sv[1]);
  if (rc != 0) {
    close(sv[0]);
    *why = "cannot start " + command[0] + ": " + strerror(rc);
    return nullptr;
  }
  z->control_ = sv[0];
  return z;
}

Zygote::~Zygote() {
  if (control_ >= 0) close(control_);  // the fork server reads the end of its requests and exits
  if (pid_ <= 0) return;
  for (int waited_ms = 0; waited_ms < 1000; waited_ms += 10) {
    if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
    usleep(10000);
  }
  kill(pid_, SIGKILL);  // one that does not: its children die with it
  waitpid(pid_, nullptr, 0);
}

bool Zygote::fork(int in, int out, int err, int64_t timeout_ms, Child *child, std::string *why) {
  std::lock_guard<std::mutex> lk(mu_);
  int status[2];
  if (pipe2(status, O_CLOEXEC) != 0) {
    *why = std::string("pipe: ") + strerror(errno);
    return false;
  }
  const int fds[4] = {in, out, err, status[1]};
  char request[] = "fork";
  struct iovec iov = {request, sizeof request - 1};
  alignas(struct cmsghdr) char space[CMSG_SPACE(sizeof fds)] = {};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = space;
  msg.msg_controllen = sizeof space;
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof fds);
  memcpy(CMSG_DATA(c), fds, sizeof fds);
  ssize_t sent;
  do sent = sendmsg(control_, &msg, MSG_NOSIGNAL);
  while (sent < 0 && errno == EINTR);
  close(status[1]);
  auto fail = [&](const std::string &text) {
    close(status[0]);
    *why = text;
    return false;
  };
  if (sent < 0) return fail(std::string("the fork server is gone (") + strerror(errno) + ")");

  struct pollfd p = {control_, POLLIN, 0};
  int ready;
  do ready = poll(&p, 1, int(timeout_ms));
  while (ready < 0 && errno == EINTR);
  if (ready <= 0) return fail("the fork server did not answer within " + std::to_string(timeout_ms) + " ms");
  char answer[4097];
  alignas(struct cmsghdr) char back[CMSG_SPACE(sizeof(int))] = {};
  struct iovec biov = {answer, sizeof answer - 1};
  struct msghdr reply = {};
  reply.msg_iov = &biov;
  reply.msg_iovlen = 1;
  reply.msg_control = back;
  reply.msg_controllen = sizeof back;
  ssize_t n;
  do n = recvmsg(control_, &reply, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return fail(n == 0 ? "the fork server ended" : std::string("reading the fork server: ") + strerror(errno));
  int pidfd = -1;
  for (struct cmsghdr *h = CMSG_FIRSTHDR(&reply); h; h = CMSG_NXTHDR(&reply, h))
    if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS && h->cmsg_len == CMSG_LEN(sizeof(int)))
      memcpy(&pidfd, CMSG_DATA(h), sizeof(int));
  std::string text(answer, size_t(n));
  long pid = 0;
  if (text.rfind("pid ", 0) != 0 || pidfd < 0 || (pid = strtol(text.c_str() + 4, nullptr, 10)) <= 0) {
    if (pidfd >= 0) close(pidfd);
    return fail(text.rfind("error ", 0) == 0 ? "the fork server: " + text.substr(6)
                                             : "the fork server answered '" + text.substr(0, 200) + "'");
  }
  // The first child proves the fork server can make a sandbox here: it is waited for until it is
  // ready, and one that could not make its sandbox says why. Later ones are handed out at once
  // (their launcher reads nothing before it is ready) and set up while the next is forked.
  std::string said;
  std::string failed = proven_ ? "" : wait_ready(status[0], timeout_ms, &said);
  if (said.find('\n') != std::string::npos) said.erase(0, said.find('\n') + 1);  // past "ready"
  proven_ = proven_ || failed.empty();
  if (!failed.empty()) {
    syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
    close(pidfd);
    return fail(failed);
  }
  child->pid = pid_t(pid);
  child->pidfd = pidfd;
  child->status = status[0];
  child->said = said;  // what came after "ready" in the same read
  return true;
}

std::string Zygote::wait_ready(int status, int64_t timeout_ms, std::string *said) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[4096];
  while (said->find('\n') == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    struct pollfd p = {status, POLLIN, 0};
    int ready = poll(&p, 1, int(std::max<int64_t>(0, left.count())));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return "a forked process was not ready within " + std::to_string(timeout_ms) + " ms";
    ssize_t n = read(status, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return "a forked process ended before it was ready";
    said->append(buf, size_t(n));
  }
  std::string line = said->substr(0, said->find('\n'));
  if (line == "ready") return "";
  if (line.rfind("error ", 0) == 0) return "a forked process could not be set up: " + line.substr(6, 1000);
  return "a forked process said '" + line.substr(0, 200) + "'";
}

void plain_signals(posix_spawnattr_t *attr) {
  posix_spawnattr_init(attr);
  sigset_t none, reset;
  sigemptyset(&none);
  sigemptyset(&reset);
  sigaddset(&reset, SIGPIPE);
  posix_spawnattr_setsigmask(attr, &none);
  posix_spawnattr_setsigdefault(attr, &reset);
  posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
}

bool parse_zygote_status(const std::string &text, int *exit_code, int *signal) {
  std::istringstream in(text);
  bool found = false;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string what;
    int value;
    if (!(words >> what >> value)) continue;
    if (what == "exit") {
      *exit_code = value;
      *signal = 0;
      found = true;
    } else if (what == "signal") {
      *signal = value;
      *exit_code = -1;
      found = true;
    }
  }
  return found;
}

}  // namespace scad
