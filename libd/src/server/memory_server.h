// The memory element server: hosts memory elements (each a memfd of its own, zero-filled by the
// kernel and never reused for another owner) and serves them to grant holders over tcp (reads
// and writes on the wire) and over a unix socket (the memfd handed over with SCM_RIGHTS, read-only
// for read-only grants). One libuv loop serves every connection; no client can block another.
//
// An element can also be memory the caller lends (add_lent_element): served in place, never
// copied. Its unix-socket clients then reach it by cross-memory attach instead of a memfd.
// A grant may expire (ttl_ms): the loop revokes it then. A grant holder's NOTIFY (proto/frame.h)
// is queued for the owner, who waits for it with wait_notify(); a holder's connection that
// closes without one counts as a lost peer, so the owner's wait ends instead of hanging.
// A connection may be a session carrying many grants (proto/frame.h, "Shared connections").
// The server counts each grant's attachments under its lock, so revoking a grant or withdrawing
// memory nobody is attached to any more (the usual end: the holder said it finished and
// detached) takes no trip to the loop thread.
#pragma once
#include <rdma/rdma_cma.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <chrono>
#include <deque>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/params.h"
#include "proto/auth.h"
#include "io/ioloop.h"
#include "server/page_prefetcher.h"

namespace libd {

class VerbsServer;
class CmListener;
class ServerConn;
class TcpServerConn;

struct Element {
  std::string name;
  uint64_t size = 0;
  int memfd = -1;
  char *base = nullptr;  // one contiguous run (nullptr when lent as several ranges)
  bool lent = false;     // the caller's memory: never unmapped here
  // Set when the element is withdrawn: a prefetch of its pages (PagePrefetcher) stops there.
  std::shared_ptr<std::atomic<bool>> withdrawn = std::make_shared<std::atomic<bool>>(false);
  // Lent as several ranges (add_lent_ranges): their table, in order; the element's offsets run
  // through them (range i starts where range i-1 ends: starts[i]). Peers on this host read the
  // table itself from this process, so it never changes while the element lives.
  std::vector<proto::CmaRange> ranges;
  std::vector<uint64_t> starts;
  // What the loop is doing with its memory for tcp peers: READ answers batched or queued to be
  // sent from it, and a WRITE payload being received into it. A request counts itself here
  // before it looks at its grant (Grant::ended), and ending a grant sets that flag before it
  // reads this: when it reads 0, nothing moves the memory and no later request will, so the
  // owner's call need not wait for the loop (MemoryServer::revoke, remove_element).
  std::atomic<int> tcp_io{0};
  void io_begin() { tcp_io.fetch_add(1, std::memory_order_seq_cst); }
  void io_end() { tcp_io.fetch_sub(1, std::memory_order_release); }
  bool io_idle() const { return tcp_io.load(std::memory_order_seq_cst) == 0; }
  // Where the bytes [off, off+len) are in this process, or nullptr when they cross from one
  // range into the next (a transfer moves within one range; callers checked the bounds).
  char *at(uint64_t off, uint64_t len) const;
  ~Element();
};

struct Grant {
  std::string id;
  std::string secret;  // never logged
  std::string element;
  std::string client;  // the action id allowed to use it; "*" for any
  uint64_t offset = 0;
  uint64_t length = 0;
  unsigned rights = 0;
  uint64_t ttl_ms = 0;  // 0: until revoked; else the loop revokes it this long after grant()
  int64_t slot = -1;    // its slot in the grant table for peers on this host (proto::CmaSlot), or -1
  // Set when the grant ends (revoked, expired, withdrawn), shared with every attachment of it:
  // a request on one is refused from then on, before the loop has cut the attachment off.
  std::shared_ptr<std::atomic<bool>> ended;
  bool has_ended() const { return ended && ended->load(std::memory_order_seq_cst); }
};

// What a grant's owner learns from its holders.
struct Notice {
  uint64_t value = 0;
  int status = 0;  // 0: the holder finished; < 0: the errno it gave up with
};

class MemoryServer {
 public:
  MemoryServer();
  ~MemoryServer();

