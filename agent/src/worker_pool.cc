#include "worker_pool.h"

#include "sandbox.h"
#include "zygote.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstdio>
#include <utility>
#include <vector>

extern char **environ;

namespace scad {

using Clock = std::chrono::steady_clock;

namespace {
constexpr size_t kWaitersPerProcess = 4;  // callers that may queue for each running process of an action
// The longest a request to the fork server waits for its answer (its first waits for its imports).
constexpr int64_t kZygoteAnswerMs = 10000;

// A process's stdin, stdout and stderr: made together (none left open if one cannot be); the
// child's ends are closed once it has them (or never will), and the agent's go to its Worker.
struct StdioPipes {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  bool make() { return pipe2(in, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0; }
  void hand_to(Worker *w) {
    for (int *fd : {&in[0], &out[1], &err[1]}) close(std::exchange(*fd, -1));
    w->in = std::exchange(in[1], -1);
    w->out = std::exchange(out[0], -1);
    w->err = std::exchange(err[0], -1);
    fcntl(w->out, F_SETFL, O_NONBLOCK);
    fcntl(w->err, F_SETFL, O_NONBLOCK);
  }
  ~StdioPipes() {
    for (int fd : {in[0], in[1], out[0], out[1], err[0], err[1]})
      if (fd >= 0) close(fd);
  }
};
}  // namespace

Worker::~Worker() {
  for (int fd : {in, out, err})
    if (fd >= 0) close(fd);
  if (pid > 0) {
    kill_now();
    int code, sig;
    reap(&code, &sig);
    if (on_exit) on_exit(pid);
  }
  for (int fd : {pidfd, status})
    if (fd >= 0) close(fd);
}

bool Worker::alive() const {
  struct pollfd p = {out, POLLIN, 0};
  return out >= 0 && (poll(&p, 1, 0) == 0 || !(p.revents & (POLLHUP | POLLERR)));
}

bool Worker::ends_by(std::chrono::steady_clock::time_point deadline) const {
  if (status < 0) return true;  // bubblewrap holds the pipes until the sandbox ends
  int code, sig;
  if (parse_zygote_status(status_text, &code, &sig)) return true;  // it said so with "ready"
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    struct pollfd p = {status, POLLIN, 0};
    int ready = poll(&p, 1, int(std::clamp<int64_t>(left, 0, 1000)));
    if (ready > 0) return true;
    if (ready < 0 && errno != EINTR) return true;  // nothing to wait on: reap() finds out
    if (ready == 0 && left <= 0) return false;
  }
}

void Worker::kill_now() {
  if (pidfd >= 0)
    syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
  else if (pid > 0)
    kill(pid, SIGKILL);
}

bool Worker::reap(int *exit_code, int *signal, std::string *why) {
  *exit_code = -1;
  *signal = 0;
  if (status < 0) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid) return false;
    if (WIFEXITED(st)) *exit_code = WEXITSTATUS(st);
    if (WIFSIGNALED(st)) *signal = WTERMSIG(st);
    return true;
  }
  // The status pipe closes when the process's init ends; its last line says how the process did.
  std::string text = status_text;
  char buf[512];
  fcntl(status, F_SETFL, fcntl(status, F_GETFL) & ~O_NONBLOCK);
  for (ssize_t n; (n = read(status, buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (text.size() < 65536) text.append(buf, size_t(n));
  }
  if (!parse_zygote_status(text, exit_code, signal)) *signal = SIGKILL;  // the init itself was killed
  if (why) {
    auto at = text.find("error ");
    if (at != std::string::npos) *why = text.substr(at + 6, text.find('\n', at) - at - 6);
  }
  return true;
}

WorkerPool::WorkerPool(WorkerOptions o) : o_(std::move(o)) {
  maintainer_ = std::thread([this] { maintain(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  maintainer_.join();
}

std::unique_ptr<Worker> WorkerPool::fork_from_zygote() {
  StdioPipes pipes;
  if (!zygote_ || !pipes.make()) return nullptr;
  Zygote::Child child;
  std::string why;
  bool forked = zygote_->fork(pipes.in[0], pipes.out[1], pipes.err[1], kZygoteAnswerMs, &child, &why);
  if (!forked) {
    // Kept, not ended: the processes it made die with it. It is asked for nothing more.
    fprintf(stderr, "scad agent: the fork server failed (%s): compute processes start afresh\n", why.c_str());
    retired_zygote_ = std::move(zygote_);
    return nullptr;
  }
  auto w = std::make_unique<Worker>();
  pipes.hand_to(w.get());
  w->pid = child.pid;
  w->pidfd = child.pidfd;
  w->status = child.status;
  w->status_text = std::move(child.said);
  return w;
}

std::vector<std::string> WorkerPool::process_env() const {
  // HOME is the sandbox's private /tmp; unconfined, the agent's state folder as before.
  return {"PYTHONPATH=" + o_.pythonpath, "PATH=/usr/local/bin:/usr/bin:/bin",
          "HOME=" + (o_.sandbox ? std::string("/tmp") : o_.home), "PYTHONUNBUFFERED=1"};
}

std::unique_ptr<Worker> WorkerPool::spawn(bool network) {
  std::vector<std::string> env = process_env();
  if (zygote_ && zygote_failed_.exchange(false)) {
    fprintf(stderr, "scad agent: a process of the fork server could not be set up: compute processes start afresh\n");
    retired_zygote_ = std::move(zygote_);
  }
  // Without network a process is started afresh, in a network namespace of its own.
  if (zygote_ && network)
    if (auto w = fork_from_zygote()) return w;
  StdioPipes pipes;
  if (!pipes.make()) return nullptr;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipes.in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, pipes.out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, pipes.err[1], 2);
  std::vector<char *> cenv;
  for (auto &e : env) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  std::vector<std::string> args = {o_.python, "-m", "scad.launcher", "--serve"};
  if (o_.sandbox) args = o_.sandbox->command(args, network);
  std::vector<char *> argv;
  for (auto &a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawnattr_t attr;
  plain_signals(&attr);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &fa, &attr, argv.data(), cenv.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) return nullptr;
  auto w = std::make_unique<Worker>();
  pipes.hand_to(w.get());
  w->pid = pid;
  return w;
}

void WorkerPool::mark_busy_locked(Worker *w, const std::string &key) {
  assert(!w->busy);  // replacing a token would run its deleter here, under mu_
  w->acquired = Clock::now();
  actions_[key].running++;
  // Uncounted when the worker is released or ended, whichever comes first; never under mu_,
  // which the deleter takes: release() lets go of it after unlocking, and a worker a caller
  // holds is ended outside the lock. Waiters wake: with nothing left running they stop waiting.
  w->busy = std::shared_ptr<void>(nullptr, [this, key](void *) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = actions_.find(key);
    if (it == actions_.end()) return;
    it->second.running--;
    if (it->second.running == 0 && it->second.waiters.empty() && it->second.run_ms < 0) actions_.erase(it);
    cv_.notify_all();
  });
}

double WorkerPool::cold_estimate_ms_locked() const {
  return std::min(cold_ms_ < 0 ? double(o_.warm_wait_ms) : cold_ms_, double(o_.warm_wait_ms));
}

bool WorkerPool::worth_waiting_locked(const std::string &key) const {
  if (o_.warm_wait_ms <= 0) return false;
  auto it = actions_.find(key);
  if (it == actions_.end() || it->second.running == 0 || it->second.run_ms < 0) return false;
  // The running processes free up about once a run each, and callers already waiting go first:
  // worth waiting for if this caller's turn comes sooner than a process of its own would be ready.
  // A queue several deep per running process starts one more instead, so a fan-out grows to some
  // processes of its own (kept warm for its next wave) rather than queueing behind one.
  const PerAction &a = it->second;
  if (a.waiters.size() >= kWaitersPerProcess * size_t(a.running)) return false;
  double turn_ms = double(a.waiters.size() + 1) / double(a.running) * a.run_ms;
  return turn_ms < cold_estimate_ms_locked();
}

std::unique_ptr<Worker> WorkerPool::acquire(const std::string &plain_key, std::string *how, bool network) {
  std::string key = network ? plain_key : plain_key + " (no network)";
  std::unique_ptr<Worker> w;
  std::vector<std::unique_ptr<Worker>> dead;  // ended after the lock
  {
    std::unique_lock<std::mutex> lk(mu_);
    // An idle process that died meanwhile (killed, or gone with the fork server that made it) is
    // passed over, and ended after the lock.
    auto take_idle = [&](bool prewarmed_too) {
      for (auto it = warm_.find(key); it != warm_.end() && it->first == key; it = warm_.find(key)) {
        w = std::move(it->second);
        warm_.erase(it);
        *how = "warm";
        if (w->alive()) break;
        dead.push_back(std::move(w));
      }
      while (!w && prewarmed_too && network && !fresh_.empty()) {
        w = std::move(fresh_.front());
        fresh_.pop_front();
        cv_.notify_all();  // top up
        if (!w->alive()) {
          dead.push_back(std::move(w));
          continue;
        }
        w->key = key;
        *how = "prewarmed";
      }
      return w != nullptr;
    };
    // A sibling's process, when one is worth waiting for, goes before a pre-warmed one: every
    // pre-warmed process taken is replaced by starting another, which a wide fan-out of short
    // runs cannot afford.
    bool wait = worth_waiting_locked(key);
    if (!take_idle(!wait) && wait) {
      std::unique_ptr<Worker> handed;
      auto &waiters = actions_[key].waiters;
      waiters.push_back(&handed);
      auto longest = std::chrono::duration<double, std::milli>(cold_estimate_ms_locked());
      cv_.wait_for(lk, longest, [&] { return handed || stopping_ || actions_[key].running == 0; });
      auto &still = actions_[key].waiters;
      for (auto at = still.begin(); at != still.end(); ++at)
        if (*at == &handed) {
          still.erase(at);
          break;
        }
      if (handed) {  // counted running from the moment it was handed over
        *how = "warm";
        return handed;
      }
      take_idle(true);  // one may have gone idle without a waiter's turn; or a pre-warmed one
    }
    if (w) {
      mark_busy_locked(w.get(), key);
      return w;
    }
  }
  *how = "cold";
  w = spawn_on_maintainer(network);
  if (w) {
    w->key = key;
    w->started_cold = true;
    std::lock_guard<std::mutex> lk(mu_);
    mark_busy_locked(w.get(), key);
  }
  cv_.notify_all();
  return w;
}

std::unique_ptr<Worker> WorkerPool::spawn_on_maintainer(bool network) {
  SpawnRequest made{{}, network};
  auto result = made.made.get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return nullptr;
    spawn_requests_.push_back(&made);
  }
  cv_.notify_all();
  return result.get();
}

void WorkerPool::release(std::unique_ptr<Worker> w, bool healthy) {
  if (!w) return;
  if (!healthy) {
    w->busy.reset();  // no longer running (takes mu_ itself)
    return;           // the destructor ends it
  }
  // Both let go of after the lock: the token's deleter takes it, and ending a process waits for
  // it (and for its cgroup to empty).
  std::shared_ptr<void> busy = std::move(w->busy);
  std::unique_ptr<Worker> evicted;
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) return;
  auto now = Clock::now();
  auto &a = actions_[w->key];
  double took = std::chrono::duration<double, std::milli>(now - w->acquired).count();
  // A process started for its run took the interpreter's start and the run (a moving average);
  // one that was up already, the run alone. For runs, the estimate follows a shorter run at once
  // and a longer one slowly: on a host busy starting processes every run takes longer than the
  // action needs, and an estimate that followed that would keep the host starting processes.
  if (w->started_cold) {
    cold_ms_ = cold_ms_ < 0 ? took : 0.8 * cold_ms_ + 0.2 * took;
  } else {
    a.run_ms = a.run_ms < 0 || took < a.run_ms ? took : 0.9 * a.run_ms + 0.1 * took;
  }
  w->started_cold = false;
  if (!a.waiters.empty()) {  // straight to the caller that has waited longest
    std::unique_ptr<Worker> *to = a.waiters.front();
    a.waiters.pop_front();
    // Still counted running (it keeps its token): until its caller wakes, a newcomer must not
    // find the action idle and start a process of its own.
    w->busy = std::move(busy);
    w->acquired = now;
    *to = std::move(w);
    cv_.notify_all();
    return;
  }
  if (o_.max_warm <= 0) return;
  if (int(warm_.size()) >= o_.max_warm) {
    // Full: the process idle longest goes (whatever its action), as OpenWhisk evicts its least
    // recently used container, so that an action running now keeps its processes.
    auto oldest = warm_.begin();
    for (auto it = warm_.begin(); it != warm_.end(); ++it)
      if (it->second->idle_since < oldest->second->idle_since) oldest = it;
    evicted = std::move(oldest->second);
    warm_.erase(oldest);
  }
  w->idle_since = now;
  warm_.emplace(w->key, std::move(w));
}

