// One command-line parser for the daemons, so their flags read and fail alike: each flag is
// declared once with its help, the usage text is made from the declarations, and a bad value is
// a usage error that names the flag and what it takes (exit status 2), never an exception.
//
//   scad::Flags f("scad-agent", "host agent: serves this host's memory pool and compute processes");
//   f.text("--home", "DIR", "state folder", &home);
//   f.number("--cpus", "cpus offered (0: memory only)", 0, 1e6, &ao.cpus);
//   f.parse(argc, argv);
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace scad {

// "4096", "64KiB", "512MiB", "1GiB" or "1G" (binary), "10MB" (decimal): bytes, at most 2^50.
// False otherwise.
bool parse_byte_size(const std::string &text, uint64_t *out);

class Flags {
 public:
  Flags(std::string program, std::string summary);

  Flags &text(const std::string &name, const std::string &metavar, const std::string &help, std::string *out);
  // One of `choices`.
  Flags &choice(const std::string &name, const std::vector<std::string> &choices, const std::string &help,
                std::string *out);
  Flags &number(const std::string &name, const std::string &help, double lo, double hi, double *out);
  Flags &integer(const std::string &name, const std::string &help, int64_t lo, int64_t hi, int64_t *out);
  Flags &integer(const std::string &name, const std::string &help, int lo, int hi, int *out);
  Flags &bytes(const std::string &name, const std::string &help, uint64_t *out);
  Flags &toggle(const std::string &name, const std::string &help, bool *out);  // no value: sets *out
  // Anything else: `take` checks and stores the value, or returns false with *why.
  Flags &custom(const std::string &name, const std::string &metavar, const std::string &help,
                std::function<bool(const std::string &value, std::string *why)> take);

  // Parses argv; on a bad flag or value prints the reason and the usage, and exits with 2.
  // --help prints the usage and exits with 0. Returns the names of the flags that were given.
  std::vector<std::string> parse(int argc, char **argv);
  [[noreturn]] void fail(const std::string &why) const;
  std::string usage() const;

 private:
  struct Flag {
    std::string name, metavar, help;
    bool takes_value;
    std::function<bool(const std::string &value, std::string *why)> take;
  };
  std::string program_, summary_;
  std::vector<Flag> flags_;
};

}  // namespace scad
