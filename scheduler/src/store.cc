#include "store.h"

#include <openssl/evp.h>

#include <chrono>
#include <stdexcept>

#include "secrets.h"
#include "safe_json.h"

namespace scad {

namespace {

// A prepared statement that finalizes itself.
class Stmt {
 public:
  Stmt(sqlite3 *db, const std::string &sql) {
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &s_, nullptr) != SQLITE_OK)
      throw std::runtime_error(std::string("sqlite prepare: ") + sqlite3_errmsg(db));
  }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt &bind(int i, const std::string &v) {
    sqlite3_bind_text(s_, i, v.c_str(), int(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt &bind(int i, int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  Stmt &bind_null(int i) {
    sqlite3_bind_null(s_, i);
    return *this;
  }
  bool step() {
    int rc = sqlite3_step(s_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    throw std::runtime_error(std::string("sqlite step: ") + sqlite3_errmsg(sqlite3_db_handle(s_)));
  }
  std::string text(int col) {
    auto p = sqlite3_column_text(s_, col);
    return p ? std::string(reinterpret_cast<const char *>(p), size_t(sqlite3_column_bytes(s_, col))) : "";
  }
  bool null(int col) { return sqlite3_column_type(s_, col) == SQLITE_NULL; }

 private:
  sqlite3_stmt *s_ = nullptr;
};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string sha256_hex(const std::string &data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha256(), nullptr);
  return to_hex(std::string(reinterpret_cast<char *>(md), len));
}


std::string new_uuid() {
  std::string h = random_hex(16);
  h[12] = '4';  // version 4, random
  h[16] = "89ab"[h[16] % 4];
  return h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) + "-" + h.substr(20);
}

Store::~Store() {
  if (db_) sqlite3_close(db_);
}

void Store::exec(const std::string &sql) {
  char *err = nullptr;
  if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "?";
    sqlite3_free(err);
    throw std::runtime_error("sqlite: " + msg);
  }
}

int Store::open(const std::string &path, std::string *why) {
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    *why = "cannot open " + path + ": " + (db_ ? sqlite3_errmsg(db_) : "out of memory");
    return -1;
  }
  sqlite3_busy_timeout(db_, 5000);
  try {
    exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;");
    exec(R"(
      CREATE TABLE IF NOT EXISTS namespaces (name TEXT PRIMARY KEY, uuid TEXT UNIQUE NOT NULL, key_sha256 TEXT NOT NULL);
      CREATE TABLE IF NOT EXISTS apps (namespace TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL,
                                       updated INTEGER NOT NULL, PRIMARY KEY (namespace, name));
      CREATE TABLE IF NOT EXISTS actions (namespace TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL,
                                          updated INTEGER NOT NULL, PRIMARY KEY (namespace, name));
      CREATE TABLE IF NOT EXISTS packages (namespace TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL,
                                           updated INTEGER NOT NULL, PRIMARY KEY (namespace, name));
      CREATE TABLE IF NOT EXISTS triggers (namespace TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL,
                                           updated INTEGER NOT NULL, PRIMARY KEY (namespace, name));
      CREATE TABLE IF NOT EXISTS rules (namespace TEXT NOT NULL, name TEXT NOT NULL, doc TEXT NOT NULL,
                                        updated INTEGER NOT NULL, PRIMARY KEY (namespace, name));
      CREATE TABLE IF NOT EXISTS activations (id TEXT PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL,
                                              start INTEGER NOT NULL, finished INTEGER NOT NULL, record TEXT NOT NULL);
      CREATE INDEX IF NOT EXISTS activations_by_ns ON activations (namespace, start DESC);
      CREATE TABLE IF NOT EXISTS hosts (id TEXT PRIMARY KEY, doc TEXT NOT NULL, last_seen INTEGER NOT NULL);
      CREATE TABLE IF NOT EXISTS versions (kind TEXT NOT NULL, namespace TEXT NOT NULL, name TEXT NOT NULL,
                                           last INTEGER NOT NULL, PRIMARY KEY (kind, namespace, name));
    )");
    // An action's code has a column of its own (a zip may be tens of megabytes: neither a listing
    // nor a read of the document should parse it as JSON). Databases made before it get it added.
    bool has_code = false;
    for (Stmt q(db_, "PRAGMA table_info(actions)"); q.step();) has_code |= q.text(1) == "code";
    if (!has_code) exec("ALTER TABLE actions ADD COLUMN code TEXT");
  } catch (const std::exception &e) {
    *why = e.what();
    return -1;
  }
  return 0;
}

Credentials Store::ensure_namespace(const std::string &ns) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT uuid FROM namespaces WHERE name = ?");
  q.bind(1, ns);
  if (q.step()) return {ns, q.text(0), ""};
  Credentials c{ns, new_uuid(), random_hex(32)};
  Stmt ins(db_, "INSERT INTO namespaces (name, uuid, key_sha256) VALUES (?, ?, ?)");
  ins.bind(1, ns).bind(2, c.uuid).bind(3, sha256_hex(c.key)).step();
  return c;
}

