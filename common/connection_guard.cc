#include "connection_guard.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

namespace scad {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kScanInterval = std::chrono::milliseconds(200);
// A connection waiting this long for its request counts against its address's cap.
constexpr auto kStalledAfter = std::chrono::seconds(1);

// The numeric host the way cpp-httplib writes Request::remote_addr.
bool numeric_host(const sockaddr_storage &a, socklen_t len, std::string *host, int *port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr *>(&a), len, h, sizeof h, s, sizeof s,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  *host = h;
  *port = atoi(s);
  return true;
}

int local_port(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  if (getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0) return -1;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in *>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6 *>(&a)->sin6_port);
  return -1;
}

std::string key(const std::string &host, int port) { return host + ":" + std::to_string(port); }

bool parse_int(const std::string &s, int64_t lo, int64_t hi, int64_t *out) {
  if (s.empty() || s.size() > 18) return false;
  int64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace

bool widen_listen_backlog(int port) {
  bool widened = false;
  if (DIR *d = opendir("/proc/self/fd")) {
    while (dirent *e = readdir(d)) {
      char *end = nullptr;
      long fd = strtol(e->d_name, &end, 10);
      if (*end != '\0' || end == e->d_name || fd == dirfd(d)) continue;
      int accepting = 0;
      socklen_t len = sizeof accepting;
      if (getsockopt(int(fd), SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 && accepting &&
          local_port(int(fd)) == port)
        widened |= listen(int(fd), SOMAXCONN) == 0;  // listen() again only changes the backlog
    }
    closedir(d);
  }
  return widened;
}

bool parse_connection_limits(const std::string &text, ConnectionLimits *out, std::string *why) {
  ConnectionLimits l = *out;
  size_t at = 0;
  while (at <= text.size()) {
    size_t comma = text.find(',', at);
    std::string item = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    size_t eq = item.find('=');
    std::string name = item.substr(0, eq), value = eq == std::string::npos ? "" : item.substr(eq + 1);
    int64_t v = 0;
    if (name == "deadline" && parse_int(value, 100, 3600000, &v)) l.request_deadline_ms = v;
    else if (name == "per-client" && parse_int(value, 1, 100000, &v)) l.per_client = int(v);
    else if (name == "body-rate" && parse_int(value, 1024, int64_t(1) << 40, &v)) l.min_body_bytes_per_s = v;
    else {
      *why = "--connection-limits takes deadline=MS (100..3600000), per-client=N (1..100000), "
             "body-rate=BYTES_PER_S (at least 1024), separated by commas; not '" + item + "'";
      return false;
    }
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  *out = l;
  return true;
}

ConnectionGuard::ConnectionGuard(int port, ConnectionLimits limits)
    : port_(port), limits_(limits), watcher_([this] { watch(); }) {}

ConnectionGuard::~ConnectionGuard() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watcher_.join();
}

void ConnectionGuard::headers_read(const httplib::Request &req) {
  uint64_t body = 0;
  if (req.has_header("Content-Length")) body = strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10);
  bool chunked = req.get_header_value("Transfer-Encoding").find("chunked") != std::string::npos;
  std::lock_guard<std::mutex> lock(mu_);
  Conn &c = conns_[key(req.remote_addr, req.remote_port)];
  if (c.phase == Phase::ended) return;
  if (body == 0 && !chunked) {
    c.phase = Phase::handling;
    return;
  }
  // A chunked body's length is unknown: it is held to the largest body the server accepts. A
  // body on its way is timed but never counts as stalled (its sender is authenticated).
  c.phase = Phase::body;
  uint64_t bytes = chunked ? uint64_t(64) << 20 : std::min<uint64_t>(body, uint64_t(1) << 40);
  c.due = std::max(c.due, Clock::now() + std::chrono::milliseconds(limits_.request_deadline_ms)) +
          std::chrono::milliseconds(bytes * 1000 / uint64_t(limits_.min_body_bytes_per_s));
}

void ConnectionGuard::handling(const httplib::Request &req) {
  std::lock_guard<std::mutex> lock(mu_);
  Conn &c = conns_[key(req.remote_addr, req.remote_port)];
  if (c.phase != Phase::ended) c.phase = Phase::handling;
}

void ConnectionGuard::response_ready(const httplib::Request &req, httplib::Response &res) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find(key(req.remote_addr, req.remote_port));
  if (it == conns_.end()) return;
  if (it->second.phase == Phase::ended) {
    res.set_header("Connection", "close");
    return;
  }
  it->second.phase = Phase::reading;
  it->second.answered = true;
  it->second.reading_since = Clock::now();
  it->second.due = it->second.reading_since + std::chrono::milliseconds(limits_.request_deadline_ms);
}

