// libFuzzer target: the one-pass reader of scad.connect's and scad.rdma's records
// (bindings/python/record_scan.h), against a JSON parser. Whatever it takes must be a JSON object
// with exactly the fields of that record, each the value the reader gave; nothing may crash, read
// past the input or hang. (What it leaves, json parses in Python: tests/python/test_record_scan.py.)
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "record_scan.h"

namespace {

using nlohmann::json;
using scad::record::Span;

void require(bool ok) {
  if (!ok) abort();
}

bool same(const json &v, Span s) { return v.is_string() && v.get_ref<const std::string &>() == std::string_view(s.p, s.n); }
bool same(const json &v, int64_t n) { return v.is_number_integer() && v.get<int64_t>() == n; }
bool same_bool(const json &v, bool b) { return v.is_boolean() && v.get<bool>() == b; }

template <typename Record>
void check_owner(const json &j, const Record &r) {
  require(same(j["owner"], r.owner) && same(j["hostname"], r.hostname) && same(j["host"], r.host) &&
          same(j["port"], r.port) && same(j["path"], r.path) && same_bool(j["verbs"], r.verbs));
}

void check_connect(std::string_view text, const scad::record::ConnectRecord &r) {
  // expires_at goes to the JSON parser as 0: nlohmann refuses a number past double's range, which
  // Python reads as inf. The number itself must be all a strtod reads (the grammar is checked).
  const char *at = r.expires_at.p;
  require(at >= text.data() && at + r.expires_at.n <= text.data() + text.size() && r.expires_at.n > 0);
  std::string number(at, r.expires_at.n), reference(text);
  char *end = nullptr;
  (void)strtod(number.c_str(), &end);
  require(end == number.c_str() + number.size());
  reference.replace(size_t(at - text.data()), r.expires_at.n, "0");
  json j = json::parse(reference, nullptr, false);
  require(j.is_object() && j.size() == 11);
  require(same(j["version"], r.version) && same(j["operation_kind"], r.kind) && same(j["notification_key"], r.key));
  check_owner(j, r);
  require(j["expires_at"].is_number() && !j["expires_at"].is_boolean());
  const json &descs = j["descriptors"];
  require(descs.is_array() && descs.size() == r.descriptors.size() && !descs.empty());
  for (size_t i = 0; i < descs.size(); i++) {
    const json &d = descs[i];
    const auto &want = r.descriptors[i];
    require(d.is_object() && d.size() == (want.has_grant ? 4u : 2u) && same(d["size"], want.size) && want.size > 0 &&
            same(d["device"], want.device));
    if (want.has_grant) require(same(d["grant"], want.grant) && same(d["secret"], want.secret));
  }
}

void check_buffer(std::string_view text, const scad::record::BufferRecord &r) {
  json j = json::parse(text, nullptr, false);
  require(j.is_object() && j.size() == (r.has_ranges ? 13u : 12u));
  require(same(j["version"], r.version));
  check_owner(j, r);
  require(same(j["grant"], r.grant) && same(j["secret"], r.secret) && same(j["offset"], r.offset) &&
          same(j["size"], r.size) && same_bool(j["whole"], r.whole) && r.size > 0 && r.offset >= 0);
  if (r.has_ranges) {
    const json &ranges = j["ranges"];
    require(ranges.is_array() && ranges.size() == r.ranges.size());
    for (size_t i = 0; i < ranges.size(); i++) require(same(ranges[i], r.ranges[i]));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  // A copy of exactly the input's bytes: a read past its end is the sanitizer's to see.
  std::string text(reinterpret_cast<const char *>(data), size);
  scad::record::ConnectRecord c;
  if (scad::record::scan_connect(text.data(), text.size(), &c)) check_connect(text, c);
  scad::record::BufferRecord b;
  if (scad::record::scan_buffer(text.data(), text.size(), &b)) check_buffer(text, b);
  return 0;
}
