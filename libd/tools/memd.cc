// libd-memd: a standalone memory element server. Hosts memory elements of given sizes and serves
// them over tcp, shm and RDMA verbs until SIGTERM/SIGINT.
//
//   libd-memd --element mem1=64MiB [--element ...] [--tcp 127.0.0.1:0] [--unix /run/x.sock]
//             [--verbs [dev=rxe0,gid_index=1,mw=0]] [--grant mem1:CLIENT:rw[:OFFSET:LENGTH]]...
//             --grants FILE [--capacity 1GiB] [--busy-poll-us N]
//
// --verbs serves verbs clients on the tcp listener (the handshake travels on it): the device is
// discovered unless named; the server exits with the reason if there is none.
//
// Grants go to FILE (mode 0600, one JSON object a line, secrets included): never to stdout. If
// FILE already exists its grants are restored instead — a restarted server keeps honouring the
// configurations it handed out (the memory itself starts zeroed). On stdout the server prints one
// JSON line with its addresses once it is ready.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "flag_number.h"
#include "flags.h"
#include "libd.h"

using nlohmann::json;

namespace {

[[noreturn]] void usage(const std::string &why) {
  std::cerr << "libd-memd: " << why << "\n"
            << "usage: libd-memd --element NAME=SIZE [--element ...] [--tcp HOST:PORT] [--unix PATH]\n"
            << "                 [--grant ELEMENT:CLIENT:RIGHTS[:OFFSET:LENGTH]]... --grants FILE\n"
            << "                 [--capacity SIZE] [--verbs [KEY=VALUE,...]] [--busy-poll-us N]\n";
  exit(2);
}

[[noreturn]] void die(const std::string &what) {
  std::cerr << "libd-memd: " << what << ": " << libd_last_error() << "\n";
  exit(1);
}

std::vector<std::string> split(const std::string &s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t i = s.find(sep, start);
    out.push_back(s.substr(start, i == std::string::npos ? std::string::npos : i - start));
    if (i == std::string::npos) return out;
    start = i + 1;
  }
}

// "KEY,VALUE;KEY,VALUE" (a server's message, a grant's configuration) as a map.
std::map<std::string, std::string> pairs_of(const std::string &text) {
  std::map<std::string, std::string> out;
  for (auto &item : split(text, ';')) {
    auto comma = item.find(',');
    if (comma != std::string::npos) out[item.substr(0, comma)] = item.substr(comma + 1);
  }
  return out;
}

// "dev=rxe0,gid_index=1" as a durl's ";dev,rxe0;gid_index,1".
bool verbs_pairs(const std::string &assignments, std::string *out) {
  for (auto &item : split(assignments, ',')) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size() || item.find_first_of(";=", eq + 1) != std::string::npos)
      return false;
    *out += ";" + item.substr(0, eq) + "," + item.substr(eq + 1);
  }
  return true;
}

struct GrantLine {
  std::string id, secret, element, client;
  unsigned rights = 0;
  uint64_t offset = 0, length = 0;
};

unsigned rights_of(const std::string &r) {
  if (r == "r") return 1;
  if (r == "w") return 2;
  if (r == "rw") return 3;
  usage("rights must be r, w or rw, not '" + r + "'");
}

}  // namespace

