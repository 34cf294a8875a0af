// Per-host credentials: each agent has a key of its own ("ID:SECRET" in its token file), and the
// scheduler holds a file of "ID SHA256-OF-SECRET" lines (scad-server --host-keys; `scad host key
// ID` makes one). A key registers only its own host id, so no host can pose as another, and a host
// is revoked by deleting its line: the file is read again when it changes, and the host's next
// heartbeat is refused.
#pragma once
#include <ctime>
#include <map>
#include <mutex>
#include <string>

namespace scad {

class HostKeys {
 public:
  explicit HostKeys(std::string path) : path_(std::move(path)) {}
  // Whether `bearer` ("ID:SECRET") is the current key of host `id`. Never throws.
  bool admits(const std::string &bearer, const std::string &id);

 private:
  void reload_locked();
  std::string path_;
  std::mutex mu_;
  struct timespec mtime_ = {0, 0};
  std::map<std::string, std::string> hashes_;  // id -> hex SHA-256 of its secret
};

}  // namespace scad