void WorkerPool::maintain() {
  // The fork server imports while the pool fills, so the first process it forks does not wait.
  // Only for an agent that runs as root (scad/zygote.py says why).
  if (o_.sandbox && o_.zygote && o_.sandbox->switches_uid()) {
    std::string why;
    zygote_ = Zygote::start(o_.sandbox->zygote_command({o_.python, "-m", "scad.zygote"}), process_env(), &why);
    if (!zygote_) fprintf(stderr, "scad agent: no fork server (%s): compute processes start afresh\n", why.c_str());
  }
  std::unique_lock<std::mutex> lk(mu_);
  // A caller waiting for a cold start goes before topping up the pre-warmed pool.
  auto serve_requests = [&] {
    while (!spawn_requests_.empty()) {
      auto *req = spawn_requests_.front();
      spawn_requests_.pop_front();
      lk.unlock();
      auto w = spawn(req->network);  // outside the lock: spawning takes a moment
      req->made.set_value(std::move(w));
      lk.lock();
    }
  };
  while (!stopping_) {
    serve_requests();
    while (int(fresh_.size()) < o_.prewarm && !stopping_) {
      lk.unlock();
      auto w = spawn();
      lk.lock();
      if (!w) break;
      fresh_.push_back(std::move(w));
      serve_requests();
    }
    if (!spawn_requests_.empty()) continue;
    auto now = Clock::now();
    std::vector<std::unique_ptr<Worker>> expired;  // ended outside the lock (each waits for its process)
    for (auto it = warm_.begin(); it != warm_.end();) {
      if (now - it->second->idle_since > std::chrono::milliseconds(o_.keep_alive_ms)) {
        expired.push_back(std::move(it->second));
        it = warm_.erase(it);
      } else {
        ++it;
      }
    }
    if (!expired.empty()) {
      lk.unlock();
      expired.clear();
      lk.lock();
    }
    // An action with nothing running, waiting or warm is forgotten (its runs' length with it).
    for (auto it = actions_.begin(); it != actions_.end();)
      it = it->second.running == 0 && it->second.waiters.empty() && !warm_.count(it->first) ? actions_.erase(it)
                                                                                               : std::next(it);
    cv_.wait_for(lk, std::chrono::milliseconds(std::max<int64_t>(100, o_.keep_alive_ms / 4)));
  }
  for (auto *req : spawn_requests_) req->made.set_value(nullptr);
  spawn_requests_.clear();
  fresh_.clear();
  warm_.clear();
  lk.unlock();
  zygote_.reset();
  retired_zygote_.reset();
}

