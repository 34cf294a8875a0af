#include "flags.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "flag_number.h"

namespace scad {

bool parse_byte_size(const std::string &text, uint64_t *out) {
  size_t digits = 0;
  while (digits < text.size() && isdigit(static_cast<unsigned char>(text[digits]))) digits++;
  if (digits == 0 || digits > 16) return false;
  uint64_t v = std::stoull(text.substr(0, digits));  // at most 16 digits: cannot overflow
  static const struct {
    const char *suffix;
    uint64_t scale;
  } units[] = {{"", 1},          {"B", 1},           {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30},
               {"TiB", 1ull << 40}, {"K", 1ull << 10}, {"M", 1ull << 20},   {"G", 1ull << 30},   {"T", 1ull << 40},
               {"KB", 1000},        {"MB", 1000000},    {"GB", 1000000000},  {"TB", 1000000000000}};
  std::string suffix = text.substr(digits);
  for (auto &u : units) {
    if (suffix != u.suffix) continue;
    if (v > (1ull << 50) / u.scale) return false;
    *out = v * u.scale;
    return true;
  }
  return false;
}

Flags::Flags(std::string program, std::string summary) : program_(std::move(program)), summary_(std::move(summary)) {}

Flags &Flags::custom(const std::string &name, const std::string &metavar, const std::string &help,
                     std::function<bool(const std::string &, std::string *)> take) {
  flags_.push_back({name, metavar, help, true, std::move(take)});
  return *this;
}

Flags &Flags::text(const std::string &name, const std::string &metavar, const std::string &help, std::string *out) {
  return custom(name, metavar, help, [out](const std::string &v, std::string *) {
    *out = v;
    return true;
  });
}

Flags &Flags::choice(const std::string &name, const std::vector<std::string> &choices, const std::string &help,
                     std::string *out) {
  std::string metavar;
  for (auto &c : choices) metavar += (metavar.empty() ? "" : "|") + c;
  return custom(name, metavar, help, [out, choices, metavar](const std::string &v, std::string *why) {
    for (auto &c : choices)
      if (v == c) {
        *out = v;
        return true;
      }
    *why = "takes " + metavar;
    return false;
  });
}

Flags &Flags::number(const std::string &name, const std::string &help, double lo, double hi, double *out) {
  return custom(name, "N", help, [=](const std::string &v, std::string *why) {
    if (flag_number(v, lo, hi, false, out)) return true;
    *why = "takes a number from " + format_number(lo) + " to " + format_number(hi);
    return false;
  });
}

Flags &Flags::integer(const std::string &name, const std::string &help, int64_t lo, int64_t hi, int64_t *out) {
  return custom(name, "N", help, [=](const std::string &v, std::string *why) {
    double d = 0;
    if (flag_number(v, double(lo), double(hi), true, &d)) {
      *out = int64_t(d);
      return true;
    }
    *why = "takes a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
    return false;
  });
}

Flags &Flags::integer(const std::string &name, const std::string &help, int lo, int hi, int *out) {
  return custom(name, "N", help, [=](const std::string &v, std::string *why) {
    double d = 0;
    if (flag_number(v, lo, hi, true, &d)) {
      *out = int(d);
      return true;
    }
    *why = "takes a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
    return false;
  });
}

Flags &Flags::bytes(const std::string &name, const std::string &help, uint64_t *out) {
  return custom(name, "SIZE", help, [out](const std::string &v, std::string *why) {
    if (parse_byte_size(v, out)) return true;
    *why = "takes a size such as 4096, 64KiB, 4GiB or 10MB";
    return false;
  });
}

Flags &Flags::toggle(const std::string &name, const std::string &help, bool *out) {
  flags_.push_back({name, "", help, false, [out](const std::string &, std::string *) {
                      *out = true;
                      return true;
                    }});
  return *this;
}

std::string Flags::usage() const {
  std::ostringstream s;
  s << "usage: " << program_ << " [flags]   (" << summary_ << ")\n";
  for (auto &f : flags_) {
    std::string left = "  " + f.name + (f.metavar.empty() ? "" : " " + f.metavar);
    if (left.size() >= 34) left += "\n" + std::string(2, ' ');  // a long value form: its help below it
    size_t column = left.size() - (left.rfind('\n') == std::string::npos ? 0 : left.rfind('\n') + 1);
    s << left << std::string(column < 34 ? 34 - column : 1, ' ') << f.help << "\n";
  }
  return s.str();
}

void Flags::fail(const std::string &why) const {
  std::cerr << program_ << ": " << why << "\n" << usage();
  exit(2);
}

std::vector<std::string> Flags::parse(int argc, char **argv) {
  std::vector<std::string> given;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << usage();
      exit(0);
    }
    const Flag *flag = nullptr;
    for (auto &f : flags_)
      if (f.name == a) flag = &f;
    if (!flag) fail("unknown argument '" + a + "'");
    std::string value, why;
    if (flag->takes_value) {
      if (i + 1 >= argc) fail(a + " needs a value (" + flag->metavar + ")");
      value = argv[++i];
    }
    if (!flag->take(value, &why)) fail(a + " " + why);
    given.push_back(a);
  }
  return given;
}

}  // namespace scad
