// libFuzzer target: the durl and config parsers, and the action that uses them. Any input must
// parse or fail with -EINVAL and a positioned message; nothing may crash, leak or hang.
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/durl.h"
#include "core/registry.h"
#include "libd.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string text(reinterpret_cast<const char *>(data), size);
  libd::Durl d;
  std::string why;
  int parsed = libd::parse_durl(text, &d, &why);
  if (parsed != 0 && (parsed != -EINVAL || why.rfind("position ", 0) != 0)) abort();
  if (parsed == 0 && (d.name.empty() || d.impl.empty())) abort();
  libd::Params::List kv;
  int rc = libd::parse_config(text, &kv, &why);
  if (rc != 0 && rc != -EINVAL) abort();

  // Through the C API too (NUL-terminated): every durl whose transport needs no network, device
  // or peer (a durl carrying its configuration connects at once): a malformed one, an unknown
  // implementation, local and fake. Chosen by the implementation it names, aliases included.
  const libd::ImplInfo *impl = parsed == 0 ? libd::find_impl(d.impl) : nullptr;
  bool offline = !impl || impl == libd::find_impl("local") || impl == libd::find_impl("fake");
  if (text.find('\0') == std::string::npos && offline) {
    libd_action *a = libd_action_init("fuzz", 0, nullptr);
    int r = libd_action_add_transport(a, text.c_str());
    if (r != 0 && r != -EINVAL && r != -EEXIST && r != -ENOMEM) abort();
    libd_action_free(a);
  }
  return 0;
}
