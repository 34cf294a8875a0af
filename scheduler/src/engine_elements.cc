// The life of a memory element and its grants: every place the engine creates, grants, rolls
// back or releases memory goes through these four, so that a failure half-way leaves nothing behind
// and the namespace's quota always matches what exists.
#include "engine.h"

namespace scad {

int Engine::create_memory(const std::string &ns, const std::string &id, uint64_t size, bool prefetch, int near,
                          PlacedMemory *out, std::string *why) {
  int h = place_memory(ns, size, near, why);
  if (h < 0) return -ENOSPC;
  if (int rc = host(h)->create_element(id, size, prefetch, why)) {
    unplace_memory(ns, h, size);
    return rc;
  }
  *out = {id, h, size};
  return 0;
}

int Engine::grant_memory(const PlacedMemory &mem, const std::string &client, unsigned rights,
                         const std::string &trans_name, int client_host, TransportGrant *out, std::string *why) {
  return host(mem.host)->grant(mem.id, client, rights, trans_name, transport_between(mem.host, client_host), out, why);
}

void Engine::release_memory(const std::string &ns, const PlacedMemory &mem) {
  host(mem.host)->remove_element(mem.id);  // revokes its grants: their connections close at once
  unplace_memory(ns, mem.host, mem.size);
}

void Engine::revoke_grants(const std::vector<std::pair<int, std::string>> &grants) {
  std::string why;
  for (auto &[h, grant] : grants) host(h)->revoke(grant, &why);  // an element already gone took its grants along
}

}  // namespace scad
