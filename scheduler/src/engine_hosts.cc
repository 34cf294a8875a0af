// The engine's hosts: watching their heartbeats, losing one, placement of memory and compute,
// the transport between two hosts, cpus held by running instances, and what /api/v1/hosts shows.
#include <algorithm>

#include "engine.h"
#include "engine_activation.h"
#include "safe_json.h"

namespace scad {

void Engine::watch_hosts() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_cv_.wait_for(lk, std::chrono::milliseconds(500), [&] { return stopping_; })) {
    std::vector<int> lost;
    for (size_t i = 0; i < hosts_.size(); i++) {
      bool alive = hosts_[i].agent->alive();
      if (hosts_[i].was_alive && !alive) lost.push_back(int(i));
      hosts_[i].was_alive = alive;
    }
    if (lost.empty()) continue;
    lk.unlock();
    for (int h : lost) {
      try {
        host_lost(h);
      } catch (const std::exception &e) {  // a notice that could not be built or sent: the next host
        fprintf(stderr, "scad-server: telling instances about lost host %d failed: %s\n", h, e.what());
      }
    }
    lk.lock();
  }
}

void Engine::host_lost(int h) {
  std::string host_id = host(h)->id();
  std::vector<std::shared_ptr<Activation>> acts;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto &[id, act] : running_) acts.push_back(act);
  }
  for (auto &act : acts) {
    struct Notice {
      int host;
      std::string aid;
      json body;
    };
    std::vector<Notice> notices;
    {
      std::lock_guard<std::mutex> lk(act->mu);
      std::vector<std::string> gone;  // manifest names of memory on the lost host
      for (auto &[name, p] : act->memory)
        if (p.host == h) gone.push_back(name);
      for (auto &[aid, inst] : act->instances) {
        if (inst.host == h) continue;  // gone with the host
        json shared = json::array();
        for (auto &m : inst.memory)
          if (std::find(gone.begin(), gone.end(), m) != gone.end()) shared.push_back(m);
        for (auto &[key, p] : act->runtime_elements)  // "aid/name": what this instance invoked
          if (p.host == h && key.rfind(aid + "/", 0) == 0) shared.push_back(key.substr(aid.size() + 1));
        if (shared.empty()) continue;
        std::string reason = "host '" + host_id + "' stopped answering (no heartbeat): memory element" +
                             (shared.size() > 1 ? "s " : " ");
        for (size_t i = 0; i < shared.size(); i++) reason += (i ? ", '" : "'") + shared[i].get<std::string>() + "'";
        reason += shared.size() > 1 ? " are gone with it" : " is gone with it";
        notices.push_back({inst.host, aid, json{{"aid", nullptr}, {"element", shared[0]}, {"instance", nullptr},
                                       {"status", "lost"}, {"type", "host_lost"}, {"host", host_id},
                                       {"reason", reason}, {"shared", shared}}});
      }
    }
    for (auto &n : notices) host(n.host)->notify(n.aid, n.body);  // outside act->mu: it is an HTTP call
  }
}

void Engine::add_host(std::shared_ptr<HostAgent> h) {
  std::lock_guard<std::mutex> lk(mu_);
  for (auto &hs : hosts_)
    if (hs.agent->id() == h->id()) {  // a re-registering agent: new address, same bookkeeping
      hs.agent = std::move(h);
      return;
    }
  HostState hs;
  hs.cpu_free = h->cpus();
  hs.agent = std::move(h);
  hosts_.push_back(std::move(hs));
}

Capacity Engine::capacity() {
  std::lock_guard<std::mutex> lk(mu_);
  Capacity c;
  for (auto &h : hosts_) {
    c.memory_pool = std::max(c.memory_pool, h.agent->pool_bytes());
    c.cpus = std::max(c.cpus, h.agent->cpus());
  }
  return c;
}

std::shared_ptr<HostAgent> Engine::host(int i) {
  std::lock_guard<std::mutex> lk(mu_);
  return hosts_.at(size_t(i)).agent;
}

