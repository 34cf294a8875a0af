// An in-process memory region, optionally shared by name between transports of one process.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace libd {

class Region {
 public:
  ~Region();
  char *data() const { return data_; }
  uint64_t size() const { return size_; }

  // A zeroed region of `size` bytes. With a non-empty name, transports asking for the same name
  // share one region (the first one sizes it). 0 or a negative errno.
  static int open(const std::string &name, uint64_t size, std::shared_ptr<Region> *out);

 private:
  char *data_ = nullptr;
  uint64_t size_ = 0;
};

// "r", "w", "rw" -> LIBD_RIGHT_* bits; -EINVAL otherwise.
int parse_rights(const std::string &text, unsigned *out);

// Copies one segment between a region and the local buffer.
void copy_segment(char *region, bool is_read, uint64_t size, uint64_t raddr, char *buf);

}  // namespace libd
