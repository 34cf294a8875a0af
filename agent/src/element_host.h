// The agent's memory pool, hosted through libd's public door: one server transport (verbs_server
// when the host serves RDMA, tcp_server otherwise) with a unix socket for shm clients, a capacity
// over its elements, and grants that hand clients their configuration strings.
#pragma once
#include <cstdint>
#include <string>

#include "libd.h"

namespace scad {

struct ElementHostOptions {
  std::string unix_path;       // shm clients connect here
  std::string tcp_host;        // tcp and verbs clients connect here (an ephemeral port)
  uint64_t capacity = 0;       // bytes of elements at once
  std::string verbs = "auto";  // auto | off | KEY=VALUE,... (dev, port_num, gid_index, mw, cm)
};

// "dev=rxe0,gid_index=1" as a durl's pairs (";dev,rxe0;gid_index,1"); false with *why for keys
// other than dev, port_num, gid_index, mw, cm or values a durl cannot carry.
bool verbs_pairs(const std::string &assignments, std::string *pairs, std::string *why);

class ElementHost {
 public:
  ElementHost() = default;
  ~ElementHost();
  ElementHost(const ElementHost &) = delete;
  ElementHost &operator=(const ElementHost &) = delete;

  // Starts serving. With verbs "auto", a host whose RDMA device cannot be used serves shm and tcp
  // and says why on stderr; a device asked for by name must work. 0 or -errno with *why.
  int start(const ElementHostOptions &opts, std::string *why);

  // prefetch: the element's pages had in the background (libd_trdma_server_prefetch).
  int add_element(const std::string &id, uint64_t size, bool prefetch, std::string *why);
  void remove_element(const std::string &id);
  // A grant on `element` for `client` with LIBD_RIGHT_* rights: its configuration and its id.
  int grant(const std::string &element, const std::string &client, unsigned rights, std::string *config,
            std::string *grant_id, std::string *why);
  int revoke(const std::string &grant_id, std::string *why);

  uint64_t used_bytes() const;
  bool rdma() const { return rdma_; }
  std::string rdma_device() const;

 private:
  int open(const std::string &impl, const std::string &extra, const ElementHostOptions &opts);
  void close();
  libd_action *action_ = nullptr;
  libd_transport *server_ = nullptr;
  bool rdma_ = false;
  std::string last_why_;  // why open() failed
};

}  // namespace scad
