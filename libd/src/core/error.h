// Thread-local error messages: set once where the error is first known, read by libd_last_error().
#pragma once
#include <string>

namespace libd {

// Stores msg as the calling thread's last error and returns err (a negative errno), so that
// `return set_error(-EINVAL, "...")` both records and propagates.
int set_error(int err, std::string msg);
void clear_error();
const std::string &last_error();

// "ENOENT"-style symbolic name of an errno value (positive or negative); "E?" if unknown.
const char *errno_name(int err);

}  // namespace libd