  // Elements. -EEXIST, -EINVAL, -ENOMEM (memfd/mmap), -ENOSPC (over capacity).
  int add_element(const std::string &name, uint64_t size);
  // Serves [base, base+size) of this process in place. The caller keeps it mapped until
  // remove_element(name) returns. -EEXIST, -EINVAL.
  int add_lent_element(const std::string &name, char *base, uint64_t size);
  // Serves several ranges of this process as one element (a grant then opens all of them and
  // nothing between them). Up to proto::kMaxLentRanges; each of size > 0. -EEXIST, -EINVAL.
  int add_lent_ranges(const std::string &name, const std::vector<proto::CmaRange> &ranges);
  int remove_element(const std::string &name);  // revokes its grants and closes their connections
  // Has the element's pages allocated, in the background (PagePrefetcher); returns at once.
  // -ENOENT no such element; -EOPNOTSUPP lent memory (its pages are the lender's).
  int prefetch_element(const std::string &name);
  void set_capacity(uint64_t bytes) { capacity_ = bytes; }
  // The server's thread polls for this long after each wake-up, and after the last bytes it moved,
  // before it sleeps (IoLoop).
  void set_busy_poll_us(uint32_t us) { loop_.set_busy_poll_us(us); }
  // The caller's thread runs the server's loop once and leases it (IoLoop::progress), and on while
  // a connection is part way through a transfer; 0 releases.
  int progress(uint32_t lease_us) {
    if (lease_us == 0) {
      loop_.release();
      return 0;
    }
    return loop_.progress(lease_us, [this] { return mid_transfer(); }) ? 1 : 0;
  }
  // Loop thread: whether a connection is part way through a transfer (ServerConn::mid_transfer).
  bool mid_transfer();
  uint64_t capacity() const { return capacity_; }
  uint64_t used_bytes();

  // Grants. If g->id / g->secret are empty they are generated. -ENOENT, -ERANGE, -EINVAL.
  int grant(Grant *g);
  int revoke(const std::string &grant_id);
  // Takes the oldest notice of a grant, waiting up to timeout_ms (< 0: forever). 0 and *out;
  // -ETIMEDOUT (the wait), -ECONNRESET (a holder's connection closed without a notice: the
  // holder died or gave up; reported once per such connection), -EKEYEXPIRED (the grant
  // expired), -ECANCELED (revoked or the server stopped while waiting), -ENOENT (no such grant).
  int wait_notify(const std::string &grant_id, Notice *out, int timeout_ms);
  // fd (an eventfd) is written whenever wait_notify on the grant would have something to say;
  // add=false stops that (under the lock: no write comes after it returns). -ENOENT no such grant.
  int watch_notify(const std::string &grant_id, int fd, bool add);

  int listen_tcp(const std::string &host, uint16_t port, uint16_t *bound);
  int listen_unix(const std::string &path);
  // Serves RDMA verbs clients on the tcp listener's connections too (their queue-pair records
  // travel on it): opens the device named by params (dev, port_num, gid_index, mw) or the one
  // discovered. -ENODEV with the reason when the host has none. Once both verbs and the tcp
  // listener are up, an rdma_cm listener on the tcp listener's address takes connection requests
  // with tickets handed out on the control connections (verbs/cm.h); cm,0 turns it off, and a
  // host where it cannot listen keeps the record exchange only (verbs_description says why).
  int enable_verbs(const Params &params);
  bool verbs_enabled() const { return verbs_ != nullptr; }
  std::string verbs_description();
  uint16_t cm_port();  // the rdma_cm listener's port, 0 if there is none
  std::string tcp_host() const { return tcp_host_; }
  uint16_t tcp_port() const { return tcp_port_; }
  std::string unix_path() const { return unix_path_; }
  // The client configuration for a grant: "host,H;port,P;path,S;grant,ID;secret,HEX".
  std::string client_config(const Grant &g) const;