int main(int argc, char **argv) {
  std::vector<std::pair<std::string, uint64_t>> elements;
  std::vector<GrantLine> grants;
  std::string tcp, unix_path, grants_file;
  bool verbs = false;
  std::string verbs_params;  // durl pairs
  uint64_t busy_poll_us = 0;  // the server's thread polls this long after each request (IoLoop)
  uint64_t capacity = UINT64_MAX;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--element") {
      auto v = value();
      auto eq = v.find('=');
      uint64_t size;
      if (eq == std::string::npos || !scad::parse_byte_size(v.substr(eq + 1), &size))
        usage("--element takes NAME=SIZE, e.g. mem1=64MiB");
      elements.emplace_back(v.substr(0, eq), size);
    } else if (a == "--tcp") {
      tcp = value();
    } else if (a == "--unix") {
      unix_path = value();
    } else if (a == "--verbs") {
      verbs = true;
      if (i + 1 < argc && argv[i + 1][0] != '-' && !verbs_pairs(argv[++i], &verbs_params))
        usage("--verbs takes KEY=VALUE[,KEY=VALUE...] (dev, port_num, gid_index, mw)");
    } else if (a == "--grants") {
      grants_file = value();
    } else if (a == "--busy-poll-us") {
      double us;
      if (!scad::flag_number(value(), 0, 1000000, true, &us)) usage("--busy-poll-us takes microseconds, 0..1000000");
      busy_poll_us = uint64_t(us);
    } else if (a == "--capacity") {
      if (!scad::parse_byte_size(value(), &capacity)) usage("--capacity takes a size");
    } else if (a == "--grant") {
      auto f = split(value(), ':');
      if (f.size() != 3 && f.size() != 5) usage("--grant takes ELEMENT:CLIENT:RIGHTS[:OFFSET:LENGTH]");
      GrantLine g;
      g.element = f[0];
      g.client = f[1];
      g.rights = rights_of(f[2]);
      if (f.size() == 5 && (!scad::parse_byte_size(f[3], &g.offset) || !scad::parse_byte_size(f[4], &g.length)))
        usage("OFFSET and LENGTH must be sizes");
      grants.push_back(g);
    } else {
      usage("unknown argument '" + a + "'");
    }
  }
  if (elements.empty()) usage("at least one --element is needed");
  if (grants_file.empty()) usage("--grants FILE is needed (the grants' secrets go there)");
  if (tcp.empty() && unix_path.empty()) tcp = "127.0.0.1:0";

  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);  // before any thread starts: they inherit it
  signal(SIGPIPE, SIG_IGN);

  // One server transport serves every element: verbs_server (which carries the verbs handshake
  // on its tcp listener), tcp_server (and shm beside it with --unix), or shm_server alone.
  std::string impl = "shm_server", where;
  if (verbs && tcp.empty()) tcp = "127.0.0.1:0";
  if (!tcp.empty()) {
    auto colon = tcp.rfind(':');
    uint64_t port;
    if (colon == std::string::npos || !scad::parse_byte_size(tcp.substr(colon + 1), &port) || port > 65535 ||
        tcp.find_first_of(";,") != std::string::npos)
      usage("--tcp takes HOST:PORT");
    impl = verbs ? "verbs_server" : "tcp_server";
    where += ";host," + tcp.substr(0, colon) + ";port," + std::to_string(port);
  }
  if (!unix_path.empty()) {
    if (unix_path.find_first_of(";,") != std::string::npos) usage("--unix: the path may not hold ',' or ';'");
    where += ";path," + unix_path;
  }
  libd_action *action = libd_action_init("libd-memd", 0, nullptr);
  if (!action) die("libd");
  std::string durl = "memd;" + impl + ";size,0" + where + ";capacity," + std::to_string(capacity) +
                     ";busy_poll_us," + std::to_string(busy_poll_us) + verbs_params;
  if (libd_action_add_transport(action, durl.c_str())) die("server");
  libd_transport *server = libd_action_get_transport(action, "memd");
  if (!server || libd_trdma_server_serve(server)) die(verbs ? "verbs" : "listeners");
  for (auto &[name, size] : elements)
    if (libd_trdma_server_add_element(server, name.c_str(), size)) die("element '" + name + "'");

  char message[1024];
  size_t needed;
  if (libd_transport_get_message(server, message, sizeof message, &needed) < 0) die("server address");
  auto addr = pairs_of(message);
  json out = {{"pid", getpid()}};
  if (addr.count("port")) out["tcp"] = addr["host"] + ":" + addr["port"];
  if (addr.count("path")) out["unix"] = addr["path"];
  if (verbs) {  // after the tcp listener: it names the rdma_cm port
    libd_server_attr attr;
    if (libd_trdma_server_query(server, &attr)) die("verbs");
    out["verbs"] = attr.verbs_device;
  }

  auto grant = [&](GrantLine &g, bool restore) {
    libd_grant_spec spec = {};
    spec.element = g.element.c_str();
    spec.client = g.client.c_str();
    spec.offset = g.offset;
    spec.length = g.length;
    spec.rights = g.rights;
    char config[4096];
    int n = restore ? libd_trdma_server_grant_as(server, &spec, g.id.c_str(), g.secret.c_str(), config, sizeof config)
                    : libd_trdma_server_grant_ex(server, &spec, config, sizeof config);
    if (n < 0) die(restore ? "restoring grant " + g.id : "grant on '" + g.element + "'");
    auto c = pairs_of(config);
    g.id = c["grant"];
    g.secret = c["secret"];
    return std::string(config, size_t(n));
  };
  std::ifstream existing(grants_file);
  if (existing) {
    std::string line;
    while (std::getline(existing, line)) {
      if (line.empty()) continue;
      GrantLine g;
      try {
        auto j = json::parse(line);
        g.id = j.at("id");
        g.secret = j.at("secret");
        g.element = j.at("element");
        g.client = j.at("client");
        g.rights = j.at("rights");
        g.offset = j.at("offset");
        g.length = j.at("length");
      } catch (const std::exception &e) {
        std::cerr << "libd-memd: " << grants_file << ": bad line: " << e.what() << "\n";
        return 1;
      }
      grant(g, true);
    }
  } else {
    int fd = open(grants_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      std::cerr << "libd-memd: cannot create " << grants_file << ": " << strerror(errno) << "\n";
      return 1;
    }
    std::string text;
    for (auto &g : grants) {
      std::string config = grant(g, false);
      json j = {{"id", g.id},         {"secret", g.secret}, {"element", g.element},
                {"client", g.client}, {"rights", g.rights}, {"offset", g.offset},
                {"length", g.length}, {"config", config}};
      text += j.dump() + "\n";
    }
    if (write(fd, text.data(), text.size()) != ssize_t(text.size())) {
      std::cerr << "libd-memd: cannot write " << grants_file << "\n";
      return 1;
    }
    close(fd);
  }

  std::cout << out.dump() << std::endl;
  int sig;
  sigwait(&sigs, &sig);
  libd_action_free(action);  // stops the server
  return 0;
}
