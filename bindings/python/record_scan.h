// Reads the two records a peer parses before every one-sided operation - scad.connect's
// RdmaMetadata and scad.rdma's RdmaBuffer - when they are exactly as their own to_json() writes
// them: the fields in that order, no whitespace, strings of printable ASCII without escapes,
// integers of at most 18 digits. Such a record is most of what peers are sent, and json's scanner
// plus the checks after it cost a few microseconds of each operation; this takes one pass.
//
// Anything else - another order, spaces, an escape, a field of the wrong type, a value the Python
// parser would refuse - is not an error here: scan_* returns false and the caller parses the text
// with json as before, which accepts what JSON allows and words the errors. So a record accepted
// here must be one the Python parser accepts with the very same values; the checks below are the
// Python parser's own (scad/connect/_metadata.py, scad/rdma/_buffer.py), and fuzz_record checks
// every accepted input against a JSON parser.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace scad::record {

struct Span {
  const char *p = nullptr;
  size_t n = 0;
};

struct ConnectDescriptor {
  int64_t size = 0;
  Span device;
  bool has_grant = false;  // false: a range after the one before, under its grant (version 2)
  Span grant, secret;
};

struct ConnectRecord {
  int64_t version = 0, kind = 0;
  Span key, owner, hostname, host;
  int64_t port = 0;
  Span path;
  bool verbs = false;
  Span expires_at;  // a JSON number, as written (the caller converts it as float() does)
  std::vector<ConnectDescriptor> descriptors;
};

struct BufferRecord {
  int64_t version = 0;
  Span owner, hostname, host;
  int64_t port = 0;
  Span path;
  bool verbs = false;
  Span grant, secret;
  int64_t offset = 0, size = 0;
  bool whole = false;
  bool has_ranges = false;
  std::vector<int64_t> ranges;
};

namespace detail {

// One pass over the text; every step either moves on or makes the whole scan fail.
class Cursor {
 public:
  Cursor(const char *p, size_t n) : p_(p), end_(p + n) {}

  bool done() const { return p_ == end_; }

  // The exact bytes of `lit` (a NUL-terminated literal).
  bool lit(const char *lit) {
    const char *q = p_;
    for (; *lit; ++lit, ++q)
      if (q == end_ || *q != *lit) return false;
    p_ = q;
    return true;
  }

  // A string: its quotes and, between them, printable ASCII other than '"' and '\' (what a JSON
  // string means as written). Control characters are not JSON; bytes past 127 are left to json.
  bool str(Span *out) {
    if (p_ == end_ || *p_ != '"') return false;
    const char *q = p_ + 1;
    while (q != end_ && *q != '"') {
      unsigned char c = static_cast<unsigned char>(*q);
      if (c < 0x20 || c > 0x7e || c == '\\') return false;
      ++q;
    }
    if (q == end_) return false;
    *out = {p_ + 1, size_t(q - p_ - 1)};
    p_ = q + 1;
    return true;
  }

  // A non-negative JSON integer: 0, or 1-18 digits not starting with 0.
  bool uint(int64_t *out) {
    const char *q = p_;
    if (q == end_ || *q < '0' || *q > '9') return false;
    if (*q == '0') {
      ++q;
      if (q != end_ && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E')) return false;
      *out = 0;
      p_ = q;
      return true;
    }
    int64_t v = 0;
    int digits = 0;
    for (; q != end_ && *q >= '0' && *q <= '9'; ++q) {
      if (++digits > 18) return false;
      v = v * 10 + (*q - '0');
    }
    if (q != end_ && (*q == '.' || *q == 'e' || *q == 'E')) return false;  // a float: not an integer field
    *out = v;
    p_ = q;
    return true;
  }

  // true or false.
  bool boolean(bool *out) {
    if (lit("true")) return *out = true, true;
    if (lit("false")) return *out = false, true;
    return false;
  }

  // A JSON number as written: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  bool number(Span *out) {
    const char *q = p_;
    auto digit = [&] { return q != end_ && *q >= '0' && *q <= '9'; };
    if (q != end_ && *q == '-') ++q;
    if (!digit()) return false;
    if (*q == '0') {
      ++q;
    } else {
      while (digit()) ++q;
    }
    if (q != end_ && *q == '.') {
      ++q;
      if (!digit()) return false;
      while (digit()) ++q;
    }
    if (q != end_ && (*q == 'e' || *q == 'E')) {
      ++q;
      if (q != end_ && (*q == '+' || *q == '-')) ++q;
      if (!digit()) return false;
      while (digit()) ++q;
    }
    if (q - p_ > 64) return false;  // no record writes one that long
    *out = {p_, size_t(q - p_)};
    p_ = q;
    return true;
  }

