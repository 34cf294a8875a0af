#include "sandbox.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <set>
#include <sstream>

extern char **environ;

namespace scad {

namespace {

std::string real_path(const std::string &p) {
  char buf[PATH_MAX];
  return realpath(p.c_str(), buf) ? buf : "";
}

std::string parent(const std::string &p) {
  auto slash = p.rfind('/');
  return slash == std::string::npos || slash == 0 ? "/" : p.substr(0, slash);
}

bool is_dir(const std::string &p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// Runs argv and waits; its exit status, or -1.
int run(const std::vector<std::string> &argv) {
  std::vector<char *> cargv;
  for (auto &a : argv) cargv.push_back(const_cast<char *>(a.c_str()));
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid;
  int rc = posix_spawn(&pid, cargv[0], &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return -1;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

std::unique_ptr<Sandbox> Sandbox::open(const std::string &mode, const std::string &python,
                                       const std::string &pythonpath, const std::string &socket, std::string *why,
                                       bool *required) {
  *required = mode == "on";
  if (mode == "off") {
    *why = "--sandbox off";
    return nullptr;
  }
  if (mode != "auto" && mode != "on") {
    *why = "--sandbox takes auto, on or off; got '" + mode + "'";
    *required = true;
    return nullptr;
  }
  std::unique_ptr<Sandbox> s(new Sandbox());
  for (const char *candidate : {"/usr/bin/bwrap", "/bin/bwrap"})
    if (s->bwrap_.empty() && access(candidate, X_OK) == 0) s->bwrap_ = candidate;
  if (s->bwrap_.empty()) {
    *why = "bubblewrap (bwrap) is not installed";
    return nullptr;
  }
  s->as_root_ = geteuid() == 0;
  auto &a = s->args_;
  a = {s->bwrap_, "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
       "--unshare-cgroup-try"};
  if (s->as_root_) {
    // Root inside, with just what switching to the tenant's uid takes; the switch clears those too.
    for (const char *x : {"--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"}) a.push_back(x);
  } else {
    a.push_back("--unshare-user");
  }
  // The system, read-only. Merged-/usr systems have /lib, /bin... as links into /usr.
  a.insert(a.end(), {"--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"});
  for (const char *top : {"/lib", "/lib64", "/lib32", "/bin", "/sbin"}) {
    struct stat st;
    if (lstat(top, &st) != 0) continue;
    if (S_ISLNK(st.st_mode)) {
      char target[PATH_MAX];
      ssize_t n = readlink(top, target, sizeof target - 1);
      if (n <= 0) continue;
      a.insert(a.end(), {"--symlink", std::string(target, size_t(n)), top});
    } else {
      a.insert(a.end(), {"--ro-bind", top, top});
    }
  }
  a.insert(a.end(), {"--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--dir", "/code",
                     "--chdir", "/tmp"});
  // RDMA: libibverbs finds devices through sysfs (read-only, as container runtimes mount it) and
  // opens them under /dev/infiniband; a verbs transport needs both.
  a.insert(a.end(), {"--ro-bind", "/sys", "/sys"});
  if (is_dir("/dev/infiniband")) a.insert(a.end(), {"--dev-bind", "/dev/infiniband", "/dev/infiniband"});
  // The interpreter (a virtual environment and the installation it points to) and the Python path.
  std::set<std::string> binds;
  auto bind = [&](const std::string &dir) {
    if (dir.empty() || !is_dir(dir) || dir == "/" || dir.rfind("/usr", 0) == 0) return;
    for (auto &b : binds)
      if (dir == b || dir.rfind(b + "/", 0) == 0) return;
    binds.insert(dir);
  };
  bind(parent(parent(python)));                     // .venv (bin/python's folder's parent)
  bind(parent(parent(real_path(python))));          // the installation it links to
  std::istringstream paths(pythonpath);
  for (std::string p; std::getline(paths, p, ':');) bind(real_path(p));
  // Of the agent's state, only the memory pool's socket (connecting to it needs no write access
  // to the mount; the grant's secret is what opens an element).
  if (!socket.empty()) binds.insert(socket);
  // bwrap makes the folders above a bind mode 0700: the tenant's uid could not pass them. They are
  // made first, open to search, except where a mount of its own already is.
  std::set<std::string> made = {"/", "/usr", "/etc", "/proc", "/dev", "/tmp", "/code", "/sys"};
  for (auto &b : binds) {
    std::vector<std::string> above;
    for (std::string d = parent(b); !made.count(d); d = parent(d)) above.insert(above.begin(), d);
    for (auto &d : above) {
      a.insert(a.end(), {"--perms", "0755", "--dir", d});
      made.insert(d);
    }
    a.insert(a.end(), {"--ro-bind", b, b});
  }

  // The fork server's (zygote.h): the same view, in the agent's pid namespace (its children make
  // their own) and able to make each child's namespaces and mounts, which the child then gives up.
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] == "--unshare-pid") {
      s->zygote_args_.insert(s->zygote_args_.end(), a.begin(), a.begin() + long(i));
      s->zygote_args_.insert(s->zygote_args_.end(), a.begin() + long(i) + 1, a.end());
    }
  for (const char *x : {"--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP"}) s->zygote_args_.push_back(x);

  // Does it work here (user namespaces allowed, the kernel's features present)?
  std::vector<std::string> probe = s->args_;
  probe.insert(probe.end(), {"--", "/bin/true"});
  if (run(probe) != 0) {
    *why = "bubblewrap cannot make a sandbox here (are user namespaces disabled?)";
    return nullptr;
  }
  return s;
}

std::vector<std::string> Sandbox::command(const std::vector<std::string> &argv, bool network) const {
  std::vector<std::string> out = args_;
  if (!network) out.push_back("--unshare-net");
  out.push_back("--");
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

std::vector<std::string> Sandbox::zygote_command(const std::vector<std::string> &argv) const {
  std::vector<std::string> out = zygote_args_;
  out.push_back("--");
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

uint32_t tenant_uid(const std::string &tenant) {
  uint32_t h = 2166136261u;  // FNV-1a
  for (unsigned char c : tenant) h = (h ^ c) * 16777619u;
  return (1u << 30) + (h & ((1u << 28) - 1));
}

}  // namespace scad
