#include "agent.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <functional>
#include <fstream>
#include <iostream>
#include <chrono>
#include <sstream>

#include "action_env.h"
#include "launcher_reply.h"
#include "worker_pool.h"
#include "safe_json.h"

namespace scad {

// At the start of each line the action printed to its stdout (scad/launcher.py, STDOUT_MARK): the
// launcher sends both streams down one pipe, and this tells them apart for the logs.
constexpr char kStdoutMark[] = "\x1fscad:stdout\x1f";

using nlohmann::json;

Agent::Agent(AgentOptions opts) : opts_(std::move(opts)) {}

int safe_home(const std::string &home, std::string *why) {
  if (mkdir(home.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = "cannot create " + home + ": " + strerror(errno);
    return -errno;
  }
  // Whoever can write the home can plant code the agent runs, or sockets it trusts.
  struct stat st;
  if (lstat(home.c_str(), &st) != 0) {
    *why = "cannot examine " + home + ": " + strerror(errno);
    return -errno;
  }
  if (!S_ISDIR(st.st_mode)) {
    *why = "refusing the home " + home + ": it is not a directory (a link?)";
    return -ENOTDIR;
  }
  if (st.st_uid != geteuid() || (st.st_mode & 022)) {
    *why = "refusing the home " + home + ": it belongs to uid " + std::to_string(st.st_uid) + " with mode " +
           std::to_string((st.st_mode >> 6) & 7) + std::to_string((st.st_mode >> 3) & 7) + std::to_string(st.st_mode & 7) +
           "; it must be this process's own (uid " + std::to_string(geteuid()) + ") and writable by nobody else";
    return -EPERM;
  }
  return 0;
}

int Agent::start(std::string *why) {
  if (int rc = safe_home(opts_.home, why)) return rc;
  std::string run = opts_.home + "/run";
  mkdir(run.c_str(), 0700);
  ElementHostOptions pool;
  pool.unix_path = run + "/memory.sock";
  pool.tcp_host = opts_.tcp_host;
  pool.capacity = opts_.pool_bytes;
  pool.verbs = opts_.verbs;
  if (int rc = pool_.start(pool, why)) return rc;
  if (opts_.cgroup != "auto" && opts_.cgroup != "off") {
    *why = "--cgroup takes auto or off; got '" + opts_.cgroup + "'";
    return -EINVAL;
  }
  cgroups_ = Cgroups::open(opts_.cgroup, &cgroup_why_);
  // Compute processes reach the pool through this socket from inside their sandboxes, as another
  // uid: the socket is open to connect (its folder stays 0700; a grant's secret opens an element).
  chmod((run + "/memory.sock").c_str(), 0666);
  bool required = false;
  sandbox_ = Sandbox::open(opts_.sandbox, opts_.python, opts_.pythonpath, run + "/memory.sock", &sandbox_why_, &required);
  if (!sandbox_ && required) {
    *why = "cannot sandbox compute processes: " + sandbox_why_;
    return -EINVAL;
  }
  workers_ = std::make_unique<WorkerPool>(WorkerOptions{opts_.python, opts_.pythonpath, opts_.home, sandbox_,
                                                        opts_.prewarm, opts_.max_warm, opts_.keep_alive_ms,
                                                        opts_.warm_wait_ms, opts_.fork_server == "auto"});
  return 0;
}

int Agent::create_element(const std::string &id, uint64_t size, bool prefetch, std::string *why) {
  return pool_.add_element(id, size, prefetch, why);
}

void Agent::remove_element(const std::string &id) { pool_.remove_element(id); }

int Agent::grant(const std::string &element, const std::string &client, unsigned rights,
                 const std::string &trans_name, const std::string &impl, TransportGrant *out, std::string *why) {
  if (impl != "shm" && impl != "tcp" && impl != "verbs") {
    *why = "unknown transport '" + impl + "' (shm, tcp or verbs)";
    return -EINVAL;
  }
  if (impl == "verbs" && !rdma()) {
    *why = "host '" + opts_.host_id + "' does not serve RDMA verbs (no usable device, or --verbs off)";
    return -EINVAL;
  }
  if (int rc = pool_.grant(element, client, rights, &out->config, &out->grant_id, why)) return rc;
  out->durl = trans_name + ";" + impl;
  return 0;
}

int Agent::revoke(const std::string &grant_id, std::string *why) { return pool_.revoke(grant_id, why); }

int Agent::notify(const std::string &aid, const json &notice) {
  std::lock_guard<std::mutex> lk(run_mu_);  // the worker stays while it is in running_
  auto it = running_.find(aid);
  if (it != running_.end())
    return WorkerPool::send(*it->second, dump_json(json{{"notice", notice}, {"aid", aid}})) ? 0 : -EPIPE;
  // Not started yet (the scheduler hands instances over before their process is ready): keep it
  // for the spec. One for an instance that already ended would stay, so old ones are dropped.
  auto now = std::chrono::steady_clock::now();
  for (auto p = pending_notices_.begin(); p != pending_notices_.end();)
    p = now - p->second.since > std::chrono::minutes(10) ? pending_notices_.erase(p) : std::next(p);
  if (pending_notices_.size() >= 1024) return -ENOSPC;
  auto &p = pending_notices_[aid];
  if (p.notices.empty()) p.since = now;
  p.notices.push_back(notice);
  return 0;
}

static std::string now_iso() {
  auto now = std::chrono::system_clock::now();
  auto t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  char buf[64];
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char out[80];
  snprintf(out, sizeof out, "%s.%03lldZ", buf, (long long)ms);
  return out;
}

// Removes a folder and everything in it; nftw with FTW_PHYS never follows a link out of the
// tree, and FTW_DEPTH removes files before their folders.
static void remove_tree(const std::string &dir) {
  nftw(dir.c_str(), [](const char *path, const struct stat *, int, struct FTW *) { return remove(path), 0; }, 16,
       FTW_DEPTH | FTW_PHYS);
}

// A code key names a folder under home/code: "ns/kind/name/VERSION-HASH", nothing that climbs out.
static bool valid_code_key(const std::string &key, std::string *why) {
  bool ok = !key.empty() && key.front() != '/' && key.find("..") == std::string::npos;
  for (char c : key)
    ok = ok && (isalnum(static_cast<unsigned char>(c)) || c == '/' || c == '-' || c == '_' || c == '.' || c == '@');
  if (!ok) *why = "bad code key '" + key + "'";
  return ok;
}

std::string Agent::materialize(const std::string &key, const json &files, std::string *why) {
  if (!valid_code_key(key, why)) return "";
  std::string dir = opts_.home + "/code/" + key;
  std::lock_guard<std::mutex> lk(code_mu_);
  struct stat st;
  if (lstat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return dir;  // a version's files never change
  auto mkdirs = [](const std::string &path) {
    for (size_t i = 1; i <= path.size(); i++)
      if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0700);
  };
  // Written into a fresh folder, renamed into place when complete: a crash halfway leaves no
  // version that looks whole. The home is the agent's own (safe_home), so nobody plants links.
  mkdirs(opts_.home + "/code/.new");
  std::string fresh = opts_.home + "/code/.new/XXXXXX";
  if (!mkdtemp(fresh.data())) {
    *why = "cannot make a folder for code: " + std::string(strerror(errno));
    return "";
  }
  for (auto &[name, content] : files.items()) {
    if (name.empty() || name[0] == '/' || name.find("..") != std::string::npos || !content.is_string()) {
      *why = "bad file '" + name + "'";
      remove_tree(fresh);
      return "";
    }
    std::string path = fresh + "/" + name;
    mkdirs(path.substr(0, path.rfind('/')));
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0400);
    const std::string &text = content.get_ref<const std::string &>();
    bool ok = fd >= 0 && write(fd, text.data(), text.size()) == ssize_t(text.size());
    if (fd >= 0) close(fd);
    if (!ok) {
      *why = "cannot write code file '" + name + "': " + strerror(errno);
      remove_tree(fresh);
      return "";
    }
  }
  mkdirs(dir.substr(0, dir.rfind('/')));
  if (rename(fresh.c_str(), dir.c_str()) != 0) {
    *why = "cannot put code in place: " + std::string(strerror(errno));
    remove_tree(fresh);
    return "";
  }
  return dir;
}

std::string Agent::unpack_root(const std::string &key, std::string *why) {
  if (!valid_code_key(key, why)) return "";
  std::string root = opts_.home + "/code";
  // The namespace's folder is the agent's uid's alone: outside a sandbox every tenant's process
  // runs as that uid, so this keeps other users of the host out, not other tenants.
  for (const std::string &dir : {root, root + "/" + key.substr(0, key.find('/'))})
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      *why = "cannot make " + dir + ": " + strerror(errno);
      return "";
    }
  return root;
}