 private:
  const char *p_;
  const char *end_;
};

inline bool has_config_separator(Span s) {
  for (size_t i = 0; i < s.n; i++)
    if (s.p[i] == ';' || s.p[i] == ',') return true;
  return false;
}

// A value that may go into a libd configuration string (grant, secret): not empty, no separator.
inline bool config_value_ok(Span s) { return s.n > 0 && !has_config_separator(s); }

inline bool lower_hex16(Span s) {
  if (s.n != 16) return false;
  for (size_t i = 0; i < s.n; i++) {
    char c = s.p[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

// The owner's part both records share: "owner", "hostname", "host", "port", "path", "verbs".
template <typename Record>
bool owner_part(Cursor &c, Record *r) {
  return c.lit(",\"owner\":") && c.str(&r->owner) && c.lit(",\"hostname\":") && c.str(&r->hostname) &&
         c.lit(",\"host\":") && c.str(&r->host) && c.lit(",\"port\":") && c.uint(&r->port) && c.lit(",\"path\":") &&
         c.str(&r->path) && c.lit(",\"verbs\":") && c.boolean(&r->verbs);
}

}  // namespace detail

// RdmaMetadata.to_json()'s layout; the checks of RdmaMetadata.from_dict.
inline bool scan_connect(const char *text, size_t n, ConnectRecord *r) {
  detail::Cursor c(text, n);
  if (!(c.lit("{\"version\":") && c.uint(&r->version) && (r->version == 1 || r->version == 2))) return false;
  if (!(c.lit(",\"operation_kind\":") && c.uint(&r->kind) && (r->kind == 1 || r->kind == 2))) return false;
  if (!(c.lit(",\"notification_key\":") && c.str(&r->key) && detail::lower_hex16(r->key))) return false;
  if (!detail::owner_part(c, r)) return false;
  if (detail::has_config_separator(r->host) || detail::has_config_separator(r->path)) return false;
  if (!(c.lit(",\"expires_at\":") && c.number(&r->expires_at))) return false;
  if (!c.lit(",\"descriptors\":[")) return false;
  r->descriptors.clear();
  do {
    ConnectDescriptor d;
    if (!(c.lit("{\"size\":") && c.uint(&d.size) && d.size > 0 && c.lit(",\"device\":") && c.str(&d.device)))
      return false;
    if (c.lit(",\"grant\":")) {
      if (!(c.str(&d.grant) && c.lit(",\"secret\":") && c.str(&d.secret))) return false;
      if (!detail::config_value_ok(d.grant) || !detail::config_value_ok(d.secret)) return false;
      d.has_grant = true;
    } else if (r->version < 2 || r->descriptors.empty()) {
      return false;  // a range under the grant before needs one before, and version 2
    }
    if (!c.lit("}")) return false;
    r->descriptors.push_back(d);
    if (r->descriptors.size() > 1u << 20) return false;
  } while (c.lit(","));
  return c.lit("]}") && c.done();
}

// RdmaBuffer.to_json()'s layout; the checks of RdmaBuffer.from_json (ranges are checked by the
// caller, as the Python parser checks them: _checked_ranges).
inline bool scan_buffer(const char *text, size_t n, BufferRecord *r) {
  detail::Cursor c(text, n);
  if (!(c.lit("{\"version\":") && c.uint(&r->version) && (r->version == 1 || r->version == 2))) return false;
  if (!detail::owner_part(c, r)) return false;
  if (!(c.lit(",\"grant\":") && c.str(&r->grant) && c.lit(",\"secret\":") && c.str(&r->secret))) return false;
  if (!(c.lit(",\"offset\":") && c.uint(&r->offset) && c.lit(",\"size\":") && c.uint(&r->size) && r->size > 0))
    return false;
  if (!(c.lit(",\"whole\":") && c.boolean(&r->whole))) return false;
  if (detail::has_config_separator(r->host) || detail::has_config_separator(r->path) ||
      !detail::config_value_ok(r->grant) || !detail::config_value_ok(r->secret))
    return false;
  r->has_ranges = r->version == 2;
  r->ranges.clear();
  if (r->has_ranges) {
    if (!c.lit(",\"ranges\":[")) return false;
    do {
      int64_t v;
      if (!c.uint(&v)) return false;
      r->ranges.push_back(v);
      if (r->ranges.size() > 1u << 20) return false;
    } while (c.lit(","));
    if (!c.lit("]")) return false;
  }
  return c.lit("}") && c.done();
}

}  // namespace scad::record
