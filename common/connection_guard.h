// Keeps slow or greedy clients from holding an HTTP server's threads.
//
// cpp-httplib gives every connection a pool thread until the connection ends, and its timeouts
// apply to each read: a client that sends a header line every two seconds keeps a thread for as
// long as it likes, and forty such clients take every thread. The guard adds what the library
// lacks:
//   - a whole-request deadline: from the moment a connection is accepted (or answered its previous
//     request) the client has `request_deadline_ms` to deliver the headers, plus time for the body
//     at `min_body_bytes_per_s`. Time the server spends handling is not counted. A client that
//     misses it gets 408 and the connection ends;
//   - a cap on stalled connections per client address: of the connections from one address that
//     have been waiting for their request for more than a second (a client that means it sends its
//     request at once), the newest beyond `per_client` end: with 503 if they never carried a
//     request, silently if they are kept-alive connections between requests (a client reopens
//     those). Any number of requests from one address may be handled at once.
// The guard sees the server's connections from the side (it lists the process's sockets that are
// connected to the server's port; the library does not hand them out) and ends one with
// shutdown(2) on a duplicate of its descriptor, so the library's own thread finds the end of the
// stream and closes it. The server reports each request's progress: headers_read() from its
// pre-routing handler, handling() as a handler begins, response_ready() from its post-routing
// handler.
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include <sys/types.h>

namespace scad {

struct ConnectionLimits {
  int64_t request_deadline_ms = 30000;
  int64_t min_body_bytes_per_s = 1 << 20;
  int per_client = 16;
};

// cpp-httplib listens with a backlog of 5: a burst of clients beyond that has its connections
// dropped and retried by the kernel a second or more later. This raises the backlog of the
// process's listening socket on `port` to the system's maximum. False if none was found.
bool widen_listen_backlog(int port);

// "deadline=MS,per-client=N,body-rate=BYTES_PER_S" (any subset). False with *why on bad input.
bool parse_connection_limits(const std::string &text, ConnectionLimits *out, std::string *why);

class ConnectionGuard {
 public:
  ConnectionGuard(int port, ConnectionLimits limits);
  ~ConnectionGuard();
  ConnectionGuard(const ConnectionGuard &) = delete;
  ConnectionGuard &operator=(const ConnectionGuard &) = delete;

  // The headers are in: a request without a body is now handled (not timed); one with a body has
  // until the deadline plus its length at the minimum rate.
  void headers_read(const httplib::Request &req);
  // The whole request is in and its handler runs: no longer timed.
  void handling(const httplib::Request &req);
  // The response is about to be written: the next request's time starts now. A connection the
  // guard already ended is told so (Connection: close).
  void response_ready(const httplib::Request &req, httplib::Response &res);

  struct Counts {
    uint64_t timed_out = 0, over_cap = 0;
  };
  Counts counts() const;

 private:
  enum class Phase { reading, body, handling, ended };  // body: headers in, body coming
  struct Conn {
    std::chrono::steady_clock::time_point due;
    std::chrono::steady_clock::time_point reading_since;  // opened, or answered its last request
    bool answered = false;                                 // has carried a request
    Phase phase = Phase::reading;
    ino_t socket = 0;      // tells a connection from a later one that reuses its address and port
    bool present = false;  // found by the latest scan
  };
  void watch();
  void scan();
  void end(int fd, Conn &c, int status, const std::string &why);

  const int port_;
  const ConnectionLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, Conn> conns_;  // by the peer's "address:port"
  Counts counts_;
  std::thread watcher_;
};

}  // namespace scad