// What tells apart the warm processes of one code by their manifest's environment: "" without
// one, else a digest of its names and values (values stay out of the pool's keys).
static std::string environment_key(const std::map<std::string, std::string> &env) {
  std::string all;
  for (auto &[k, v] : env)
    if (!is_platform_env(k)) all += k + '=' + v + '\0';
  if (all.empty()) return "";
  char hex[24];
  snprintf(hex, sizeof hex, "#env:%016zx", std::hash<std::string>{}(all));
  return hex;
}

// The code the launcher places (code_folder.py), unless its process has it in place already: a
// warm process ran this very code, and a zip of megabytes need not travel down its pipe again.
static void with_code(json *launcher, const ComputeSpec &spec, const std::string &start) {
  if (!launcher->contains("files") || start == "warm") return;
  (*launcher)["files"] = spec.code_files;
  if (!spec.code_zip.empty()) (*launcher)["zip"] = spec.code_zip;
}

json Agent::launcher_spec(const ComputeSpec &spec, std::string *code, std::string *why) {
  json transports = json::array();
  for (auto &t : spec.transports) transports.push_back({{"durl", t.durl}, {"config", t.config}});
  json launcher = {{"aid", spec.aid}, {"main", spec.main}, {"args", spec.args},
                   {"transports", transports}, {"runtime_url", spec.runtime_url},
                   {"runtime_token", spec.runtime_token}};
  if (!spec.env.empty()) launcher["env"] = spec.env;
  if (!spec.code_zip.empty()) launcher["binary"] = true;
  if (sandbox_) {
    // The code travels with the spec (with_code adds it); the launcher writes it read-only into
    // the sandbox's /code and switches to the tenant's uid before it runs any of it.
    launcher["files"] = json::object();
    launcher["code"] = spec.code;
    launcher["code_key"] = spec.code_key;
    if (sandbox_->switches_uid()) launcher["uid"] = tenant_uid(spec.tenant);
    *code = spec.code_key + "/" + spec.code;
  } else if (!spec.code_zip.empty()) {
    // Unpacking a zip is the launcher's (it shares the action container's code for it): once
    // per key for the whole host, into the agent's home.
    std::string root = unpack_root(spec.code_key, why);
    if (root.empty()) return launcher;
    launcher["files"] = json::object();
    launcher["code"] = spec.code;
    launcher["code_key"] = spec.code_key;
    launcher["code_root"] = root;
    *code = root + "/" + spec.code_key + "/" + spec.code;
  } else {
    std::string dir = materialize(spec.code_key, spec.code_files, why);
    if (dir.empty()) return launcher;
    *code = dir + "/" + spec.code;
    launcher["code"] = *code;
  }
  return launcher;
}

