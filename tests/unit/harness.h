// Shared test helpers: an action with one client transport of a given implementation, connected
// to a fresh memory element (a real in-process memory server for shm and tcp).
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <random>
#include <string>

#include "libd.h"
#include "server/memory_server.h"
#include "ibv/device.h"

namespace test {

struct ActionDeleter {
  void operator()(libd_action *a) const { libd_action_free(a); }
};
using ActionPtr = std::unique_ptr<libd_action, ActionDeleter>;

inline ActionPtr make_action(const std::string &aid, std::vector<std::string> opts = {}) {
  std::vector<char *> argv;
  for (auto &o : opts) argv.push_back(o.data());
  return ActionPtr(libd_action_init(aid.c_str(), int(argv.size()), argv.data()));
}

inline std::string unique_socket_path(const std::string &tag) {
  static int counter = 0;
  return "/tmp/libd-test-" + std::to_string(getpid()) + "-" + tag + "-" + std::to_string(counter++) + ".sock";
}

// A memory element of `size` bytes and a client transport "mem" on it.
struct Rig {
  std::unique_ptr<libd::MemoryServer> server;
  ActionPtr action;
  libd_transport *t = nullptr;
  std::string config;  // what the control plane would relay
  uint16_t port = 0;   // the server's tcp port (tcp and verbs)
  libd::Grant grant;
};

inline Rig make_rig(const std::string &impl, uint64_t size, unsigned rights = 3, const std::string &extra = "",
                    const std::string &aid = "client-1") {
  Rig r;
  r.action = make_action(aid);
  std::string durl;
  if (impl == "local" || impl == "fake") {
    durl = "mem;" + impl + ";size," + std::to_string(size) + ";rights," +
           (rights == 3 ? "rw" : rights == 1 ? "r" : "w");
  } else {
    r.server = std::make_unique<libd::MemoryServer>();
    EXPECT_EQ(0, r.server->add_element("e1", size)) << libd_last_error();
    if (impl == "verbs" || impl == "verbs_nomw") {
      libd::Params vp;
      if (impl == "verbs_nomw") vp.set("mw", "0");  // per-grant registrations instead of windows
      EXPECT_EQ(0, r.server->enable_verbs(vp)) << libd_last_error();
    }
    if (impl == "verbs" || impl == "verbs_nomw" || impl == "tcp") {
      EXPECT_EQ(0, r.server->listen_tcp("127.0.0.1", 0, &r.port)) << libd_last_error();
    } else {
      EXPECT_EQ(0, r.server->listen_unix(unique_socket_path("rig"))) << libd_last_error();
    }
    r.grant.element = "e1";
    r.grant.client = aid;
    r.grant.rights = rights;
    EXPECT_EQ(0, r.server->grant(&r.grant)) << libd_last_error();
    r.config = r.server->client_config(r.grant);
    durl = "mem;" + (impl == "verbs_nomw" ? std::string("verbs") : impl) + ";" + r.config;
  }
  if (!extra.empty()) durl += ";" + extra;
  EXPECT_EQ(0, libd_action_add_transport(r.action.get(), durl.c_str())) << libd_last_error();
  r.t = libd_action_get_transport(r.action.get(), "mem");
  return r;
}

// Verbs tests need an RDMA device: in the Soft-RoCE guest (tests/softroce/run sets
// LIBD_REQUIRE_VERBS=1, so a missing device fails there) or on a host that has one.
inline bool verbs_wanted() { return getenv("LIBD_REQUIRE_VERBS") || libd::ibv::Device::available(); }

inline std::string transport_error(libd_transport *t) {
  char buf[1024] = "";
  libd_transport_error(t, buf, sizeof buf);
  return buf;
}

inline void fill_random(char *p, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v = rng();
    memcpy(p + i, &v, 8);
  }
  for (; i < n; i++) p[i] = char(rng());
}

// How many times a thread of this process went to sleep (voluntary context switches; a
// sched_yield while polling is not one), -1 if it cannot be read.
inline long sleeps_of(long tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(line.find(':') + 1));
  return -1;
}

}  // namespace test
