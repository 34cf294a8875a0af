// scad-agent: a host agent on its own, for hosts other than the scheduler's. It serves the
// host's memory pool and compute processes to the scheduler over HTTP (bearer: the token it
// registered with: its own host key "ID:SECRET", or the cluster token), registers itself and
// heartbeats every 2 s.
//
//   scad-agent --scheduler http://ADDR:PORT --address ADDR --token-file FILE [--id NAME] [--port 0]
//              [--home DIR] and the agent flags scad-server has too (agent_flags.h); --help lists all
// With an RDMA device (auto), the pool serves verbs too and the agent registers with "rdma": true,
// so the scheduler wires elements on two such hosts over verbs.
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include "agent.h"
#include "agent_flags.h"
#include "flags.h"
#include "agent_api.h"
#include "safe_json.h"

int main(int argc, char **argv) {
  scad::AgentOptions ao;
  ao.python = "/usr/bin/python3";
  ao.cpus = double(std::max(1u, std::thread::hardware_concurrency()));
  // The default home is the agent's own: /var/lib/scad-agent as root, ~/.scad-agent otherwise
  // (never a shared folder such as /tmp, where another user could make it first).
  const char *user_home = getenv("HOME");
  std::string scheduler, token_file,
      home = geteuid() == 0 ? "/var/lib/scad-agent" : std::string(user_home ? user_home : "/nonexistent") + "/.scad-agent";
  int port = 0;
  bool id_given = false;
  char hostname[256] = "agent";
  gethostname(hostname, sizeof hostname - 1);
  ao.host_id = hostname;
  scad::Flags flags("scad-agent", "a host agent: serves this host's memory pool and compute processes to a scheduler");
  flags.text("--scheduler", "URL", "the scheduler's REST API (needed)", &scheduler)
      .text("--address", "ADDR", "this host's address for tcp memory and the agent's API", &ao.tcp_host)
      .text("--token-file", "FILE", "the cluster token or this host's key (needed)", &token_file)
      .custom("--id", "NAME", "this host's id (default: the host name; a host key names it)",
              [&](const std::string &v, std::string *why) {
                if (v.empty()) {
                  *why = "takes a name";
                  return false;
                }
                ao.host_id = v;
                id_given = true;
                return true;
              })
      .integer("--port", "the agent's API port (default 0: any)", 0, 65535, &port)
      .text("--home", "DIR", "state folder (default /var/lib/scad-agent as root, else ~/.scad-agent)", &home);
  scad::add_agent_flags(flags, &ao);
  flags.parse(argc, argv);
  auto usage = [&](const std::string &why) { flags.fail(why); };
  if (scheduler.empty() || token_file.empty()) usage("--scheduler and --token-file are needed");
  std::string token;
  std::getline(std::ifstream(token_file), token);
  if (token.size() < 16) usage("the cluster token in " + token_file + " is missing or too short");
  // A host key ("ID:SECRET", from `scad host key ID`) names the host it belongs to.
  if (auto colon = token.find(':'); colon != std::string::npos) {
    std::string key_id = token.substr(0, colon);
    if (id_given && key_id != ao.host_id) usage("--id " + ao.host_id + " differs from the id of the host key, " + key_id);
    ao.host_id = key_id;
  }
  ao.home = home;

  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);

  scad::Agent agent(ao);
  std::string why;
  if (agent.start(&why)) {
    std::cerr << "scad-agent: cannot start the memory pool: " << why << "\n";
    return 1;
  }
  httplib::Server srv;
  srv.new_task_queue = [] { return new httplib::ThreadPool(32); };
  srv.set_tcp_nodelay(true);  // a response's headers and body are separate writes: no Nagle wait between them
  scad::install_agent_routes(srv, agent, token);
  int bound = port == 0 ? srv.bind_to_any_port(ao.tcp_host) : (srv.bind_to_port(ao.tcp_host, port) ? port : -1);
  if (bound <= 0) {
    std::cerr << "scad-agent: cannot listen on " << ao.tcp_host << ":" << port << "\n";
    return 1;
  }
  std::string url = "http://" + ao.tcp_host + ":" + std::to_string(bound);

  std::atomic<bool> stop{false}, registered{false};
  std::thread heartbeat([&] {
    nlohmann::json me = {{"id", ao.host_id}, {"url", url}, {"cpus", ao.cpus}, {"pool", ao.pool_bytes},
                         {"rdma", agent.rdma()}, {"rdma_device", agent.rdma_device()}, {"limits", agent.limits()},
                         {"sandbox", agent.sandboxed()}};
    if (!agent.limits()) me["cgroup_limits_off"] = agent.limits_off_reason();
    if (!agent.sandboxed()) me["sandbox_off"] = agent.sandbox_off_reason();
    while (!stop) {
      httplib::Client c(scheduler);
      c.set_connection_timeout(2);
      c.set_bearer_token_auth(token.c_str());
      auto res = c.Post("/api/v1/hosts/register", scad::dump_json(me), "application/json");
      if (res && res->status == 200 && !registered.exchange(true))
        std::cout << "scad-agent: " << ao.host_id << " serving at " << url << ", registered with " << scheduler
                  << (agent.rdma() ? ", RDMA on " + agent.rdma_device() : ", no RDMA")
                  << (agent.limits() ? ", cgroup v2 limits" : ", no cgroup limits (" + agent.limits_off_reason() + ")")
                  << (agent.sandboxed() ? ", sandboxed" : ", NOT sandboxed (" + agent.sandbox_off_reason() + ")")
                  << std::endl;
      else if ((!res || res->status != 200) && registered.exchange(false))
        std::cerr << "scad-agent: lost the scheduler at " << scheduler << "; retrying\n";
      for (int i = 0; i < 20 && !stop; i++) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::thread signals([&] {
    int sig;
    sigwait(&sigs, &sig);
    stop = true;
    srv.stop();
  });
  signals.detach();
  srv.listen_after_bind();
  stop = true;
  heartbeat.join();
  return 0;
}