  void stop();  // closes listeners and connections; elements stay until destruction
  // The grant table for peers on this host (made by listen_unix): a grant on a whole lent element
  // gets a slot there, and its id names it (proto::CmaSlot). Its slots, for tests.
  size_t cma_slots_used();
  size_t connections();
  // How many connections hold the grant right now (attachments counted under the lock): tests
  // and diagnostics.
  size_t holders(const std::string &grant_id);
  // How many revokes and withdrawals waited for the server's loop to let go of memory it was
  // moving for a tcp holder (or to close a holder's own connection): the others told the loop
  // and returned. Tests and diagnostics.
  uint64_t loop_waits() const { return loop_waits_.load(std::memory_order_relaxed); }

 private:
  // The connections (server_conn.h, loop thread only) and the verbs handshake they carry reach
  // the grants, the attachment counts and the verbs listener.
  friend class ServerConn;
  friend class UnixServerConn;
  friend class TcpServerConn;
  friend class VerbsHandshake;
  std::shared_ptr<Element> find_element(const std::string &name);
  bool find_grant(const std::string &id, Grant *out);
  // The loop records what the holders of a grant said (or that one vanished).
  void on_notice(const std::string &grant_id, const Notice &n);
  void end_notices_locked(const std::string &grant_id, int err);

  // Drops a grant's record; one still waited on stays, marked, until its last waiter leaves.
  void drop_notices_locked(const std::string &grant_id);

  // Attachments: a connection holds a grant (loop thread). take_attachment finds the grant and
  // its element again under mu_ and counts the attachment; release_attachment uncounts it and,
  // if the holder left without a word (`lost`), tells a waiting owner.
  int take_attachment(const Grant &g, bool is_unix, bool session, std::shared_ptr<Element> *element);
  void release_attachment(const std::string &grant_id, bool is_unix, bool session, bool lost);
  // Under mu_: grant id -> how many connections hold it, over tcp (the loop reads and writes the
  // memory for them) and over the unix socket (the peer moves the bytes itself: the loop never
  // touches the memory). `plain`: those of the tcp ones on a connection of their own (not a
  // session), which may carry a verbs queue pair: only closing it ends the remote key.
  struct Held {
    int tcp = 0, unix_ = 0, plain = 0;
  };
  std::unordered_map<std::string, Held> attached_;
  // How ending a grant reaches its holders: `sync` when the loop may be touching its memory for
  // one (the caller waits until it let go), else `async` (told, not waited for) when only peers
  // on this host hold it; `plain` when a tcp holder is on a connection of its own. A grant whose
  // `ended` is set and whose tcp holders are all on sessions needs no wait while its element is
  // idle (Element::io_idle): its holders' requests are refused from then on.
  void holders_locked(const std::string &grant_id, bool *sync, bool *async, bool *plain) const {
    auto it = attached_.find(grant_id);
    if (it == attached_.end()) return;
    *sync = *sync || it->second.tcp > 0;
    *async = *async || it->second.unix_ > 0;
    *plain = *plain || it->second.plain > 0;
  }
  // Ends the grants `pred` picks: waits for the loop if `sync`, else only asks it if `async`.
  void cut_holders(std::function<bool(const Grant &)> pred, int reason, bool sync, bool async);
  // Ends the grants `pred` picks on every connection (loop thread; reason for DETACHED).
  // `quiesce`: a connection still sending such a grant's memory closes (the caller waits for
  // the memory to be let go of); false when nothing moves it any more (Element::io_idle).
  void cut_locked_loop(const std::function<bool(const Grant &)> &pred, int reason, bool quiesce = true);
  // The same from any thread (waits for the loop).
  void cut(const std::function<bool(const Grant &)> &pred, int reason);
  std::atomic<uint64_t> loop_waits_{0};  // ends of grants that waited for the loop (loop_waits())

