#include "core/durl.h"

#include <cerrno>
#include <set>

namespace libd {
namespace {

bool is_name_char(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}
bool is_impl_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}
bool is_value_char(unsigned char c) { return c >= 0x20 && c != 0x7f && c != ';'; }

std::string describe(unsigned char c) {
  if (c >= 0x20 && c < 0x7f) return std::string("'") + char(c) + "'";
  static const char hex[] = "0123456789abcdef";
  return std::string("byte 0x") + hex[c >> 4] + hex[c & 15];
}

// Duplicate keys are looked for among this many pairs before a set takes over (Parser::pairs).
constexpr size_t kPairsLookedThrough = 16;

class Parser {
 public:
  Parser(std::string_view text, std::string *error) : s_(text), err_(error) {}

  int fail(size_t pos, const std::string &why) {
    if (err_) *err_ = "position " + std::to_string(pos + 1) + ": " + why;
    return -EINVAL;
  }

  // Reads a run of chars accepted by pred, of 1..max bytes, ending at ';', end, or `stop`.
  int token(bool (*pred)(unsigned char), size_t max, const char *what, char stop,
            std::string *out) {
    size_t start = i_;
    while (i_ < s_.size() && s_[i_] != ';' && s_[i_] != stop) {
      if (!pred((unsigned char)s_[i_]))
        return fail(i_, std::string("unexpected ") + describe((unsigned char)s_[i_]) + " in " + what);
      if (i_ - start >= max)
        return fail(i_, std::string(what) + " longer than " + std::to_string(max) + " bytes");
      i_++;
    }
    if (i_ == start) return fail(i_, std::string("empty ") + what);
    *out = std::string(s_.substr(start, i_ - start));
    return 0;
  }

  int pairs(Params::List *out) {
    std::set<std::string> many;  // the keys so far, once there are kPairsLookedThrough of them
    while (i_ < s_.size()) {
      std::string key, value;
      if (int rc = token(is_name_char, kMaxNameLength, "key", ',', &key)) return rc;
      if (i_ >= s_.size() || s_[i_] != ',')
        return fail(i_, "expected ',' after key '" + key + "' (pairs are KEY,VALUE)");
      i_++;
      size_t vstart = i_;
      while (i_ < s_.size() && s_[i_] != ';') {
        if (!is_value_char((unsigned char)s_[i_]))
          return fail(i_, "unexpected " + describe((unsigned char)s_[i_]) + " in value of '" + key + "'");
        if (i_ - vstart >= kMaxValueLength)
          return fail(i_, "value of '" + key + "' longer than " + std::to_string(kMaxValueLength) + " bytes");
        i_++;
      }
      value = std::string(s_.substr(vstart, i_ - vstart));
      // A durl has a handful of pairs: a look through those before beats a set (its nodes cost
      // more than these comparisons, and every transfer of its own parses a durl). Past that
      // many, a set, so that an absurd durl (hundreds of pairs) is no slower than before.
      bool dup = false;
      if (out->size() < kPairsLookedThrough) {
        for (const auto &kv : *out) dup = dup || kv.first == key;
      } else {
        if (many.empty())
          for (const auto &kv : *out) many.insert(kv.first);
        dup = !many.insert(key).second;
      }
      if (dup) return fail(vstart - key.size() - 1, "duplicate key '" + key + "'");
      out->emplace_back(std::move(key), std::move(value));
      if (i_ < s_.size()) i_++;  // the ';' — a trailing one ends the list
    }
    return 0;
  }

  int durl(Durl *out) {
    if (s_.size() > kMaxDurlLength)
      return fail(kMaxDurlLength, "durl longer than " + std::to_string(kMaxDurlLength) + " bytes");
    if (int rc = token(is_name_char, kMaxNameLength, "transport name", ';', &out->name)) return rc;
    if (i_ >= s_.size()) return fail(i_, "expected ';' and an implementation after the name (NAME;IMPL;...)");
    i_++;
    if (int rc = token(is_impl_char, kMaxImplLength, "implementation name", ';', &out->impl)) return rc;
    if (i_ < s_.size()) i_++;
    return pairs(&out->params);
  }

  int config(Params::List *out) {
    if (s_.size() > kMaxDurlLength)
      return fail(kMaxDurlLength, "config longer than " + std::to_string(kMaxDurlLength) + " bytes");
    return pairs(out);
  }

 private:
  std::string_view s_;
  std::string *err_;
  size_t i_ = 0;
};

}  // namespace

int parse_durl(std::string_view text, Durl *out, std::string *error) {
  Durl d;
  Parser p(text, error);
  if (int rc = p.durl(&d)) return rc;
  *out = std::move(d);
  return 0;
}

int parse_config(std::string_view text, Params::List *out, std::string *error) {
  Params::List l;
  Parser p(text, error);
  if (int rc = p.config(&l)) return rc;
  *out = std::move(l);
  return 0;
}

}  // namespace libd
