#include "host_keys.h"

#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "secrets.h"
#include "store.h"

namespace scad {

void HostKeys::reload_locked() {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    hashes_.clear();  // no file: no host may register
    return;
  }
  if (st.st_mtim.tv_sec == mtime_.tv_sec && st.st_mtim.tv_nsec == mtime_.tv_nsec) return;
  mtime_ = st.st_mtim;
  hashes_.clear();
  std::ifstream in(path_);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string id, hash;
    if (words >> id >> hash && id[0] != '#' && hash.size() == 64) hashes_[id] = hash;
  }
}

bool HostKeys::admits(const std::string &bearer, const std::string &id) {
  auto colon = bearer.find(':');
  if (colon == std::string::npos || bearer.substr(0, colon) != id) return false;
  std::lock_guard<std::mutex> lk(mu_);
  reload_locked();
  auto it = hashes_.find(id);
  return it != hashes_.end() && constant_time_equal(sha256_hex(bearer.substr(colon + 1)), it->second);
}

}  // namespace scad
