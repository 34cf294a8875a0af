// Ordered KEY -> VALUE parameters of a transport (from its durl, its config and the action's
// options), with typed accessors that report which key was bad.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace libd {

class Params {
 public:
  using List = std::vector<std::pair<std::string, std::string>>;

  Params() = default;
  explicit Params(const List &kv);

  bool has(const std::string &key) const { return map_.count(key) != 0; }
  std::optional<std::string> get(const std::string &key) const;
  std::string get_or(const std::string &key, const std::string &dflt) const;
  void set(const std::string &key, const std::string &value) { map_[key] = value; }
  void merge(const Params &other);
  void merge(List &&kv);  // the pairs moved in, later ones winning
  const std::map<std::string, std::string> &all() const { return map_; }

  // Typed reads: return 0 and store the value, or -EINVAL with libd_last_error naming the key.
  int get_u64(const std::string &key, uint64_t dflt, uint64_t *out) const;
  int get_size(const std::string &key, uint64_t dflt, uint64_t *out) const;  // "64MiB" etc.

  // "k,v;k,v" with the values of secret keys replaced, for messages and logs.
  std::string redacted() const;

 private:
  std::map<std::string, std::string> map_;
};

// Parses "4096", "64KiB", "512MiB", "1GiB", "1G" (binary), "10MB" (decimal). false if malformed
// or if it overflows 64 bits.
bool parse_size(const std::string &text, uint64_t *out);

// "KEY=VALUE[,KEY=VALUE...]", as command-line options take device keys, merged into *out. false
// if an item has no '=' or an empty key.
bool parse_assignments(const std::string &text, Params *out);

// Keys whose values never appear in messages.
bool is_secret_key(const std::string &key);

}  // namespace libd