std::optional<std::string> Store::authenticate(const std::string &uuid, const std::string &key) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT name, key_sha256 FROM namespaces WHERE uuid = ?");
  q.bind(1, uuid);
  if (!q.step()) return std::nullopt;
  // Hashes of equal length compared in constant time.
  if (!constant_time_equal(q.text(1), sha256_hex(key))) return std::nullopt;
  return q.text(0);
}

static void check_table(const std::string &t) {
  if (t != "apps" && t != "actions" && t != "packages" && t != "triggers" && t != "rules")
    throw std::invalid_argument("unknown table " + t);
}

// The column that holds an action's exec.code apart from its document ("NULL" for other tables).
static std::string code_column(const std::string &table) { return table == "actions" ? "code" : "NULL"; }

// The document read back: its code, kept in its own column, put back in exec.
static json with_code(Stmt &q) {
  json doc = json::parse(q.text(0));
  if (!q.null(1) && doc.is_object() && doc.contains("exec") && doc["exec"].is_object()) doc["exec"]["code"] = q.text(1);
  return doc;
}

void Store::put_doc(const std::string &table, const std::string &ns, const std::string &name, const json &doc) {
  check_table(table);
  // An action's exec.code goes to its column; the document is stored without it (built member
  // by member: copying the document whole would copy the code too).
  const json *code = nullptr;
  json stored = json::object();
  if (table == "actions" && doc.is_object() && doc.contains("exec") && doc["exec"].is_object() &&
      doc["exec"].contains("code") && doc["exec"]["code"].is_string()) {
    code = &doc["exec"]["code"];
    for (auto &[k, v] : doc.items()) stored[k] = k == "exec" ? json::object() : v;
    for (auto &[k, v] : doc["exec"].items())
      if (k != "code") stored["exec"][k] = v;
  }
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "INSERT INTO " + table + " (namespace, name, doc, updated" + (table == "actions" ? ", code" : "") +
                  ") VALUES (?, ?, ?, ?" + (table == "actions" ? ", ?" : "") +
                  ") ON CONFLICT (namespace, name) DO UPDATE SET doc = excluded.doc, updated = excluded.updated" +
                  (table == "actions" ? ", code = excluded.code" : ""));
  q.bind(1, ns).bind(2, name).bind(3, dump_json(code ? stored : doc)).bind(4, now_ms());
  if (table == "actions") {
    if (code) q.bind(5, code->get_ref<const std::string &>());
    else q.bind_null(5);
  }
  q.step();
}

std::optional<json> Store::get_doc(const std::string &table, const std::string &ns, const std::string &name) {
  check_table(table);
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT doc, " + code_column(table) + " FROM " + table + " WHERE namespace = ? AND name = ?");
  q.bind(1, ns).bind(2, name);
  if (!q.step()) return std::nullopt;
  return with_code(q);
}

bool Store::delete_doc(const std::string &table, const std::string &ns, const std::string &name) {
  check_table(table);
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "DELETE FROM " + table + " WHERE namespace = ? AND name = ?");
  q.bind(1, ns).bind(2, name).step();
  return sqlite3_changes(db_) > 0;
}

std::vector<json> Store::list_docs(const std::string &table, const std::string &ns) {
  check_table(table);
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT doc, " + code_column(table) + " FROM " + table + " WHERE namespace = ? ORDER BY name");
  q.bind(1, ns);
  std::vector<json> out;
  while (q.step()) out.push_back(with_code(q));
  return out;
}

std::vector<json> Store::list_page(const std::string &table, const std::string &ns, int64_t skip, int64_t limit) {
  check_table(table);
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT doc FROM " + table + " WHERE namespace = ? ORDER BY updated DESC, name LIMIT ? OFFSET ?");
  q.bind(1, ns).bind(2, limit).bind(3, skip);
  std::vector<json> out;
  while (q.step()) {
    json doc = json::parse(q.text(0));
    if (doc.contains("exec") && doc["exec"].is_object()) doc["exec"].erase("code");  // stored before the column
    out.push_back(std::move(doc));
  }
  return out;
}

int64_t Store::count_docs(const std::string &table, const std::string &ns) {
  check_table(table);
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT COUNT(*) FROM " + table + " WHERE namespace = ?");
  q.bind(1, ns);
  return q.step() ? std::stoll(q.text(0)) : 0;
}

