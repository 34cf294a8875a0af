#include "action_code.h"

#include <openssl/evp.h>

#include "safe_json.h"

namespace scad {

namespace {

std::string trimmed(const std::string &s) {
  size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

// OpenWhisk's base64 (Exec.isBase64Pattern): groups of four of A-Z a-z 0-9 + /, the last one
// perhaps padded with one or two '='.
bool is_base64(const std::string &t) {
  if (t.empty() || t.size() % 4) return false;
  size_t pad = t.back() == '=' ? (t[t.size() - 2] == '=' ? 2 : 1) : 0;
  for (size_t i = 0; i < t.size() - pad; i++) {
    char c = t[i];
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '/')) return false;
  }
  return true;
}

std::string decode(const std::string &t) {
  std::string out(t.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char *>(out.data()), reinterpret_cast<const unsigned char *>(t.data()),
                          int(t.size()));
  if (n < 0) return "";
  size_t pad = (t.end()[-1] == '=') + (t.end()[-2] == '=');
  out.resize(size_t(n) - pad);
  return out;
}

// A zip starts with a local file header (or, empty, with its end record) and ends with the end
// of its central directory: a signature within the last 22 + 65535 bytes (the longest comment).
bool looks_like_zip(const std::string &z) {
  if (z.size() < 22 || (z.compare(0, 4, "PK\3\4") != 0 && z.compare(0, 4, "PK\5\6") != 0)) return false;
  size_t from = z.size() > 22 + 65535 ? z.size() - 22 - 65535 : 0;
  size_t end = z.rfind("PK\5\6");
  return end != std::string::npos && end >= from;
}

}  // namespace

bool is_zip_code(const nlohmann::json &exec) {
  if (get_bool(exec, "binary").value_or(false)) return true;
  auto code = get_string(exec, "code");
  if (!code) return false;
  size_t first = code->find_first_not_of(" \t\r\n");
  return first != std::string::npos && code->compare(first, 5, "UEsDB") == 0;
}

std::string check_zip_code(const std::string &code) {
  const std::string t = trimmed(code);
  if (!is_base64(t)) return "exec.code of a binary action must be a zip file in base64: it is not base64";
  if (!looks_like_zip(decode(t))) return "exec.code of a binary action must be a zip file in base64: it is not a zip file";
  return "";
}

std::string check_exec_size(const std::string &code, const std::string &main) {
  size_t size = code.size() + main.size();
  if (size <= kMaxExecBytes) return "";
  return "exec larger than allowed: " + std::to_string(size) + " > " + std::to_string(kMaxExecBytes) + " bytes.";
}

}  // namespace scad
