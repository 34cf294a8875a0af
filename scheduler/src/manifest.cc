#include "manifest.h"

#include <yaml-cpp/yaml.h>

#include <functional>

#include "action_env.h"
#include "flags.h"
#include "safe_json.h"

namespace scad {

namespace {

// Plain scalars that look like numbers become numbers. Checked by hand: std::regex recurses per
// character, and a scalar of 100,000 digits overflowed the stack.
bool is_integer_text(const std::string &s) {
  size_t i = !s.empty() && s[0] == '-';
  if (i == s.size()) return false;
  for (; i < s.size(); i++)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

bool is_real_text(const std::string &s) {  // -?[0-9]*\.[0-9]+([eE][-+]?[0-9]+)?
  size_t i = !s.empty() && s[0] == '-', n = s.size();
  auto digits = [&] {
    size_t from = i;
    while (i < n && s[i] >= '0' && s[i] <= '9') i++;
    return i - from;
  };
  digits();
  if (i == n || s[i] != '.') return false;
  i++;
  if (!digits()) return false;
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '-' || s[i] == '+')) i++;
    if (!digits()) return false;
  }
  return i == n;
}

// The JSON form of a YAML document, bounded: aliases make a small text expand into a huge tree
// (389 bytes of nested anchors become millions of nodes), so the conversion counts what it makes.
struct Conversion {
  size_t nodes = 0, bytes = 0;
  std::string problem;
};
constexpr size_t kMaxManifestNodes = 100000;
constexpr size_t kMaxManifestBytes = 64u << 20;
constexpr int kMaxManifestDepth = 64;

// Hard bounds on what an element may ask for; the operator's and the hosts' own limits come on top.
constexpr double kMinCpu = 0.01, kMaxCpu = 1024;
constexpr uint64_t kMinComputeMemory = 16ull << 20, kMaxComputeMemory = 1ull << 40;
constexpr int64_t kMinTimeoutMs = 100, kMaxTimeoutMs = 24ll * 3600 * 1000;

json yaml_to_json(const YAML::Node &n, Conversion &c, int depth) {
  if (!c.problem.empty()) return nullptr;
  if (++c.nodes > kMaxManifestNodes || depth > kMaxManifestDepth) {
    c.problem = depth > kMaxManifestDepth
                    ? "it nests deeper than " + std::to_string(kMaxManifestDepth) + " levels"
                    : "it expands to more than " + std::to_string(kMaxManifestNodes) + " values (aliases included)";
    return nullptr;
  }
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (auto it = n.begin(); it != n.end(); ++it) {
        json key = yaml_to_json(it->first, c, depth + 1);
        if (!c.problem.empty()) return nullptr;
        o[key.is_string() ? key.get<std::string>() : dump_json(key)] = yaml_to_json(it->second, c, depth + 1);
      }
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (auto it = n.begin(); it != n.end(); ++it) a.push_back(yaml_to_json(*it, c, depth + 1));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string &s = n.Scalar();
      if ((c.bytes += s.size()) > kMaxManifestBytes) {
        c.problem = "it expands to more than " + std::to_string(kMaxManifestBytes >> 20) + " MiB of text";
        return nullptr;
      }
      if (n.Tag() == "!") return valid_utf8(s);  // quoted: a string, whatever it looks like
      if (s == "true" || s == "false") return s == "true";
      if (s == "null" || s == "~") return nullptr;
      if (is_integer_text(s) && s.size() <= 20) {
        try { return std::stoll(s); } catch (...) { return s; }
      }
      if (is_real_text(s) && s.size() <= 64) {
        try { return std::stod(s); } catch (...) { return s; }
      }
      return valid_utf8(s);
    }
    default:
      return nullptr;
  }
}

// Names in manifests: a letter, then letters, digits, '_', '.', '-'; at most 64.
bool is_ident(const std::string &s) {
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (s.empty() || s.size() > 64 || !letter(s[0])) return false;
  for (char c : s)
    if (!letter(c) && !(c >= '0' && c <= '9') && c != '_' && c != '.' && c != '-') return false;
  return true;
}

