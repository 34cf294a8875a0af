// JSON that comes from outside the process — REST bodies, launcher and agent replies, user
// output — handled so that no byte sequence can crash or stall a daemon:
//  - parsing refuses nesting deeper than a limit before the value is built (copying and dumping
//    are recursive in nlohmann::json, so a 200 KB body of '[' would overflow the stack later);
//  - dumping replaces invalid UTF-8 with U+FFFD instead of throwing (user code may print any
//    bytes, and an exception from dump() on a detached thread ends the process);
//  - typed readers that answer "absent or of the wrong type" instead of throwing type_error.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace scad {

// Deep enough for any real document; far from what overflows a thread's stack in the recursive
// parts of nlohmann::json and in Python's json module on the other side of the launcher.
constexpr int kMaxJsonDepth = 128;

// Parses text as JSON. false, with *why saying what is wrong, when it is not JSON or nests deeper
// than max_depth (arrays and objects). Never throws.
bool parse_json(std::string_view text, nlohmann::json *out, std::string *why, int max_depth = kMaxJsonDepth);

// The compact dump of j with every invalid UTF-8 sequence replaced by U+FFFD. Never throws.
std::string dump_json(const nlohmann::json &j);

// s with every invalid UTF-8 sequence replaced by U+FFFD (each bad byte becomes one U+FFFD).
std::string valid_utf8(std::string_view s);

// How deep j nests (a scalar is 0, [] is 1), without recursion.
int json_depth(const nlohmann::json &j);

// Typed reads of an object's member: the value when j is an object holding `key` with that type,
// else nullopt. Numbers must fit: a negative or fractional number is not a uint64.
std::optional<std::string> get_string(const nlohmann::json &j, const char *key);
std::optional<bool> get_bool(const nlohmann::json &j, const char *key);
std::optional<int64_t> get_int(const nlohmann::json &j, const char *key);
std::optional<uint64_t> get_uint(const nlohmann::json &j, const char *key);
std::optional<double> get_number(const nlohmann::json &j, const char *key);

}  // namespace scad
