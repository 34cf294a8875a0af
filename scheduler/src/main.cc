// scad-server: the single-machine platform — scheduler and host agent in one process.
//
//   scad-server [--home DIR] [--host 127.0.0.1] [--port 3233] [--namespace NAME]...
//               [--cluster-token-file FILE] [--host-keys FILE] [--no-local-agent]
//               [--quotas ...] [--action-limits ...] [--connection-limits ...]
//               and the agent flags scad-agent has too (runtime/src/agent_flags.h); --help lists all
// With a cluster token, scad-agent processes on other hosts register and take elements too; with
// --no-local-agent this process only schedules.
//
// State lives in DIR (default $SCAD_HOME or ~/.scad): scad.db (SQLite, WAL), the code of deployed
// versions, the memory pool's socket, and wskprops (APIHOST and AUTH, as OpenWhisk's wsk reads it).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

#include "agent.h"
#include "agent_flags.h"
#include "flags.h"
#include "api.h"
#include "engine.h"
#include "hosts.h"
#include "action_limits.h"
#include "store.h"

namespace {

std::string read_file(const std::string &path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Keeps AUTH from an earlier start (the key is stored only hashed) and refreshes APIHOST.
bool write_wskprops(const std::string &path, const std::string &apihost, const scad::Credentials &c) {
  std::string auth, ns = c.ns;
  if (!c.key.empty()) {
    auth = c.uuid + ":" + c.key;
  } else {
    std::istringstream in(read_file(path));
    for (std::string line; std::getline(in, line);)
      if (line.rfind("AUTH=", 0) == 0) auth = line.substr(5);
    if (auth.empty()) return false;
  }
  std::string tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  std::string text = "APIHOST=" + apihost + "\nAUTH=" + auth + "\nNAMESPACE=" + ns + "\n";
  bool ok = write(fd, text.data(), text.size()) == ssize_t(text.size());
  close(fd);
  return ok && rename(tmp.c_str(), path.c_str()) == 0;
}

}  // namespace

int main(int argc, char **argv) {
  const char *env_home = getenv("SCAD_HOME");
  std::string home = env_home ? env_home : std::string(getenv("HOME") ? getenv("HOME") : "/tmp") + "/.scad";
  std::string host = "127.0.0.1";
  int port = 3233;
  scad::AgentOptions ao;
  std::string cluster_token_file, host_keys;
  std::vector<std::string> namespaces;  // besides guest
  bool no_local_agent = false;
  scad::LimitRanges limits;
  scad::Quotas quotas;
  scad::ConnectionLimits connection_limits;
  ao.python = "/usr/bin/python3";
  ao.cpus = double(std::max(1u, std::thread::hardware_concurrency()));
  scad::Flags flags("scad-server", "the platform on one machine: scheduler, REST API and an agent for this host");
  flags.text("--home", "DIR", "state folder (default $SCAD_HOME or ~/.scad)", &home)
      .text("--host", "ADDR", "address of the REST API and the runtime endpoint (default 127.0.0.1)", &host)
      .integer("--port", "the REST API's port (default 3233; 0: any)", 0, 65535, &port)
      .text("--cluster-token-file", "FILE", "agents of other hosts may register with this token", &cluster_token_file)
      .text("--host-keys", "FILE", "per-host keys (scad host key ID): each host presents its own", &host_keys)
      .toggle("--no-local-agent", "this process only schedules (no memory pool, no compute)", &no_local_agent)
      .custom("--namespace", "NAME", "one more tenant (repeatable): credentials in DIR/namespaces/NAME.wskprops",
              [&](const std::string &ns, std::string *why) {
                bool ok = !ns.empty() && ns.size() <= 64 && ns != "_" && isalnum(static_cast<unsigned char>(ns[0]));
                for (char c : ns) ok &= isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
                if (ok) namespaces.push_back(ns);
                else *why = "takes a name of letters, digits, '_', '-', '.'";
                return ok;
              })
      .custom("--quotas", "elements=N,memory=SIZE,activations=N,instances=N", "per namespace",
              [&](const std::string &v, std::string *why) { return scad::parse_quotas(v, &quotas, why); })
      .custom("--action-limits", "timeout=MIN:MAX[:DEFAULT],memory=...,logs=...", "what actions may ask (ms, MB, MB)",
              [&](const std::string &v, std::string *why) { return scad::parse_limit_ranges(v, &limits, why); })
      .custom("--connection-limits", "deadline=MS,per-client=N,body-rate=B", "slow and greedy API clients",
              [&](const std::string &v, std::string *why) { return scad::parse_connection_limits(v, &connection_limits, why); });
  scad::add_agent_flags(flags, &ao);
  flags.parse(argc, argv);
  bool local_agent = !no_local_agent;
  if (std::string why; scad::safe_home(home, &why)) {
    std::cerr << "scad-server: " << why << "\n";
    return 1;
  }
  ao.home = home;
  ao.tcp_host = host;

  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);  // every thread started below inherits this
  signal(SIGPIPE, SIG_IGN);

