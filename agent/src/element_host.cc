#include "element_host.h"

#include <cerrno>
#include <iostream>
#include <set>
#include <vector>

namespace scad {

namespace {

bool durl_safe(const std::string &s) { return !s.empty() && s.find_first_of(";,") == std::string::npos; }

std::string grant_id_of(const std::string &config) {
  // "host,H;port,P;path,S;grant,ID;secret,HEX"
  size_t at = config.find("grant,");
  while (at != std::string::npos && at != 0 && config[at - 1] != ';') at = config.find("grant,", at + 1);
  if (at == std::string::npos) return "";
  size_t start = at + 6, end = config.find(';', start);
  return config.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace

bool verbs_pairs(const std::string &assignments, std::string *pairs, std::string *why) {
  static const std::set<std::string> keys = {"dev", "port_num", "gid_index", "mw", "cm"};
  pairs->clear();
  size_t start = 0;
  while (start <= assignments.size()) {
    size_t comma = assignments.find(',', start);
    std::string item = assignments.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t eq = item.find('=');
    std::string key = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (eq == std::string::npos || !keys.count(key) || !durl_safe(value) || value.find('=') != std::string::npos) {
      *why = "--verbs takes auto, off or KEY=VALUE[,KEY=VALUE...] (dev, port_num, gid_index, mw, cm); got '" +
             assignments + "'";
      return false;
    }
    *pairs += ";" + key + "," + value;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return true;
}

ElementHost::~ElementHost() { close(); }

void ElementHost::close() {
  if (action_) libd_action_free(action_);  // stops the server: its connections close
  action_ = nullptr;
  server_ = nullptr;
}

int ElementHost::open(const std::string &impl, const std::string &extra, const ElementHostOptions &opts) {
  close();
  action_ = libd_action_init("scad-agent-pool", 0, nullptr);
  if (!action_) return -ENOMEM;
  std::string durl = "pool;" + impl + ";size,0;host," + opts.tcp_host + ";port,0;path," + opts.unix_path +
                     ";capacity," + std::to_string(opts.capacity) + extra;
  int rc = libd_action_add_transport(action_, durl.c_str());
  if (rc == 0) {
    server_ = libd_action_get_transport(action_, "pool");
    rc = server_ ? libd_trdma_server_serve(server_) : -ENOENT;
  }
  if (rc) {
    last_why_ = libd_last_error();  // before close(), whose calls may set another
    close();
  }
  return rc;
}

int ElementHost::start(const ElementHostOptions &opts, std::string *why) {
  if (!durl_safe(opts.unix_path) || !durl_safe(opts.tcp_host)) {
    *why = "the pool's socket path and address may not hold ',' or ';' (" + opts.unix_path + ", " + opts.tcp_host + ")";
    return -EINVAL;
  }
  std::string extra;
  if (opts.verbs != "auto" && opts.verbs != "off" && !verbs_pairs(opts.verbs, &extra, why)) return -EINVAL;
  bool want = opts.verbs != "off" && (opts.verbs != "auto" || libd_verbs_available());
  if (want) {
    int rc = open("verbs_server", extra, opts);
    if (rc == 0) {
      rdma_ = true;
      return 0;
    }
    if (opts.verbs != "auto") {
      *why = "cannot serve RDMA verbs: " + last_why_;
      return rc;
    }
    // A device that is listed but cannot be used: say so, go on without.
    std::cerr << "scad agent: RDMA device present but unusable, serving shm and tcp only: " << last_why_ << "\n";
  }
  if (int rc = open("tcp_server", "", opts)) {
    *why = last_why_;
    return rc;
  }
  return 0;
}

int ElementHost::add_element(const std::string &id, uint64_t size, bool prefetch, std::string *why) {
  int rc = libd_trdma_server_add_element(server_, id.c_str(), size);
  if (rc) {
    *why = libd_last_error();
    return rc;
  }
  // Only advice: an element whose pages could not be asked for still works, a page at a time.
  if (prefetch && libd_trdma_server_prefetch(server_, id.c_str()) != 0)
    std::cerr << "scad agent: element " << id << " serves without its pages had ahead: " << libd_last_error() << "\n";
  return 0;
}

void ElementHost::remove_element(const std::string &id) { libd_trdma_server_withdraw(server_, id.c_str()); }

int ElementHost::grant(const std::string &element, const std::string &client, unsigned rights, std::string *config,
                       std::string *grant_id, std::string *why) {
  libd_grant_spec spec = {};
  spec.element = element.c_str();
  spec.client = client.c_str();
  spec.rights = rights;
  // A configuration is an address, an id of up to 64 bytes and a secret of up to 256 hex digits.
  std::vector<char> out(4096);
  int n = libd_trdma_server_grant_ex(server_, &spec, out.data(), out.size());
  if (n < 0) {
    *why = libd_last_error();
    return n;
  }
  *config = std::string(out.data(), size_t(n));
  *grant_id = grant_id_of(*config);
  return 0;
}

int ElementHost::revoke(const std::string &grant_id, std::string *why) {
  int rc = libd_trdma_server_revoke(server_, grant_id.c_str());
  if (rc) *why = libd_last_error();
  return rc;
}

uint64_t ElementHost::used_bytes() const {
  libd_server_attr attr;
  return server_ && libd_trdma_server_query(server_, &attr) == 0 ? attr.used_bytes : 0;
}

std::string ElementHost::rdma_device() const {
  libd_server_attr attr;
  return rdma_ && libd_trdma_server_query(server_, &attr) == 0 ? std::string(attr.verbs_device) : "";
}

}  // namespace scad
