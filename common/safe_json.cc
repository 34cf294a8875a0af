#include "safe_json.h"

#include <vector>

namespace scad {

using nlohmann::json;

bool parse_json(std::string_view text, json *out, std::string *why, int max_depth) {
  bool too_deep = false;
  // Called with the depth of the container being opened (0 for the outermost); returning false
  // discards it, and nlohmann builds nothing inside a discarded container.
  json::parser_callback_t guard = [&](int depth, json::parse_event_t event, json &) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) &&
        depth >= max_depth) {
      too_deep = true;
      return false;
    }
    return true;
  };
  try {
    json parsed = json::parse(text.begin(), text.end(), guard, true, false);
    if (too_deep) {
      *why = "it nests deeper than " + std::to_string(max_depth) + " levels of arrays and objects";
      return false;
    }
    *out = std::move(parsed);
    return true;
  } catch (const json::exception &e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ...": keep
    // the part from "line" on, without the library's tag.
    std::string what = e.what();
    auto at = what.find("at line");
    *why = too_deep ? "it nests deeper than " + std::to_string(max_depth) + " levels of arrays and objects"
                    : "it is not JSON (" + valid_utf8(at == std::string::npos ? what : what.substr(at)) + ")";
    return false;
  }
}

std::string dump_json(const json &j) {
  try {
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
  } catch (const std::exception &) {  // only an allocation failure is left
    return "null";
  }
}

std::string valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto *p = reinterpret_cast<const unsigned char *>(s.data());
  size_t n = s.size(), i = 0;
  while (i < n) {
    unsigned char c = p[i];
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; k++) ok = (p[i + k] & 0xC0) == 0x80;
    if (ok && len > 1) {
      uint32_t cp = c & (0x7F >> len);
      for (size_t k = 1; k < len; k++) cp = (cp << 6) | (p[i + k] & 0x3F);
      static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      ok = cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);  // no overlongs, no surrogates
    }
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      out.append("\xEF\xBF\xBD");
      i += 1;
    }
  }
  return out;
}

int json_depth(const json &j) {
  int deepest = 0;
  std::vector<std::pair<const json *, int>> todo{{&j, 0}};
  while (!todo.empty()) {
    auto [v, d] = todo.back();
    todo.pop_back();
    if (!v->is_structured()) continue;
    deepest = std::max(deepest, d + 1);
    for (const auto &child : *v) todo.emplace_back(&child, d + 1);
  }
  return deepest;
}

namespace {
const json *member(const json &j, const char *key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}
}  // namespace

std::optional<std::string> get_string(const json &j, const char *key) {
  const json *v = member(j, key);
  if (!v || !v->is_string()) return std::nullopt;
  return v->get<std::string>();
}

std::optional<bool> get_bool(const json &j, const char *key) {
  const json *v = member(j, key);
  if (!v || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

std::optional<int64_t> get_int(const json &j, const char *key) {
  const json *v = member(j, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    uint64_t u = v->get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return std::nullopt;
    return int64_t(u);
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  return std::nullopt;
}

std::optional<uint64_t> get_uint(const json &j, const char *key) {
  const json *v = member(j, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<uint64_t>();
  if (v->is_number_integer() && v->get<int64_t>() >= 0) return uint64_t(v->get<int64_t>());
  return std::nullopt;
}

std::optional<double> get_number(const json &j, const char *key) {
  const json *v = member(j, key);
  if (!v || !v->is_number()) return std::nullopt;
  return v->get<double>();
}

}  // namespace scad
