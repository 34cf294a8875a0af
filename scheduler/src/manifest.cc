#include "manifest.h"

#include <yaml-cpp/yaml.h>

#include <functional>
#include <regex>

#include "core/params.h"

namespace scad {

namespace {

json yaml_to_json(const YAML::Node &n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      json o = json::object();
      for (auto it = n.begin(); it != n.end(); ++it) o[it->first.as<std::string>()] = yaml_to_json(it->second);
      return o;
    }
    case YAML::NodeType::Sequence: {
      json a = json::array();
      for (auto it = n.begin(); it != n.end(); ++it) a.push_back(yaml_to_json(*it));
      return a;
    }
    case YAML::NodeType::Scalar: {
      const std::string &s = n.Scalar();
      if (n.Tag() == "!") return s;  // quoted: a string, whatever it looks like
      if (s == "true" || s == "false") return s == "true";
      if (s == "null" || s == "~") return nullptr;
      static const std::regex integer("-?[0-9]+"), real("-?[0-9]*\\.[0-9]+([eE][-+]?[0-9]+)?");
      if (std::regex_match(s, integer)) {
        try { return std::stoll(s); } catch (...) { return s; }
      }
      if (std::regex_match(s, real)) return std::stod(s);
      return s;
    }
    default:
      return nullptr;
  }
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
  return v.is_string() && libd::parse_size(v.get<std::string>(), out);
}

}  // namespace

bool manifest_to_json(const std::string &text, json *out, std::string *why) {
  try {
    YAML::Node root = YAML::Load(text);
    *out = yaml_to_json(root);
    return true;
  } catch (const YAML::Exception &e) {
    *why = std::string("scad.yaml is not valid YAML or JSON: ") + e.what();
    return false;
  }
}

std::vector<std::string> validate_manifest(const json &doc, const std::set<std::string> &files, const Capacity &cap,
                                           Manifest *out) {
  std::vector<std::string> p;
  static const std::regex ident("[a-zA-Z][a-zA-Z0-9_.-]{0,63}");
  Manifest m;
  if (!doc.is_object()) return {"the manifest must be a mapping with 'name' and 'elements'"};
  for (auto &[k, v] : doc.items())
    if (k != "name" && k != "elements" && k != "description")
      p.push_back("unknown top-level field '" + k + "' (known: name, elements, description)");
  if (!doc.contains("name") || !doc["name"].is_string() || !std::regex_match(doc["name"].get<std::string>(), ident))
    p.push_back("'name' must be a name of letters, digits, '_', '.', '-' (starting with a letter)");
  else
    m.name = doc["name"];
  if (!doc.contains("elements") || !doc["elements"].is_object() || doc["elements"].empty()) {
    p.push_back("'elements' must map element names to their declarations, and hold at least one");
    return p;
  }

  static const std::set<std::string> memory_fields = {"kind", "size", "description"};
  static const std::set<std::string> compute_fields = {"kind", "code", "main", "cpu", "memory", "parallelism",
                                                       "transports", "dependents", "timeout", "description"};
  for (auto &[name, e] : doc["elements"].items()) {
    std::string where = "element '" + name + "'";
    if (!std::regex_match(name, ident)) p.push_back(where + ": the name must be letters, digits, '_', '.', '-'");
    if (!e.is_object()) { p.push_back(where + ": must be a mapping with a 'kind'"); continue; }
    ElementDecl d;
    d.name = name;
    d.kind = e.value("kind", "");
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
    } else {
      if (!e.contains("code") || !e["code"].is_string())
        p.push_back(where + ": 'code' must name the file with its main function");
      else if (!files.count(d.code = e["code"].get<std::string>()))
        p.push_back(where + ": code file '" + d.code + "' is missing from the application's folder");
      if (e.contains("main") && !(e["main"].is_string() && std::regex_match(e["main"].get<std::string>(), ident)))
        p.push_back(where + ": 'main' must be a function name");
      else d.main = e.value("main", "main");
      if (e.contains("cpu") && (!e["cpu"].is_number() || e["cpu"].get<double>() <= 0))
        p.push_back(where + ": 'cpu' must be a positive number");
      else d.cpu = e.value("cpu", 1.0);
      if (cap.cpus && d.cpu > cap.cpus)
        p.push_back(where + ": cpu " + std::to_string(d.cpu) + " cannot be met: the largest host has " +
                    std::to_string(cap.cpus) + " cpus");
      if (e.contains("memory") && !read_size(e["memory"], &d.memory))
        p.push_back(where + ": 'memory' must be a size such as 256MiB");
      if (cap.compute_memory && d.memory > cap.compute_memory)
        p.push_back(where + ": memory " + human(d.memory) + " cannot be met: the largest host has " +
                    human(cap.compute_memory));
      if (e.contains("parallelism") && !(e["parallelism"].is_number_integer() && e["parallelism"].get<int64_t>() >= 1 &&
                                         e["parallelism"].get<int64_t>() <= 1024))
        p.push_back(where + ": 'parallelism' must be an integer from 1 to 1024");
      else d.parallelism = int(e.value("parallelism", int64_t(1)));
      if (e.contains("timeout")) {
        uint64_t ms;
        if (!e["timeout"].is_number_integer() || (ms = e["timeout"].get<uint64_t>()) == 0)
          p.push_back(where + ": 'timeout' must be milliseconds");
        else d.timeout_ms = int64_t(ms);
      }
      if (e.contains("transports")) {
        if (!e["transports"].is_object()) {
          p.push_back(where + ": 'transports' must map transport names to {element, rights}");
        } else {
          for (auto &[tname, t] : e["transports"].items()) {
            std::string tw = where + ", transport '" + tname + "'";
            TransportDecl td;
            if (!std::regex_match(tname, ident)) p.push_back(tw + ": the name must be letters, digits, '_', '.', '-'");
            if (!t.is_object() || !t.contains("element") || !t["element"].is_string()) {
              p.push_back(tw + ": must be {element: NAME, rights: r|w|rw}");
              continue;
            }
            td.element = t["element"];
            std::string rights = t.value("rights", std::string("rw"));
            td.rights = rights == "r" ? 1 : rights == "w" ? 2 : rights == "rw" ? 3 : 0;
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

}  // namespace scad
