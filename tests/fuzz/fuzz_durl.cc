// libFuzzer target: the durl and config parsers, and the action that uses them. Any input must
// parse or fail with -EINVAL and a positioned message; nothing may crash, leak or hang.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/durl.h"
#include "libd.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  libd::Durl d;
  std::string why;
  int rc = libd::parse_durl(text, &d, &why);
  if (rc != 0 && (rc != -EINVAL || why.rfind("position ", 0) != 0)) abort();
  if (rc == 0 && (d.name.empty() || d.impl.empty())) abort();
  libd::Params::List kv;
  rc = libd::parse_config(text, &kv, &why);
  if (rc != 0 && rc != -EINVAL) abort();

  // Through the C API too (NUL-terminated; only implementations that need no network).
  if (text.find('\0') == std::string::npos && text.find("server") == std::string::npos &&
      text.find("tcp") == std::string::npos && text.find("shm") == std::string::npos) {
    libd_action *a = libd_action_init("fuzz", 0, nullptr);
    int r = libd_action_add_transport(a, text.c_str());
    if (r != 0 && r != -EINVAL && r != -EEXIST && r != -ENOMEM) abort();
    libd_action_free(a);
  }
  return 0;
}
