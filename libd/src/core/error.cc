#include "core/error.h"

#include <cerrno>
#include <cstring>

#include "libd.h"

namespace libd {
namespace {
thread_local std::string t_last_error;
}

int set_error(int err, std::string msg) {
  t_last_error = std::move(msg);
  return err;
}

void clear_error() { t_last_error.clear(); }

const std::string &last_error() { return t_last_error; }

const char *errno_name(int err) {
  if (err < 0) err = -err;
  switch (err) {
#define X(e) case e: return #e;
    X(EINVAL) X(ENOENT) X(EEXIST) X(ENOBUFS) X(ERANGE) X(EACCES) X(ETIMEDOUT) X(ECONNRESET)
    X(ENOTCONN) X(ECONNREFUSED) X(ESHUTDOWN) X(ECANCELED) X(EOPNOTSUPP) X(EINPROGRESS)
    X(EPROTO) X(ENOMEM) X(EIO) X(EBUSY) X(ENODATA) X(EPIPE) X(EAGAIN) X(EBADMSG) X(EPERM)
    X(EHOSTUNREACH) X(ENOSPC) X(E2BIG) X(EALREADY) X(EPROTONOSUPPORT)
#undef X
    default: return "E?";
  }
}

}  // namespace libd

extern "C" const char *libd_strerror(int err) {
  if (err == 0) return "success";
  // strerror() is not thread-safe for unknown values; known values return static strings.
  return strerror(err < 0 ? -err : err);
}

extern "C" const char *libd_last_error(void) { return libd::last_error().c_str(); }
