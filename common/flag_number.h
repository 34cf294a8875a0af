// Numbers given on a daemon's command line, checked: "--port abc" or "--cpus 1e400" is a usage
// error that names the flag, not an exception that ends the process with a C++ message.
#pragma once
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace scad {

// True when `text` is a number in [lo, hi] (integers only when `integer`), stored in *out.
inline bool flag_number(const std::string &text, double lo, double hi, bool integer, double *out) {
  if (text.empty() || text.size() > 32 || isspace(static_cast<unsigned char>(text[0]))) return false;
  errno = 0;
  char *end = nullptr;
  double v = strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) return false;
  if (integer && v != std::floor(v)) return false;
  *out = v;
  return true;
}

inline std::string format_number(double v) {
  char text[32];
  snprintf(text, sizeof text, "%.15g", v);
  return text;
}

}  // namespace scad
