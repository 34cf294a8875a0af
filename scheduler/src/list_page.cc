#include "list_page.h"

#include <climits>

namespace scad {

namespace {

// Scala's String.toInt: an optional sign and decimal digits, within 32 bits.
bool to_int(const std::string &s, int64_t *out) {
  size_t i = s.size() && (s[0] == '-' || s[0] == '+') ? 1 : 0;
  if (i == s.size() || s.size() - i > 10) return false;
  int64_t v = 0;
  for (; i < s.size(); i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  if (s[0] == '-') v = -v;
  if (v < INT32_MIN || v > INT32_MAX) return false;
  *out = v;
  return true;
}

std::string shown(const std::string &s) { return s.size() > 64 ? s.substr(0, 64) + "..." : s; }

}  // namespace

std::string parse_list_page(const std::string &collection, const std::string *limit, const std::string *skip,
                            ListPage *out) {
  ListPage page;
  int64_t v = 0;
  if (limit) {
    if (!to_int(*limit, &v)) return "The value '" + shown(*limit) + "' is not an integer for " + collection + ".";
    if (v < 0 || v > kMaxListLimit)
      return "The value '" + std::to_string(v) + "' is not in the range of 0 to " + std::to_string(kMaxListLimit) +
             " for " + collection + ".";
    page.limit = v == 0 ? kMaxListLimit : int(v);
  }
  if (skip) {
    if (!to_int(*skip, &v)) return "The value '" + shown(*skip) + "' is not an integer for " + collection + ".";
    if (v < 0) return "The value '" + std::to_string(v) + "' is not greater than or equal to 0 for " + collection + ".";
    page.skip = v;
  }
  *out = page;
  return "";
}

}  // namespace scad