int Agent::remove_code(const std::string &prefix) {
  int parts = 0;
  for (char c : prefix) {
    if (c == '/') parts++;
    else if (!isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' && c != '@') return -EINVAL;
  }
  if (parts != 2 || prefix.find("..") != std::string::npos || prefix.front() == '/' || prefix.back() == '/')
    return -EINVAL;
  std::lock_guard<std::mutex> lk(code_mu_);
  remove_tree(opts_.home + "/code/" + prefix);
  return 0;
}

ComputeOutcome Agent::run_compute(const ComputeSpec &spec) {
  ComputeOutcome o;
  if (!spec.network && !sandbox_) {
    o.status = "whisk internal error";
    o.error = {{"type", "SandboxError"},
               {"message", "this element asks for no network, and host '" + opts_.host_id +
                               "' runs compute processes without a sandbox (" + sandbox_off_reason() + ")"}};
    return o;
  }
  // `code` names the action's code for the warm pool: one process per code and function.
  std::string code, code_why;
  json launcher = launcher_spec(spec, &code, &code_why);
  if (code.empty()) {
    o.status = "whisk internal error";
    o.error = {{"type", "CodeError"}, {"message", code_why}};
    return o;
  }
  // One process per action: the code file names the application version, plus the function and
  // the manifest's environment (a library reads some variables once, at import, and a warm
  // process keeps what it imported).
  auto w = workers_->acquire(code + "#" + spec.main + environment_key(spec.env), &o.start, spec.network);
  auto t0 = std::chrono::steady_clock::now();
  std::string stamp = now_iso();
  if (!w) {
    std::lock_guard<std::mutex> lk(run_mu_);
    pending_notices_.erase(spec.aid);
    o.status = "whisk internal error";
    o.error = {{"type", "StartError"}, {"message", "cannot start " + opts_.python + ": " + strerror(errno)}};
    return o;
  }
  pid_t pid = w->pid;
  with_code(&launcher, spec, o.start);
  if (cgroups_) {
    std::string why = cgroups_->limit(pid, spec.cpu, spec.memory);
    if (!why.empty()) o.logs.push_back(stamp + " stderr: scad agent: running without cgroup limits: " + why);
    std::weak_ptr<Cgroups> cg = cgroups_;
    w->on_exit = [cg](pid_t p) {
      if (auto c = cg.lock()) c->release(p);
    };
  }
  {
    // From here notices go straight to the process; those that came before ride in the spec.
    std::lock_guard<std::mutex> lk(run_mu_);
    running_[spec.aid] = w.get();
    auto p = pending_notices_.find(spec.aid);
    if (p != pending_notices_.end()) {
      launcher["peer_failures"] = p->second.notices;
      pending_notices_.erase(p);
    }
  }
  WorkerRun r = workers_->run(*w, dump_json(launcher), spec.timeout_ms, spec.log_bytes);
  {
    std::lock_guard<std::mutex> lk(run_mu_);
    running_.erase(spec.aid);
  }
  o.duration_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  // User code may print any bytes: log lines are kept as valid UTF-8 (bad bytes become U+FFFD),
  // so every later dump of the record works.
  auto add_logs = [&](const std::string &text) {
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) {
      // The launcher marks the lines the action printed to stdout (both streams share one pipe).
      bool out = line.rfind(kStdoutMark, 0) == 0;
      if (out) line.erase(0, sizeof kStdoutMark - 1);
      o.logs.push_back(stamp + (out ? " stdout: " : " stderr: ") + valid_utf8(line));
    }
  };
  LauncherReply reply;
  std::string bad_reply;
  bool replied = !r.died && !r.timed_out && parse_launcher_reply(r.reply, &reply, &bad_reply);
  add_logs(r.stderr_text);
  if (r.output_dropped)
    o.logs.push_back(stamp + " stderr: scad agent: the output limit of " + std::to_string(spec.log_bytes) +
                     " bytes was reached; " + std::to_string(r.output_dropped) + " more bytes were dropped");
  if (r.timed_out) {
    workers_->release(std::move(w), false);
    o.status = "action developer error";
    o.error = {{"type", "TimeoutError"}, {"timeout_ms", spec.timeout_ms},
               {"message", "the compute element ran longer than its limit of " + std::to_string(spec.timeout_ms) + " ms"}};
    return o;
  }
  // The launcher answers one JSON line per run; anything else means the process died under it
  // (or user code wrote to the result pipe: the process is not reused either way).
  if (!replied) {
    int64_t ooms = cgroups_ ? cgroups_->last_oom_kills(pid) : 0;
    workers_->release(std::move(w), false);
    o.status = "action developer error";
    std::string how = r.reply_too_long ? "wrote a result line longer than " + std::to_string(kMaxReplyBytes >> 20) + " MiB"
                      : !r.died        ? "answered a malformed result line (" + bad_reply + ")"
                      : r.signal       ? "was killed by signal " + std::to_string(r.signal)
                                       : "exited with status " + std::to_string(r.exit_code) + " without a result";
    if (ooms > 0)
      how += ": the kernel's OOM killer ended it for going over its memory limit of " +
             std::to_string(spec.memory >> 20) + " MiB (cgroup memory.max)";
    o.error = {{"type", "Crash"}, {"message", "the compute element crashed: it " + how}};
    return o;
  }
  // A process whose code did not load is not kept, as OpenWhisk removes a container whose init
  // failed: the next activation starts afresh.
  workers_->release(std::move(w), reply.ok || reply.init.empty());
  o.ok = reply.ok;
  o.init_ms = reply.init_ms;
  o.transports = std::move(reply.transports);
  o.transfers = std::move(reply.transfers);
  if (o.ok) {
    o.status = "success";
    o.result = std::move(reply.result);
  } else if (!reply.init.empty()) {
    // The code did not compile or start: the developer's error, as OpenWhisk's runtimes report
    // a failed /init; the reason goes to the logs.
    o.status = "action developer error";
    o.error = std::move(reply.error);
    o.error["init"] = reply.init;
    add_logs(reply.traceback);
  } else {
    o.status = "application error";
    o.error = std::move(reply.error);
    add_logs(reply.traceback);
  }
  return o;
}

}  // namespace scad
