#include "core/params.h"

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace libd {

Params::Params(const List &kv) {
  for (const auto &[k, v] : kv) map_[k] = v;
}

std::optional<std::string> Params::get(const std::string &key) const {
  auto it = map_.find(key);
  if (it == map_.end()) return std::nullopt;
  return it->second;
}

std::string Params::get_or(const std::string &key, const std::string &dflt) const {
  auto v = get(key);
  return v ? *v : dflt;
}

void Params::merge(const Params &other) {
  for (const auto &[k, v] : other.map_) map_[k] = v;
}

void Params::merge(List &&kv) {
  for (auto &[k, v] : kv) map_.insert_or_assign(std::move(k), std::move(v));
}

static bool parse_u64(const std::string &s, uint64_t *out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = uint64_t(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

int Params::get_u64(const std::string &key, uint64_t dflt, uint64_t *out) const {
  auto v = get(key);
  if (!v) { *out = dflt; return 0; }
  if (!parse_u64(*v, out))
    return set_error(-EINVAL, "parameter '" + key + "': '" + *v + "' is not a non-negative integer");
  return 0;
}

int Params::get_size(const std::string &key, uint64_t dflt, uint64_t *out) const {
  auto v = get(key);
  if (!v) { *out = dflt; return 0; }
  if (!parse_size(*v, out))
    return set_error(-EINVAL, "parameter '" + key + "': '" + *v +
                                  "' is not a size (examples: 4096, 64KiB, 512MiB, 1GiB)");
  return 0;
}

bool parse_assignments(const std::string &text, Params *out) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(start, comma - start);
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return false;
    out->set(item.substr(0, eq), item.substr(eq + 1));
    start = comma + 1;
  }
  return true;
}

bool parse_size(const std::string &text, uint64_t *out) {
  size_t i = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') i++;
  uint64_t n;
  if (!parse_u64(text.substr(0, i), &n)) return false;
  static const struct { const char *suffix; uint64_t mult; } units[] = {
      {"", 1}, {"B", 1},
      {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"KB", 1000ull},
      {"M", 1ull << 20}, {"MiB", 1ull << 20}, {"MB", 1000000ull},
      {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"GB", 1000000000ull},
      {"T", 1ull << 40}, {"TiB", 1ull << 40}, {"TB", 1000000000000ull},
  };
  std::string suffix = text.substr(i);
  for (const auto &u : units) {
    if (suffix == u.suffix) {
      if (n != 0 && u.mult > UINT64_MAX / n) return false;
      *out = n * u.mult;
      return true;
    }
  }
  return false;
}

bool is_secret_key(const std::string &key) {
  return key == "secret" || key == "token" || key == "key" || key == "password";
}

std::string Params::redacted() const {
  std::string s;
  for (const auto &[k, v] : map_) {
    if (!s.empty()) s += ';';
    s += k + "," + (is_secret_key(k) ? std::string("<redacted>") : v);
  }
  return s;
}

}  // namespace libd