bool WorkerPool::send(Worker &w, const std::string &line) {
  std::lock_guard<std::mutex> lk(w.in_mu);  // whole lines: a notice never lands inside a spec
  std::string msg = line + "\n";
  size_t sent = 0;
  while (sent < msg.size()) {  // lines are small; the pipe takes them (or the worker is gone)
    ssize_t n = write(w.in, msg.data() + sent, msg.size() - sent);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    sent += size_t(n);
  }
  return true;
}

WorkerRun WorkerPool::run(Worker &w, const std::string &line, int64_t timeout_ms, uint64_t max_output) {
  WorkerRun r;
  r.died = !send(w, line);
  auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[65536];
  // The launcher's END_OF_RUN and its newline.
  static const std::string kEnd = std::string(1, '\0') + "scad:end-of-run" + std::string(1, '\0') + "\n";
  bool have_reply = false, have_end = false;
  // Output is scanned for the marker once, as it arrives. Past max_output only a tail long enough
  // to hold a marker split across reads is kept.
  std::string tail;
  auto take_output = [&](const char *data, size_t n) {
    if (!have_end) {
      tail.append(data, n);
      auto at = tail.find(kEnd);
      if (at != std::string::npos) {
        have_end = true;
        size_t marker = tail.size() - at;  // the marker (and anything after it) is not output
        if (marker > n) {  // it began in an earlier read: take back what was kept of it
          size_t back = marker - n;
          size_t from_dropped = std::min<uint64_t>(back, r.output_dropped);
          r.output_dropped -= from_dropped;
          r.stderr_text.resize(r.stderr_text.size() - std::min(r.stderr_text.size(), back - from_dropped));
        }
        n -= std::min(n, marker);
      }
      if (tail.size() > kEnd.size()) tail.erase(0, tail.size() - kEnd.size());
    }
    size_t room = r.stderr_text.size() < max_output ? size_t(max_output - r.stderr_text.size()) : 0;
    r.stderr_text.append(data, std::min(n, room));
    r.output_dropped += n - std::min(n, room);
  };
  size_t scanned = 0;  // bytes of w.pending known to hold no newline
  while (!r.died) {
    auto nl = have_reply ? std::string::npos : w.pending.find('\n', scanned);
    if (!have_reply) scanned = nl == std::string::npos ? w.pending.size() : 0;
    if (nl != std::string::npos) {
      r.reply = w.pending.substr(0, nl);
      w.pending.erase(0, nl + 1);
      have_reply = true;
    } else if (!have_reply && w.pending.size() > kMaxReplyBytes) {
      r.reply_too_long = r.died = true;
      w.kill_now();
      break;
    }
    // The run's output ends with the marker on stderr: the result alone is not the end of it.
    if (have_reply && have_end) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      r.timed_out = true;
      break;
    }
    struct pollfd p[2] = {{w.out, short(have_reply ? 0 : POLLIN), 0}, {w.err, POLLIN, 0}};
    if (poll(p, 2, int(std::min<int64_t>(left, 1000))) < 0 && errno != EINTR) break;
    if (p[1].revents) {
      ssize_t n = read(w.err, buf, sizeof buf);
      if (n > 0) take_output(buf, size_t(n));
      else if (n == 0) r.died = true;
    }
    if (p[0].revents && !have_reply) {
      ssize_t n = read(w.out, buf, sizeof buf);
      if (n > 0) w.pending.append(buf, size_t(n));
      else if (n == 0 || (errno != EAGAIN && errno != EINTR)) r.died = true;
    }
  }
  if (r.died || r.timed_out) {
    // A forked process's pipes are its own alone: closing them is not ending (user code may close
    // fd 1 and 2 and go on). It is waited for until its deadline, then ended as timed out.
    // (A process that ends right at its deadline still gets a moment to say how.)
    if (r.died && !r.timed_out && !w.ends_by(std::max(deadline, Clock::now() + std::chrono::milliseconds(200))))
      r.timed_out = true;
    if (r.timed_out) w.kill_now();
    ssize_t n;
    while ((n = read(w.err, buf, sizeof buf)) > 0) take_output(buf, size_t(n));
    std::string why;
    if (w.reap(&r.exit_code, &r.signal, &why)) {
      // A process the fork server could not set up says why (never user code: it had not run).
      if (!why.empty()) {
        r.stderr_text += "scad agent: the process could not be set up: " + why + "\n";
        zygote_failed_ = true;  // none of its processes will be: the next is started by bubblewrap
      }
      // bubblewrap exits with 128 + the signal that ended the sandboxed process, as shells do.
      if (o_.sandbox && w.status < 0 && r.exit_code > 128 && r.exit_code < 128 + 65) {
        r.signal = r.exit_code - 128;
        r.exit_code = -1;
      }
      if (w.on_exit) w.on_exit(w.pid);
      w.pid = -1;
    }
  }
  return r;
}

}  // namespace scad
