// The scheduler's state in SQLite (WAL): namespaces and their keys (hashed), applications,
// OpenWhisk actions, activation records, hosts and elements. Everything a restarted scheduler
// needs; writes are transactions, so a crash leaves either the old or the new state.
#pragma once
#include <sqlite3.h>

#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>
#include "secrets.h"  // random_hex, for the ids and keys made here

namespace scad {

using nlohmann::json;

struct Credentials {
  std::string ns, uuid, key;  // key only when just created
};

class Store {
 public:
  ~Store();
  // Opens (creating) the database. 0 or -1 with *why.
  int open(const std::string &path, std::string *why);

  // Namespaces: the default one is made on first start; its key is returned once.
  Credentials ensure_namespace(const std::string &ns);
  // The namespace a uuid:key pair authenticates, if any.
  std::optional<std::string> authenticate(const std::string &uuid, const std::string &key);

  // Documents (apps, actions) by namespace and name.
  void put_doc(const std::string &table, const std::string &ns, const std::string &name, const json &doc);
  std::optional<json> get_doc(const std::string &table, const std::string &ns, const std::string &name);
  bool delete_doc(const std::string &table, const std::string &ns, const std::string &name);
  std::vector<json> list_docs(const std::string &table, const std::string &ns);
  // A collection as OpenWhisk lists it: most recently updated first (then by name), from the
  // skip-th on, at most limit of them (-1: all); an action without its code (listings never
  // show it, and it is kept apart: a zip's megabytes are not read for them).
  std::vector<json> list_page(const std::string &table, const std::string &ns, int64_t skip, int64_t limit);
  int64_t count_docs(const std::string &table, const std::string &ns);

  // The next version of a document: one more than any version it ever had, also across deletes
  // (an application deleted and deployed again never reuses a version, so no agent can run old
  // files under it).
  int64_t next_version(const std::string &table, const std::string &ns, const std::string &name);

  // Activation records. A record is stored when its activation starts (so a restarted scheduler
  // can close it) but only finished ones are read back: OpenWhisk clients poll GET until it
  // stops answering 404.
  // Keyed by activationId; entity: what `?name=` finds it by ("package/name"; "" for its name).
  void put_activation(const json &record, const std::string &entity = "");
  std::optional<json> get_activation(const std::string &ns, const std::string &id);
  // Which finished activations a listing covers, newest first (OpenWhisk's query parameters).
  struct ActivationQuery {
    std::string name;             // "" for all; else the entity path, "name" or "package/name"
    int64_t since = 0, upto = 0;  // start times in ms, inclusive; 0: unbounded
    int limit = 30, skip = 0;
  };
  std::vector<json> list_activations(const std::string &ns, const ActivationQuery &q);
  int64_t count_activations(const std::string &ns, const ActivationQuery &q);
  // Marks activations that were running when the scheduler stopped; returns how many.
  int fail_unfinished(const std::string &why);

  // Hosts.
  void put_host(const json &host);
  std::vector<json> list_hosts();

 private:
  void exec(const std::string &sql);
  std::mutex mu_;
  sqlite3 *db_ = nullptr;
};

std::string sha256_hex(const std::string &data);
std::string new_uuid();

}  // namespace scad
