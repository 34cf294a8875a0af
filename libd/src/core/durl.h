// durl: the transport descriptor "NAME;IMPL;KEY,VALUE;KEY,VALUE;..." (Scad's grammar).
//
//   durl   := name ';' impl (';' pair)* [';']
//   config := [pair (';' pair)* [';']]
//   name   := [A-Za-z0-9_.-]{1,64}
//   impl   := [a-z0-9_]{1,32}
//   pair   := key ',' value      key := [A-Za-z0-9_.-]{1,64}
//   value  := any bytes but ';' and control characters, at most 1024 (may be empty; may hold ',')
//
// Parsing is strict: any deviation is an error that names the 1-based byte position. A durl is at
// most 4096 bytes; a key may appear once.
#pragma once
#include <string>
#include <string_view>

#include "core/params.h"

namespace libd {

struct Durl {
  std::string name;
  std::string impl;
  Params::List params;
};

constexpr size_t kMaxDurlLength = 4096;
constexpr size_t kMaxNameLength = 64;
constexpr size_t kMaxImplLength = 32;
constexpr size_t kMaxValueLength = 1024;

// 0 on success; -EINVAL and *error (position and reason) otherwise.
int parse_durl(std::string_view text, Durl *out, std::string *error);
// The config string of libd_action_config_transport: pairs only.
int parse_config(std::string_view text, Params::List *out, std::string *error);

}  // namespace libd
