// The code of a Python action as the controller takes it, by OpenWhisk's rules: text, or a zip in
// base64 (`exec.binary`) holding __main__.py, its modules and perhaps a virtualenv/. A PUT checks
// what it can tell without unpacking: the size, that a zip's code is base64 and a zip at all.
// What is inside (a __main__.py, entries that stay in their folder, the unpacked size) is checked
// by the launcher that unpacks it (scad/ow_code.py), which fails the activation with the
// runtime's init error.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace scad {

// OpenWhisk's limit on an action's exec (Exec.sizeLimit, 48 MB): its code and main, in bytes.
constexpr size_t kMaxExecBytes = size_t(48) << 20;

// Whether an exec's code is a zip: flagged `binary`, or base64 that starts as a zip does
// ("PK\3\4" is "UEsDB"), as OpenWhisk's clients send a zip without the flag.
bool is_zip_code(const nlohmann::json &exec);

// "" when code (white space around it allowed) is base64 of a zip; else why not.
std::string check_zip_code(const std::string &code);

// "" when the exec's code and main fit kMaxExecBytes; else OpenWhisk's message (a 413).
std::string check_exec_size(const std::string &code, const std::string &main);

}  // namespace scad
