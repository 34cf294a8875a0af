#include "core/action.h"

#include <cerrno>

#include "core/durl.h"
#include "core/error.h"
#include "core/registry.h"

namespace libd {

int Action::create(const std::string &aid, int argc, char **argv, std::unique_ptr<Action> *out) {
  if (aid.empty() || aid.size() > 256) return set_error(-EINVAL, "action id must be 1..256 bytes");
  if (argc < 0 || (argc > 0 && !argv)) return set_error(-EINVAL, "argc/argv mismatch");
  auto a = std::unique_ptr<Action>(new Action());
  a->aid_ = aid;
  for (int i = 0; i < argc; i++) {
    if (!argv[i]) return set_error(-EINVAL, "argv[" + std::to_string(i) + "] is NULL");
    std::string arg = argv[i];
    if (arg.size() < 2 || arg[0] != '+')
      return set_error(-EINVAL, "option " + std::to_string(i) + " '" + arg + "': expected '+key value'");
    if (i + 1 >= argc) return set_error(-EINVAL, "option '" + arg + "' has no value");
    a->options_.set(arg.substr(1), argv[++i]);
  }
  *out = std::move(a);
  return 0;
}

Action::~Action() {
  std::map<std::string, std::unique_ptr<Transport>> ts;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ts.swap(transports_);
  }
  // Clients first, then the servers they might be talking to in this same process.
  for (int kind : {LIBD_KIND_RDMA, LIBD_KIND_RDMA_SERVER})
    for (auto &[name, t] : ts)
      if (t->kind() == kind) t->terminate();
}

int Action::add_transport(const std::string &durl) {
  Durl d;
  std::string why;
  if (parse_durl(durl, &d, &why)) return set_error(-EINVAL, "malformed durl: " + why);
  const ImplInfo *impl = find_impl(d.impl);
  if (!impl)
    return set_error(-EINVAL, "durl: unknown implementation '" + d.impl + "' (known: " + impl_names() + ")");
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (transports_.count(d.name))
      return set_error(-EEXIST, "a transport named '" + d.name + "' already exists in action '" + aid_ + "'");
  }
  Params params = options_;
  params.merge(std::move(d.params));
  auto t = impl->make();
  if (int rc = t->setup({d.name, impl, std::move(params), aid_})) return rc;
  std::lock_guard<std::mutex> lk(mu_);
  if (transports_.count(d.name))
    return set_error(-EEXIST, "a transport named '" + d.name + "' already exists in action '" + aid_ + "'");
  transports_[d.name] = std::move(t);
  return 0;
}

int Action::config_transport(const std::string &name, const std::string &config) {
  Params::List kv;
  std::string why;
  if (parse_config(config, &kv, &why)) return set_error(-EINVAL, "malformed config for '" + name + "': " + why);
  Transport *t = get_transport(name);
  if (!t) return -ENOENT;
  return t->configure(Params(kv));
}

Transport *Action::get_transport(const std::string &name) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = transports_.find(name);
  if (it == transports_.end()) {
    std::string known;
    for (auto &[n, t] : transports_) known += (known.empty() ? "" : ", ") + n;
    set_error(-ENOENT, "no transport named '" + name + "' in action '" + aid_ + "' (it has: " +
                           (known.empty() ? "none" : known) + ")");
    return nullptr;
  }
  return it->second.get();
}

std::string Action::names() const {
  std::lock_guard<std::mutex> lk(mu_);
  std::string s;
  for (auto &[n, t] : transports_) s += (s.empty() ? "" : ",") + n;
  return s;
}

size_t Action::count() const {
  std::lock_guard<std::mutex> lk(mu_);
  return transports_.size();
}

}  // namespace libd