int Engine::place_memory(const std::string &ns, uint64_t size, int near, std::string *why) {
  std::lock_guard<std::mutex> lk(mu_);
  Usage &u = usage_[ns];
  uint64_t counted = std::max(size, kElementMinBytes);
  if (u.elements >= quotas_.elements || counted > quotas_.element_bytes - std::min(u.bytes, quotas_.element_bytes)) {
    *why = "namespace '" + ns + "' is at its quota of memory elements (" + std::to_string(u.elements) + " of " +
           std::to_string(quotas_.elements) + " elements, " + std::to_string(u.bytes) + " of " +
           std::to_string(quotas_.element_bytes) + " bytes)";
    return -1;
  }
  auto free_of = [&](const HostState &h) {
    return h.agent->alive() && h.agent->pool_bytes() >= h.pool_used ? h.agent->pool_bytes() - h.pool_used : 0;
  };
  int best = -1;
  if (near >= 0 && free_of(hosts_[size_t(near)]) >= size) best = near;  // one host: the transport is shm
  for (size_t i = 0; best < 0 && i < hosts_.size(); i++)
    if (free_of(hosts_[i]) >= size && (best < 0 || free_of(hosts_[i]) > free_of(hosts_[size_t(best)]))) best = int(i);
  if (best < 0) {
    uint64_t most = 0;
    for (auto &h : hosts_) most = std::max(most, free_of(h));
    *why = "no host has " + std::to_string(size) + " bytes free in its memory pool (the most free is " +
           std::to_string(most) + ")";
    return -1;
  }
  hosts_[size_t(best)].pool_used += size;
  u.elements++;
  u.bytes += counted;
  return best;
}

void Engine::unplace_memory(const std::string &ns, int host, uint64_t size) {
  std::lock_guard<std::mutex> lk(mu_);
  hosts_[size_t(host)].pool_used -= std::min(size, hosts_[size_t(host)].pool_used);
  Usage &u = usage_[ns];
  u.elements -= std::min<int64_t>(u.elements, 1);
  u.bytes -= std::min(u.bytes, std::max(size, kElementMinBytes));
}

int Engine::place_compute(double cpu, int near) {
  std::lock_guard<std::mutex> lk(mu_);
  if (near >= 0 && hosts_[size_t(near)].agent->alive() && hosts_[size_t(near)].agent->cpus() >= std::min(cpu, 1.0))
    return near;  // beside its memory: shm
  int best = -1;
  for (size_t i = 0; i < hosts_.size(); i++) {
    const HostState &h = hosts_[i];
    if (!h.agent->alive() || h.agent->cpus() <= 0) continue;
    if (best < 0 || h.cpu_free > hosts_[size_t(best)].cpu_free) best = int(i);
  }
  return best;
}

std::string Engine::transport_between(int memory_host, int client_host) {
  if (memory_host == client_host) return "shm";
  auto a = host(memory_host), b = host(client_host);
  return a->rdma() && b->rdma() ? "verbs" : "tcp";
}

void Engine::acquire_cpu(int host, double cpu) {
  std::unique_lock<std::mutex> lk(mu_);
  HostState &h = hosts_[size_t(host)];
  // An element asking for more than the host has still runs, alone (validation refuses such
  // manifests; actions ask for 1).
  cpu = std::min(cpu, h.agent->cpus());
  cpu_cv_.wait(lk, [&] { return h.cpu_free >= cpu - 1e-9; });
  h.cpu_free -= cpu;
}

void Engine::release_cpu(int host, double cpu) {
  std::lock_guard<std::mutex> lk(mu_);
  HostState &h = hosts_[size_t(host)];
  h.cpu_free += std::min(cpu, h.agent->cpus());
  cpu_cv_.notify_all();
}

json Engine::host_info() {
  std::lock_guard<std::mutex> lk(mu_);
  json out = json::array();
  for (auto &h : hosts_)
    out.push_back({{"id", h.agent->id()}, {"cpus", h.agent->cpus()}, {"cpus_free", h.cpu_free},
                   {"memory_pool", h.agent->pool_bytes()}, {"memory_pool_used", h.pool_used},
                   {"rdma", h.agent->rdma()}, {"state", h.agent->alive() ? "up" : "down"},
                   {"isolation", h.agent->isolation()}});
  return out;
}

}  // namespace scad
