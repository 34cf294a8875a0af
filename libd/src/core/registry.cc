#include "core/registry.h"

namespace libd {

// Each implementation defines its table next to its code; a new transport is one line here.
extern const ImplInfo kLocalImpl;
extern const ImplInfo kFakeImpl;
extern const ImplInfo kShmImpl;
extern const ImplInfo kTcpImpl;
extern const ImplInfo kTcpServerImpl;
extern const ImplInfo kShmServerImpl;
extern const ImplInfo kVerbsImpl;
extern const ImplInfo kVerbsServerImpl;

static const ImplInfo *const kImpls[] = {
    &kLocalImpl, &kShmImpl, &kTcpImpl, &kTcpServerImpl, &kShmServerImpl, &kVerbsImpl, &kVerbsServerImpl, &kFakeImpl,
};

const ImplInfo *find_impl(const std::string &name) {
  for (const ImplInfo *impl : kImpls) {
    if (name == impl->name) return impl;
    for (const auto &alias : impl->aliases)
      if (name == alias) return impl;
  }
  return nullptr;
}

std::string impl_names() {
  std::string s;
  for (const ImplInfo *impl : kImpls) {
    if (!s.empty()) s += ", ";
    s += impl->name;
    if (!impl->aliases.empty()) {
      s += " (";
      for (size_t i = 0; i < impl->aliases.size(); i++) s += (i ? ", " : "") + impl->aliases[i];
      s += ")";
    }
  }
  return s;
}

}  // namespace libd