  struct Notices {
    std::deque<Notice> queue;
    int lost = 0;   // holders' connections closed without a notice, not yet reported
    int ended = 0;  // -EKEYEXPIRED / -ECANCELED once the grant is over
    int waiters = 0;
    bool dropped = false;  // revoked while waited on: erased by the last waiter
    std::vector<int> watchers;  // eventfds written on each of the above (watch_notify)
  };
  void wake_locked(Notices &n);  // the condition variable and every watcher
  std::unordered_map<std::string, Notices> notices_;  // under mu_, one per grant until revoked
  std::condition_variable notices_cv_;
  // Expiries: one timer on the loop for the earliest; the queue is under mu_, so granting and
  // revoking never wait for the loop (a grant posts a re-arm only if it expires first).
  using ExpiryQueue = std::multimap<std::chrono::steady_clock::time_point, std::string>;
  ExpiryQueue expiry_q_;                                        // under mu_
  std::unordered_map<std::string, ExpiryQueue::iterator> expiry_of_;  // under mu_
  std::chrono::steady_clock::time_point armed_for_ = std::chrono::steady_clock::time_point::max();  // under mu_
  uv_timer_t *expiry_timer_ = nullptr;  // loop thread
  void forget_expiry_locked(const std::string &grant_id);
  void arm_expiry();       // loop thread
  void on_expiry_timer();  // loop thread
  void start_cm();  // loop thread
  void on_cm_request(rdma_cm_id *id, const std::string &ticket);

  // The grant table (under mu_ for the owner's writes; peers read it by cross-memory attach).
  proto::CmaSlot *cma_table_ = nullptr;
  uint32_t cma_slots_ = 0;
  std::vector<uint32_t> cma_free_;
  // g null: clear it, saying why its grant ended (CmaSlot::ended: -EKEYEXPIRED, else nothing).
  void cma_write_locked(int64_t slot, const Grant *g, const Element *e, int ended = 0);
  // Erases a grant (and frees its slot, saying why: `reason`); false if none.
  bool drop_grant_locked(const std::string &id, int reason = -ECANCELED);
  void cma_describe(proto::GrantBody *body);      // the table's address and size, for a session's AUTH_OK

  std::unique_ptr<CmListener> cm_;  // loop thread; reset in stop() after every connection
  std::unordered_map<std::string, TcpServerConn *> cm_tickets_;  // loop thread: one-shot, per connection
  bool cm_wanted_ = true;
  std::string cm_status_;  // why there is no rdma_cm listener

  std::unique_ptr<VerbsServer> verbs_;  // outlives every connection (closed in stop())
  IoLoop loop_;
  PagePrefetcher prefetcher_;
  std::mutex mu_;
  // Hashed: an owner may lend thousands of buffers at once, and every grant, revocation and
  // attachment looks one up (with 50 000 grants a tree took 6 µs a grant and 3 a revocation).
  std::unordered_map<std::string, std::shared_ptr<Element>> elements_;
  uint64_t owned_bytes_ = 0;  // the sizes of the elements the server allocated (not lent ones)
  std::unordered_map<std::string, Grant> grants_;
  // The grants on each element, so that withdrawing one touches its own (an owner may have
  // thousands of operations lent at once, each an element and a grant).
  std::unordered_map<std::string, std::unordered_set<std::string>> element_grants_;
  uint64_t capacity_ = UINT64_MAX;
  std::set<ServerConn *> conns_;  // loop thread only
  std::atomic<size_t> nconns_{0};
  uv_tcp_t *tcp_listener_ = nullptr;
  uv_pipe_t *unix_listener_ = nullptr;
  std::string tcp_host_, unix_path_;
  uint16_t tcp_port_ = 0;
  // The tcp listener's congestion control before libd changed it (io/tcp_congestion.h): what a
  // connection between hosts gets back. Set before the loop accepts anything.
  std::string tcp_congestion_;
  bool stopped_ = false;
};

}  // namespace libd
