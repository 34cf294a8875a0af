// libd-memd: a standalone memory element server. Hosts memory elements of given sizes and serves
// them over tcp, shm and RDMA verbs until SIGTERM/SIGINT.
//
//   libd-memd --element mem1=64MiB [--element ...] [--tcp 127.0.0.1:0] [--unix /run/x.sock]
//             [--verbs [dev=rxe0,gid_index=1,mw=0]] [--grant mem1:CLIENT:rw[:OFFSET:LENGTH]]...
//             --grants FILE [--capacity 1GiB]
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
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/params.h"
#include "server/memory_server.h"

using nlohmann::json;

namespace {

[[noreturn]] void usage(const std::string &why) {
  std::cerr << "libd-memd: " << why << "\n"
            << "usage: libd-memd --element NAME=SIZE [--element ...] [--tcp HOST:PORT] [--unix PATH]\n"
            << "                 [--grant ELEMENT:CLIENT:RIGHTS[:OFFSET:LENGTH]]... --grants FILE\n"
            << "                 [--capacity SIZE] [--verbs [KEY=VALUE,...]]\n";
  exit(2);
}

[[noreturn]] void die(const std::string &what) {
  std::cerr << "libd-memd: " << what << ": " << libd::last_error() << "\n";
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

unsigned rights_of(const std::string &r) {
  if (r == "r") return 1;
  if (r == "w") return 2;
  if (r == "rw") return 3;
  usage("rights must be r, w or rw, not '" + r + "'");
}

}  // namespace

int main(int argc, char **argv) {
  std::vector<std::pair<std::string, uint64_t>> elements;
  std::vector<libd::Grant> grants;
  std::string tcp, unix_path, grants_file;
  bool verbs = false;
  libd::Params verbs_params;
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
      if (eq == std::string::npos || !libd::parse_size(v.substr(eq + 1), &size))
        usage("--element takes NAME=SIZE, e.g. mem1=64MiB");
      elements.emplace_back(v.substr(0, eq), size);
    } else if (a == "--tcp") {
      tcp = value();
    } else if (a == "--unix") {
      unix_path = value();
    } else if (a == "--verbs") {
      verbs = true;
      if (i + 1 < argc && argv[i + 1][0] != '-' && !libd::parse_assignments(argv[++i], &verbs_params))
        usage("--verbs takes KEY=VALUE[,KEY=VALUE...] (dev, port_num, gid_index, mw)");
    } else if (a == "--grants") {
      grants_file = value();
    } else if (a == "--capacity") {
      if (!libd::parse_size(value(), &capacity)) usage("--capacity takes a size");
    } else if (a == "--grant") {
      auto f = split(value(), ':');
      if (f.size() != 3 && f.size() != 5) usage("--grant takes ELEMENT:CLIENT:RIGHTS[:OFFSET:LENGTH]");
      libd::Grant g;
      g.element = f[0];
      g.client = f[1];
      g.rights = rights_of(f[2]);
      if (f.size() == 5 && (!libd::parse_size(f[3], &g.offset) || !libd::parse_size(f[4], &g.length)))
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

  libd::MemoryServer server;
  server.set_capacity(capacity);
  for (auto &[name, size] : elements)
    if (server.add_element(name, size)) die("element '" + name + "'");

  json out = {{"pid", getpid()}};
  if (verbs) {
    if (tcp.empty()) tcp = "127.0.0.1:0";
    if (server.enable_verbs(verbs_params)) die("verbs");
  }
  if (!tcp.empty()) {
    auto colon = tcp.rfind(':');
    uint64_t port;
    if (colon == std::string::npos || !libd::parse_size(tcp.substr(colon + 1), &port) || port > 65535)
      usage("--tcp takes HOST:PORT");
    uint16_t bound;
    if (server.listen_tcp(tcp.substr(0, colon), uint16_t(port), &bound)) die("tcp listener");
    out["tcp"] = tcp.substr(0, colon) + ":" + std::to_string(bound);
  }
  if (!unix_path.empty()) {
    if (server.listen_unix(unix_path)) die("unix listener");
    out["unix"] = unix_path;
  }
  if (verbs) out["verbs"] = server.verbs_description();  // after the tcp listener: it names the rdma_cm port

  std::ifstream existing(grants_file);
  if (existing) {
    std::string line;
    while (std::getline(existing, line)) {
      if (line.empty()) continue;
      libd::Grant g;
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
      if (server.grant(&g)) die("restoring grant " + g.id);
    }
  } else {
    int fd = open(grants_file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
      std::cerr << "libd-memd: cannot create " << grants_file << ": " << strerror(errno) << "\n";
      return 1;
    }
    std::string text;
    for (auto &g : grants) {
      if (server.grant(&g)) die("grant on '" + g.element + "'");
      json j = {{"id", g.id},         {"secret", g.secret}, {"element", g.element},
                {"client", g.client}, {"rights", g.rights}, {"offset", g.offset},
                {"length", g.length}, {"config", server.client_config(g)}};
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
  server.stop();
  return 0;
}
