#include "cgroup.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <thread>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

namespace scad {
namespace {

std::string read_file(const std::string &path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "" or why not. cgroup files take one write each; errors come back on close.
std::string write_file(const std::string &path, const std::string &value) {
  FILE *f = fopen(path.c_str(), "we");
  if (!f) return "cannot open " + path + ": " + strerror(errno);
  bool ok = fputs(value.c_str(), f) >= 0;
  ok = (fclose(f) == 0) && ok;
  return ok ? "" : "cannot write '" + value + "' to " + path + ": " + strerror(errno);
}

bool has_word(const std::string &text, const std::string &word) {
  std::istringstream in(text);
  for (std::string w; in >> w;)
    if (w == word) return true;
  return false;
}

}  // namespace

std::string cgroup2_mount() {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    // "... - cgroup2 cgroup2 rw": the fields after " - " are the type and the source.
    auto dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream f(line);
    std::string id, parent, dev, root, mount;
    f >> id >> parent >> dev >> root >> mount;
    return mount;
  }
  return "";
}

std::string own_cgroup() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return "";
}

std::unique_ptr<Cgroups> Cgroups::open(const std::string &mode, std::string *why) {
  if (mode == "off") {
    *why = "turned off (--cgroup off)";
    return nullptr;
  }
  std::string mount = cgroup2_mount();
  if (mount.empty()) {
    *why = "no cgroup2 file system is mounted";
    return nullptr;
  }
  std::string own = own_cgroup();
  std::string base = mount + (own == "/" ? "" : own);
  std::string controllers = read_file(base + "/cgroup.controllers");
  if (!has_word(controllers, "cpu") || !has_word(controllers, "memory")) {
    *why = "the cpu and memory controllers are not available in " + base + " (cgroup.controllers: '" +
           controllers.substr(0, controllers.find('\n')) + "'; on a cgroup v1 or hybrid host they belong to v1)";
    return nullptr;
  }
  std::unique_ptr<Cgroups> c(new Cgroups());
  c->base_ = base;
  c->workers_ = base + "/workers";
  if (own != "/") {
    // No internal processes: the agent leaves B for a leaf of its own before B hands out controllers.
    mkdir((base + "/agent").c_str(), 0755);
    if (auto w = write_file(base + "/agent/cgroup.procs", std::to_string(getpid())); !w.empty()) {
      *why = w;
      return nullptr;
    }
  }
  if (auto w = write_file(base + "/cgroup.subtree_control", "+cpu +memory"); !w.empty()) {
    *why = w;
    return nullptr;
  }
  mkdir(c->workers_.c_str(), 0755);
  if (auto w = write_file(c->workers_ + "/cgroup.subtree_control", "+cpu +memory"); !w.empty()) {
    *why = w;
    return nullptr;
  }
  return c;
}

Cgroups::~Cgroups() { rmdir(workers_.c_str()); }  // fails harmlessly while a cgroup is left in it

std::string Cgroups::limit(pid_t pid, double cpu, uint64_t memory) {
  std::string dir = workers_ + "/" + std::to_string(pid);
  if (mkdir(dir.c_str(), 0755) && errno != EEXIST) return "cannot create " + dir + ": " + strerror(errno);
  // cpu.max "QUOTA PERIOD": cpu cores' worth of run time per 100 ms period.
  std::string cpu_max = cpu > 0 ? std::to_string(std::max<int64_t>(1000, std::llround(cpu * 100000))) + " 100000" : "max 100000";
  if (auto w = write_file(dir + "/cpu.max", cpu_max); !w.empty()) return w;
  if (auto w = write_file(dir + "/memory.max", memory ? std::to_string(memory) : "max"); !w.empty()) return w;
  write_file(dir + "/memory.swap.max", "0");  // absent without swap accounting: not an error
  // The process and everything it started: in a sandbox, pid is bubblewrap's and the launcher
  // is its grandchild. They are idle (waiting for their spec), so none forks while they move.
  std::vector<pid_t> todo{pid};
  for (size_t i = 0; i < todo.size() && i < 64; i++) {
    if (auto w = write_file(dir + "/cgroup.procs", std::to_string(todo[i])); !w.empty() && i == 0) return w;
    std::string task = "/proc/" + std::to_string(todo[i]) + "/task/" + std::to_string(todo[i]) + "/children";
    std::istringstream children(read_file(task));
    for (pid_t c; children >> c;) todo.push_back(c);
  }
  return "";
}

int64_t Cgroups::oom_kills(pid_t pid) {
  std::istringstream in(read_file(workers_ + "/" + std::to_string(pid) + "/memory.events"));
  for (std::string key; in >> key;) {
    int64_t n = 0;
    in >> n;
    if (key == "oom_kill") return n;
  }
  return 0;
}

void Cgroups::release(pid_t pid) {
  int64_t n = oom_kills(pid);
  std::string dir = workers_ + "/" + std::to_string(pid);
  // Whatever the process left in its cgroup (a sandbox's init, a child in a session of its own)
  // ends with it: cgroup.kill (Linux 5.14), then the cgroup is removed once the kernel says it is
  // empty (bounded: 2 s).
  write_file(dir + "/cgroup.kill", "1");
  for (int i = 0; i < 2000 && read_file(dir + "/cgroup.events").find("populated 1") != std::string::npos; i++)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  rmdir(dir.c_str());
  std::lock_guard<std::mutex> lk(mu_);
  released_[pid] = n;
  while (released_.size() > 64) released_.erase(released_.begin());
}

int64_t Cgroups::last_oom_kills(pid_t pid) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = released_.find(pid);
    if (it != released_.end()) {
      int64_t n = it->second;
      released_.erase(it);
      return n;
    }
  }
  return oom_kills(pid);
}

}  // namespace scad