std::string human(uint64_t b) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = double(b);
  while (v >= 1024 && u < 4) v /= 1024, u++;
  char buf[32];
  snprintf(buf, sizeof buf, v == double(uint64_t(v)) ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

bool read_size(const json &v, uint64_t *out) {
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() > 0)) {
    *out = v.get<uint64_t>();
    return true;
  }
  return v.is_string() && parse_byte_size(v.get<std::string>(), out);
}

// `environment:` of a compute element: a mapping of variable names to text. A problem names the
// variable, never its value.
void read_environment(const json &v, const std::string &where, std::map<std::string, std::string> *env,
                      std::vector<std::string> *p) {
  if (!v.is_object()) {
    p->push_back(where + ": 'environment' must map variable names to text");
    return;
  }
  if (v.size() > kMaxEnvVariables)
    p->push_back(where + ": 'environment' holds " + std::to_string(v.size()) + " variables; at most " +
                 std::to_string(kMaxEnvVariables));
  std::size_t bytes = 0;
  for (auto &[name, value] : v.items()) {
    std::string shown = name.size() > 64 ? name.substr(0, 64) + "..." : name;
    std::string what = where + ", environment variable '" + shown + "': ";
    if (auto why = env_name_problem(name); !why.empty()) {
      p->push_back(what + why);
      continue;
    }
    if (!value.is_string()) {
      p->push_back(what + "the value must be text (quote it in YAML)");
      continue;
    }
    const std::string text = value.get<std::string>();
    if (auto why = env_value_problem(text); !why.empty()) {
      p->push_back(what + why);
      continue;
    }
    bytes += name.size() + text.size();
    (*env)[name] = text;
  }
  if (bytes > kMaxEnvBytes)
    p->push_back(where + ": 'environment' holds " + std::to_string(bytes) + " bytes of names and values; at most " +
                 std::to_string(kMaxEnvBytes));
}

}  // namespace

bool manifest_to_json(const std::string &text, json *out, std::string *why) {
  try {
    YAML::Node root = YAML::Load(text);
    Conversion c;
    json doc = yaml_to_json(root, c, 0);
    if (!c.problem.empty()) {
      *why = "scad.yaml is refused: " + c.problem;
      return false;
    }
    *out = std::move(doc);
    return true;
  } catch (const YAML::Exception &e) {
    *why = std::string("scad.yaml is not valid YAML or JSON: ") + e.what();
    return false;
  }
}

