// What the daemons do with secrets (keys, tokens, hashes): make them, show them as hex, and compare
// them in constant time. Not libd's business: libd keeps its own for its wire protocol.
#pragma once
#include <string>

namespace scad {

// `bytes` bytes from the kernel's generator (getrandom), as 2 * bytes lowercase hex digits.
std::string random_hex(size_t bytes);
std::string to_hex(const std::string &bytes);
// Equal, in a time that depends only on the lengths (a guessed key leaks nothing by timing).
bool constant_time_equal(const std::string &a, const std::string &b);

}  // namespace scad