  scad::Store store;
  std::string why;
  if (store.open(home + "/scad.db", &why)) {
    std::cerr << "scad-server: " << why << "\n";
    return 1;
  }
  int lost = store.fail_unfinished("the scheduler stopped while this activation ran");
  scad::Credentials creds = store.ensure_namespace("guest");

  scad::Agent agent(ao);
  if (agent.start(&why)) {
    std::cerr << "scad-server: cannot start the memory pool: " << why << "\n";
    return 1;
  }
  httplib::Server srv;
  srv.new_task_queue = [] { return new httplib::ThreadPool(32); };
  // A response goes out as several writes (status and headers, then the body): with Nagle on,
  // the second waits for the client's delayed ACK, tens of milliseconds per request.
  srv.set_tcp_nodelay(true);
  int bound = port == 0 ? srv.bind_to_any_port(host) : (srv.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    std::cerr << "scad-server: cannot listen on " << host << ":" << port << " (in use? choose --port)\n";
    return 1;
  }
  std::string url = "http://" + host + ":" + std::to_string(bound);
  // The runtime endpoint: same address, a port and a thread pool of its own.
  httplib::Server runtime_srv;
  runtime_srv.new_task_queue = [] { return new httplib::ThreadPool(16); };
  runtime_srv.set_tcp_nodelay(true);
  int runtime_port = runtime_srv.bind_to_any_port(host);
  if (runtime_port <= 0) {
    std::cerr << "scad-server: cannot listen on " << host << " for the runtime endpoint\n";
    return 1;
  }
  std::string runtime_url = "http://" + host + ":" + std::to_string(runtime_port);
  scad::Metrics metrics;  // before the engine: its threads count into it until the end
  scad::Engine engine(store, runtime_url, limits, quotas);
  engine.set_api_host(url);
  engine.set_metrics(&metrics);
  if (local_agent) engine.add_host(std::make_shared<scad::LocalHost>(agent));
  // Slow or greedy clients of the public API (a header line every few seconds, or hundreds of
  // connections) are cut off before they hold the server's threads.
  scad::ConnectionGuard guard(bound, connection_limits);
  scad::widen_listen_backlog(bound);
  scad::widen_listen_backlog(runtime_port);
  scad::ApiOptions api;
  api.limits = limits;
  api.guard = &guard;
  api.metrics = &metrics;
  api.host_keys = host_keys;
  if (!cluster_token_file.empty()) {
    std::getline(std::ifstream(cluster_token_file), api.cluster_token);
    if (api.cluster_token.size() < 16) {
      std::cerr << "scad-server: the cluster token in " << cluster_token_file << " is missing or too short\n";
      return 1;
    }
  }
  scad::install_routes(srv, store, engine, api);
  scad::install_runtime_routes(runtime_srv, engine);
  std::thread runtime_thread([&] { runtime_srv.listen_after_bind(); });
  for (auto &h : engine.host_info()) store.put_host(h);
  if (!write_wskprops(home + "/wskprops", url, creds)) {
    std::cerr << "scad-server: " << home << "/wskprops has no AUTH and the key is only stored hashed; "
              << "remove " << home << "/scad.db to start afresh\n";
    return 1;
  }
  // More tenants: each namespace's credentials in a file of its own, for the operator to hand out.
  if (!namespaces.empty()) mkdir((home + "/namespaces").c_str(), 0700);
  for (auto &ns : namespaces) {
    std::string path = home + "/namespaces/" + ns + ".wskprops";
    if (!write_wskprops(path, url, store.ensure_namespace(ns))) {
      std::cerr << "scad-server: " << path << " has no AUTH and the key is only stored hashed\n";
      return 1;
    }
  }
  std::ofstream(home + "/server.json") << "{\"pid\": " << getpid() << ", \"url\": \"" << url
                                      << "\", \"runtime_url\": \"" << runtime_url << "\"}\n";
  std::cout << "scad: platform up at " << url << " (state in " << home << "; credentials in " << home
            << "/wskprops)" << (lost ? "; " + std::to_string(lost) + " unfinished activation(s) marked failed" : "")
            << (!local_agent || agent.sandboxed() ? "" : "; compute processes NOT sandboxed: " + agent.sandbox_off_reason())
            << (!local_agent || agent.limits() ? "" : "; no cgroup limits: " + agent.limits_off_reason())
            << std::endl;

  // stop() does nothing to a server that has not begun to listen yet: a signal that comes right
  // after the banner waits for that (bounded) before it stops the server.
  auto stop_server = [](httplib::Server &s) {
    for (int i = 0; i < 5000 && !s.is_running(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    s.stop();
  };
  std::thread signals([&] {
    int sig;
    sigwait(&sigs, &sig);
    stop_server(srv);  // main then stops the runtime endpoint
  });
  signals.detach();
  srv.listen_after_bind();
  stop_server(runtime_srv);
  runtime_thread.join();
  unlink((home + "/server.json").c_str());
  return 0;
}