ConnectionGuard::Counts ConnectionGuard::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

void ConnectionGuard::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, kScanInterval, [this] { return stopping_; })) {
    lock.unlock();
    scan();
    lock.lock();
  }
}

// Finds the connections to port_, learns the new ones, forgets the closed ones and ends those that
// are late or over their client's cap.
void ConnectionGuard::scan() {
  struct Found {
    int fd;  // a duplicate: the connection stays this one however the server's descriptor moves
    std::string peer, host;
    ino_t socket;
  };
  std::vector<Found> found;
  if (DIR *d = opendir("/proc/self/fd")) {
    int own = dirfd(d);
    while (dirent *e = readdir(d)) {
      char *end = nullptr;
      long fd = strtol(e->d_name, &end, 10);
      if (*end != '\0' || fd == own || end == e->d_name) continue;
      struct stat st;
      if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
      int dup = fcntl(int(fd), F_DUPFD_CLOEXEC, 0);
      if (dup < 0) continue;
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      std::string host;
      int port = 0;
      if (local_port(dup) == port_ && getpeername(dup, reinterpret_cast<sockaddr *>(&peer), &len) == 0 &&
          numeric_host(peer, len, &host, &port)) {
        found.push_back({dup, key(host, port), host, st.st_ino});
      } else {
        close(dup);
      }
    }
    closedir(d);
  }

  auto now = Clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto &[peer, c] : conns_) c.present = false;
  std::map<std::string, std::vector<std::pair<Clock::time_point, size_t>>> stalled_by_host;
  std::vector<size_t> reading;
  for (size_t i = 0; i < found.size(); i++) {
    auto [it, fresh] = conns_.try_emplace(found[i].peer);
    Conn &c = it->second;
    if (!fresh && c.socket != 0 && c.socket != found[i].socket) {
      c = Conn{};  // the earlier connection from that address and port has ended
      fresh = true;
    }
    if (fresh) c.due = now + std::chrono::milliseconds(limits_.request_deadline_ms);
    if (c.socket == 0) {  // new, or its headers arrived before this scan found it
      c.socket = found[i].socket;
      c.reading_since = now;
    }
    c.present = true;
    if (c.phase == Phase::ended) continue;
    if (c.phase == Phase::reading && now - c.reading_since >= kStalledAfter)
      stalled_by_host[found[i].host].push_back({c.reading_since, i});
    if (c.phase == Phase::reading || c.phase == Phase::body) reading.push_back(i);
  }
  for (auto it = conns_.begin(); it != conns_.end();) it = it->second.present ? std::next(it) : conns_.erase(it);

  for (auto &[host, stalled] : stalled_by_host) {
    std::sort(stalled.begin(), stalled.end(), [](auto &a, auto &b) { return a.first > b.first; });
    for (size_t k = 0; k + size_t(limits_.per_client) < stalled.size(); k++) {
      size_t i = stalled[k].second;
      counts_.over_cap++;
      end(found[i].fd, conns_[found[i].peer], 503,
          "too many stalled connections from " + host + " (at most " + std::to_string(limits_.per_client) + ")");
    }
  }
  for (size_t i : reading) {
    Conn &c = conns_[found[i].peer];
    if (c.phase != Phase::ended && now >= c.due) {
      counts_.timed_out++;
      end(found[i].fd, c, 408, "the request did not arrive within " + std::to_string(limits_.request_deadline_ms) + " ms");
    }
  }
  for (auto &f : found) close(f.fd);
}

// The connection is still reading its request, so the server writes nothing on it now: the guard
// answers (unless the connection is between requests, where an answer would be taken for the next
// request's; headers that have begun arriving there are not told apart) and shuts both directions; the server's thread reads the end of the stream and closes.
void ConnectionGuard::end(int fd, Conn &c, int status, const std::string &why) {
  bool between_requests = c.answered && c.phase == Phase::reading;
  c.phase = Phase::ended;
  if (between_requests) {
    shutdown(fd, SHUT_RDWR);
    return;
  }
  std::string body = "{\"error\":\"" + why + "\",\"code\":" + std::to_string(status) + "}";
  std::string reply = "HTTP/1.1 " + std::to_string(status) +
                      (status == 408 ? " Request Timeout" : " Service Unavailable") +
                      "\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body;
  send(fd, reply.data(), reply.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  shutdown(fd, SHUT_RDWR);
}

}  // namespace scad