std::vector<std::string> validate_manifest(const json &doc, const std::set<std::string> &files, const Capacity &cap,
                                           Manifest *out) {
  std::vector<std::string> p;
  Manifest m;
  if (!doc.is_object()) return {"the manifest must be a mapping with 'name' and 'elements'"};
  for (auto &[k, v] : doc.items())
    if (k != "name" && k != "elements" && k != "description")
      p.push_back("unknown top-level field '" + k + "' (known: name, elements, description)");
  if (!doc.contains("name") || !doc["name"].is_string() || !is_ident(doc["name"].get<std::string>()))
    p.push_back("'name' must be a name of letters, digits, '_', '.', '-' (starting with a letter)");
  else
    m.name = doc["name"];
  if (!doc.contains("elements") || !doc["elements"].is_object() || doc["elements"].empty()) {
    p.push_back("'elements' must map element names to their declarations, and hold at least one");
    return p;
  }

  static const std::set<std::string> memory_fields = {"kind", "size", "description", "prefetch"};
  static const std::set<std::string> compute_fields = {"kind", "code", "main", "cpu", "memory", "parallelism",
                                                       "transports", "dependents", "timeout", "description",
                                                       "network", "environment"};
  for (auto &[name, e] : doc["elements"].items()) {
    std::string where = "element '" + name + "'";
    if (!is_ident(name)) p.push_back(where + ": the name must be letters, digits, '_', '.', '-'");
    if (!e.is_object()) { p.push_back(where + ": must be a mapping with a 'kind'"); continue; }
    ElementDecl d;
    d.name = name;
    d.kind = get_string(e, "kind").value_or("");
    if (d.kind != "memory" && d.kind != "compute") {
      p.push_back(where + ": 'kind' must be 'memory' or 'compute'");
      continue;
    }
    const auto &known = d.kind == "memory" ? memory_fields : compute_fields;
    for (auto &[k, v] : e.items())
      if (!known.count(k)) p.push_back(where + ": unknown field '" + k + "' for a " + d.kind + " element");
    if (d.kind == "memory") {
      if (!e.contains("size") || !read_size(e["size"], &d.size) || d.size == 0)
        p.push_back(where + ": 'size' must be a size such as 512MiB or 1GiB");
      else if (cap.memory_pool && d.size > cap.memory_pool)
        p.push_back(where + ": size " + human(d.size) + " cannot be met: the largest host's memory pool holds " +
                    human(cap.memory_pool));
      if (e.contains("prefetch") && !e["prefetch"].is_boolean()) p.push_back(where + ": 'prefetch' must be true or false");
      else d.prefetch = e.value("prefetch", false);
    } else {
      if (!e.contains("code") || !e["code"].is_string())
        p.push_back(where + ": 'code' must name the file with its main function");
      else if (!files.count(d.code = e["code"].get<std::string>()))
        p.push_back(where + ": code file '" + d.code + "' is missing from the application's folder");
      if (e.contains("main") && !(e["main"].is_string() && is_ident(e["main"].get<std::string>())))
        p.push_back(where + ": 'main' must be a function name");
      else d.main = e.value("main", "main");
      if (e.contains("cpu") && (!e["cpu"].is_number() || !(e["cpu"].get<double>() >= kMinCpu) ||
                                e["cpu"].get<double>() > kMaxCpu))
        p.push_back(where + ": 'cpu' must be a number of cores from 0.01 to 1024");
      else d.cpu = e.value("cpu", 1.0);
      if (cap.cpus && d.cpu > cap.cpus)
        p.push_back(where + ": cpu " + std::to_string(d.cpu) + " cannot be met: the largest host has " +
                    std::to_string(cap.cpus) + " cpus");
      if (e.contains("memory") && !(read_size(e["memory"], &d.memory) && d.memory >= kMinComputeMemory &&
                                    d.memory <= kMaxComputeMemory))
        p.push_back(where + ": 'memory' must be a size such as 256MiB, from 16MiB to 1TiB");
      if (cap.compute_memory && d.memory > cap.compute_memory)
        p.push_back(where + ": memory " + human(d.memory) + " cannot be met: the largest host has " +
                    human(cap.compute_memory));
      if (e.contains("parallelism") && !(e["parallelism"].is_number_integer() && e["parallelism"].get<int64_t>() >= 1 &&
                                         e["parallelism"].get<int64_t>() <= 1024))
        p.push_back(where + ": 'parallelism' must be an integer from 1 to 1024");
      else d.parallelism = int(e.value("parallelism", int64_t(1)));
      if (e.contains("timeout")) {
        int64_t most = cap.max_timeout_ms ? cap.max_timeout_ms : kMaxTimeoutMs;
        auto ms = get_int(e, "timeout");
        if (!ms || *ms < kMinTimeoutMs || *ms > most)
          p.push_back(where + ": 'timeout' must be milliseconds from " + std::to_string(kMinTimeoutMs) + " to " +
                      std::to_string(most));
        else d.timeout_ms = *ms;
      }
      if (e.contains("network")) {
        if (!e["network"].is_boolean()) p.push_back(where + ": 'network' must be true or false");
        else d.network = e["network"].get<bool>();
      }
      if (e.contains("environment")) read_environment(e["environment"], where, &d.env, &p);
      if (e.contains("transports")) {
        if (!e["transports"].is_object()) {
          p.push_back(where + ": 'transports' must map transport names to {element, rights}");
        } else {
          for (auto &[tname, t] : e["transports"].items()) {
            std::string tw = where + ", transport '" + tname + "'";
            TransportDecl td;
            if (!is_ident(tname)) p.push_back(tw + ": the name must be letters, digits, '_', '.', '-'");
            if (!t.is_object() || !t.contains("element") || !t["element"].is_string()) {
              p.push_back(tw + ": must be {element: NAME, rights: r|w|rw}");
              continue;
            }
            td.element = t["element"];
            std::string rights = t.contains("rights") ? get_string(t, "rights").value_or("?") : "rw";
            td.rights = rights == "r" ? kRightRead : rights == "w" ? kRightWrite : rights == "rw" ? kRightRead | kRightWrite : 0;
            if (!td.rights) p.push_back(tw + ": rights must be r, w or rw");
            for (auto &[k, v] : t.items())
              if (k != "element" && k != "rights") p.push_back(tw + ": unknown field '" + k + "'");
            d.transports[tname] = td;
          }
        }
      }
      if (e.contains("dependents")) {
        if (!e["dependents"].is_array()) p.push_back(where + ": 'dependents' must be a list of compute elements");
        else
          for (auto &x : e["dependents"]) {
            if (x.is_string()) d.dependents.push_back(x);
            else p.push_back(where + ": 'dependents' entries must be element names");
          }
      }
    }
    m.elements[name] = d;
  }

  // Cross references.
  for (auto &[name, d] : m.elements) {
    for (auto &[tname, t] : d.transports) {
      auto it = m.elements.find(t.element);
      if (it == m.elements.end())
        p.push_back("element '" + name + "', transport '" + tname + "': unknown element '" + t.element + "'");
      else if (it->second.kind != "memory")
        p.push_back("element '" + name + "', transport '" + tname + "': '" + t.element +
                    "' is a compute element; transports reach memory elements");
    }
    for (auto &child : d.dependents) {
      auto it = m.elements.find(child);
      if (it == m.elements.end()) p.push_back("element '" + name + "': unknown dependent '" + child + "'");
      else if (it->second.kind != "compute") p.push_back("element '" + name + "': dependent '" + child + "' is not a compute element");
      else m.parents[child].push_back(name);
    }
  }
  // Cycles: depth-first search, reporting each cycle found as a path.
  std::map<std::string, int> mark;  // 0 new, 1 on the stack, 2 done
  std::vector<std::string> stack;
  std::function<void(const std::string &)> visit = [&](const std::string &n) {
    mark[n] = 1;
    stack.push_back(n);
    for (auto &c : m.elements[n].dependents) {
      if (!m.elements.count(c) || m.elements[c].kind != "compute") continue;
      if (mark[c] == 1) {
        std::string path;
        auto at = std::find(stack.begin(), stack.end(), c);
        for (auto i = at; i != stack.end(); ++i) path += *i + " -> ";
        p.push_back("dependents form a cycle: " + path + c);
      } else if (mark[c] == 0) {
        visit(c);
      }
    }
    stack.pop_back();
    mark[n] = 2;
    m.order.insert(m.order.begin(), n);  // reverse post-order: a topological order
  };
  for (auto &[name, d] : m.elements)
    if (d.kind == "compute" && mark[name] == 0) visit(name);
  bool any_compute = false;
  for (auto &[name, d] : m.elements) {
    if (d.kind != "compute") continue;
    any_compute = true;
    bool sink = true;
    for (auto &c : d.dependents)
      if (m.elements.count(c)) sink = false;
    if (sink) m.sinks.push_back(name);
  }
  if (!any_compute) p.push_back("the application has no compute element to run");
  if (p.empty() && out) *out = std::move(m);
  return p;
}

int64_t widest_wave(const Manifest &m) {
  std::map<std::string, int> level;
  std::map<int, int64_t> width;
  for (auto &n : m.order) {  // parents come first
    int l = 0;
    if (m.parents.count(n))
      for (auto &p : m.parents.at(n)) l = std::max(l, level[p] + 1);
    level[n] = l;
    width[l] += m.elements.at(n).parallelism;
  }
  int64_t widest = 0;
  for (auto &[l, w] : width) widest = std::max(widest, w);
  return widest;
}

}  // namespace scad
