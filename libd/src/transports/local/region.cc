#include "transports/local/region.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "core/error.h"
#include "libd.h"

namespace libd {

Region::~Region() {
  if (data_) munmap(data_, size_);
}

int Region::open(const std::string &name, uint64_t size, std::shared_ptr<Region> *out) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<Region>> named;
  std::lock_guard<std::mutex> lk(mu);
  if (!name.empty()) {
    if (auto r = named[name].lock()) {
      if (r->size() < size)
        return set_error(-EINVAL, "region '" + name + "' holds " + std::to_string(r->size()) +
                                      " bytes, less than the " + std::to_string(size) + " asked");
      *out = r;
      return 0;
    }
  }
  if (size == 0) return set_error(-EINVAL, "region size must be > 0");
  void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    return set_error(-ENOMEM, "cannot map a region of " + std::to_string(size) + " bytes: " + strerror(errno));
  auto r = std::shared_ptr<Region>(new Region());
  r->data_ = static_cast<char *>(p);
  r->size_ = size;
  if (!name.empty()) named[name] = r;
  *out = std::move(r);
  return 0;
}

int parse_rights(const std::string &text, unsigned *out) {
  if (text == "r") *out = LIBD_RIGHT_READ;
  else if (text == "w") *out = LIBD_RIGHT_WRITE;
  else if (text == "rw" || text == "wr") *out = LIBD_RIGHT_READ | LIBD_RIGHT_WRITE;
  else return set_error(-EINVAL, "rights must be r, w or rw, not '" + text + "'");
  return 0;
}

void copy_segment(char *region, bool is_read, uint64_t size, uint64_t raddr, char *buf) {
  if (is_read) std::memcpy(buf, region + raddr, size);
  else std::memcpy(region + raddr, buf, size);
}

}  // namespace libd