int64_t Store::next_version(const std::string &table, const std::string &ns, const std::string &name) {
  check_table(table);
  std::lock_guard<std::mutex> lk(mu_);
  // A document stored before this table existed counts with its own version.
  int64_t stored = 0;
  {
    Stmt q(db_, "SELECT doc FROM " + table + " WHERE namespace = ? AND name = ?");
    q.bind(1, ns).bind(2, name);
    if (q.step()) {
      json doc = json::parse(q.text(0), nullptr, false);
      if (doc.is_object() && doc.contains("version") && doc["version"].is_number_integer())
        stored = doc["version"].get<int64_t>();
    }
  }
  Stmt up(db_, "INSERT INTO versions (kind, namespace, name, last) VALUES (?, ?, ?, ?) "
               "ON CONFLICT (kind, namespace, name) DO UPDATE SET last = MAX(last, excluded.last - 1) + 1 "
               "RETURNING last");
  up.bind(1, table).bind(2, ns).bind(3, name).bind(4, stored + 1);
  if (!up.step()) throw std::runtime_error("sqlite: no version returned");
  return std::stoll(up.text(0));
}

void Store::put_activation(const json &r, const std::string &entity) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "INSERT INTO activations (id, namespace, name, start, finished, record) VALUES (?, ?, ?, ?, ?, ?) "
              "ON CONFLICT (id) DO UPDATE SET finished = excluded.finished, record = excluded.record");
  // The name column is what `?name=` filters on: the entity path ("package/name" for an action in
  // a package), as OpenWhisk's view keys it; the record keeps OpenWhisk's plain name.
  q.bind(1, r["activationId"].get<std::string>())
      .bind(2, r["namespace"].get<std::string>())
      .bind(3, entity.empty() ? r["name"].get<std::string>() : entity)
      .bind(4, r["start"].get<int64_t>())
      .bind(5, int64_t(r.value("end", int64_t(0)) != 0))
      .bind(6, dump_json(r))
      .step();
}

std::optional<json> Store::get_activation(const std::string &ns, const std::string &id) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT record FROM activations WHERE namespace = ? AND id = ? AND finished = 1");
  q.bind(1, ns).bind(2, id);
  if (!q.step()) return std::nullopt;
  return json::parse(q.text(0));
}

// The WHERE clause of a listing and its bindings after the namespace.
static std::string activation_filter(const Store::ActivationQuery &f) {
  std::string where = " WHERE namespace = ? AND finished = 1";
  if (!f.name.empty()) where += " AND name = ?";
  if (f.since > 0) where += " AND start >= ?";
  if (f.upto > 0) where += " AND start <= ?";
  return where;
}

static int bind_filter(Stmt &q, const std::string &ns, const Store::ActivationQuery &f) {
  int i = 1;
  q.bind(i++, ns);
  if (!f.name.empty()) q.bind(i++, f.name);
  if (f.since > 0) q.bind(i++, f.since);
  if (f.upto > 0) q.bind(i++, f.upto);
  return i;
}

std::vector<json> Store::list_activations(const std::string &ns, const ActivationQuery &f) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT record FROM activations" + activation_filter(f) + " ORDER BY start DESC LIMIT ? OFFSET ?");
  int i = bind_filter(q, ns, f);
  q.bind(i++, int64_t(f.limit));
  q.bind(i++, int64_t(f.skip));
  std::vector<json> out;
  while (q.step()) out.push_back(json::parse(q.text(0)));
  return out;
}

int64_t Store::count_activations(const std::string &ns, const ActivationQuery &f) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT COUNT(*) FROM activations" + activation_filter(f));
  bind_filter(q, ns, f);
  if (!q.step()) return 0;
  return std::stoll(q.text(0));
}

// The entity path of a stored record: its "path" annotation without the namespace.
static std::string entity_of(const json &r) {
  for (auto &a : r.value("annotations", json::array()))
    if (a.is_object() && a.value("key", "") == "path" && a["value"].is_string()) {
      std::string path = a["value"];
      auto slash = path.find('/');
      if (slash != std::string::npos) return path.substr(slash + 1);
    }
  return "";
}

int Store::fail_unfinished(const std::string &why) {
  std::vector<json> open;
  {
    std::lock_guard<std::mutex> lk(mu_);
    Stmt q(db_, "SELECT record FROM activations WHERE finished = 0");
    while (q.step()) open.push_back(json::parse(q.text(0)));
  }
  for (auto &r : open) {
    r["end"] = now_ms();
    r["duration"] = r["end"].get<int64_t>() - r["start"].get<int64_t>();
    r["response"] = {{"status", "whisk internal error"}, {"statusCode", 3}, {"success", false},
                     {"result", {{"error", why}}}};
    put_activation(r, entity_of(r));
  }
  return int(open.size());
}

void Store::put_host(const json &host) {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "INSERT INTO hosts (id, doc, last_seen) VALUES (?, ?, ?) "
              "ON CONFLICT (id) DO UPDATE SET doc = excluded.doc, last_seen = excluded.last_seen");
  q.bind(1, host["id"].get<std::string>()).bind(2, dump_json(host)).bind(3, now_ms()).step();
}

std::vector<json> Store::list_hosts() {
  std::lock_guard<std::mutex> lk(mu_);
  Stmt q(db_, "SELECT doc FROM hosts ORDER BY id");
  std::vector<json> out;
  while (q.step()) out.push_back(json::parse(q.text(0)));
  return out;
}

}  // namespace scad
