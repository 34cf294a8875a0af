// rdma_shm (shm): same-host, zero-copy access to a memory element. The handshake runs over the
// element's unix socket (the same authenticated CHALLENGE/AUTH as tcp); the server then passes
// the element's memfd with SCM_RIGHTS — read-only for read-only grants — and the client maps it.
// Reads and writes are bounds-checked memcpy. The socket stays open as a liveness channel: when
// the server goes away or revokes the grant, the shared loop sees it and the transport moves to
// ERROR. Config keys: path, grant, secret; optional timeout_ms.
// Memory an owner lent from its own heap (MemoryServer::add_lent_element) has no memfd: AUTH_OK
// then names the owner's process and address, and transfers are cross-memory attach
// (process_vm_readv/writev, as NIXL's shared-memory path), still one system call per transfer
// and no socket round trip. The kernel lets a process attach only where it could ptrace it
// (same user; Yama may narrow it): the grant's bounds and rights are this library's checks.
// NOTIFY (the holder finished) goes to the owner on the unix socket.
// With share,1 (lent memory only) every transport of the process that reaches the same socket
// rides one connection, a session (proto/frame.h): the first opens it with its grant, the next
// attach theirs in one round trip (ATTACH / ATTACH_OK with the owner's process and the memory's
// address) instead of a connection, a handshake and a watch each. The owner ending a grant
// (revoke, expiry, withdraw) says so on the socket (DETACHED): that transport alone goes to
// ERROR, as a closed socket moves a transport of its own. The session's socket is watched on the
// shared loop, which reads what the server sends on it.
#include <openssl/crypto.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/transport.h"
#include "io/ioloop.h"
#include "io/sockio.h"
#include "proto/auth.h"
#include "proto/client_handshake.h"
#include "proto/frame.h"
#include "transports/session_registry.h"

namespace libd {
namespace {

using namespace proto;

// Watches the unix socket on the shared loop; flips `alive` when the server hangs up.
struct Watch {
  uv_poll_t poll;
  std::shared_ptr<std::atomic<bool>> alive;
  std::function<void()> on_gone;
};

// Connects to the element's unix socket and runs the handshake before the deadline: 0 with *fd,
// *grant and (when the server passed one) *memfd, or a negative errno with the reason set.
int shm_handshake(const std::string &path, const std::string &grant_id, const std::string &secret,
                  const std::string &aid, uint64_t flags, Deadline deadline, int *out_fd, GrantBody *g, int *out_memfd,
                  std::string *nonce_out) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return set_error(-errno, std::string("socket: ") + strerror(errno));
  int memfd = -1;
  auto fail = [&](int rc, const std::string &why) {
    ::close(fd);
    if (memfd >= 0) ::close(memfd);
    return set_error(rc, why);
  };
  struct sockaddr_un sa = {};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0 && errno != EINPROGRESS)
    return fail(-errno, "cannot connect to the memory element at '" + path + "': " + strerror(errno));
  char hdr[kHeaderSize];
  Header h;
  std::string why;
  auto io_error = [&](int rc) {
    return fail(rc, "handshake with the memory element at '" + path + "' failed: " +
                        (rc == -ETIMEDOUT ? std::string("no answer in time") : std::string(strerror(-rc))));
  };
  if (int rc = recv_exact(fd, hdr, kHeaderSize, deadline, nullptr)) return io_error(rc);
  if (decode_header(hdr, &h, &why) || h.opcode != kChallenge || h.size != kNonceSize)
    return fail(-EPROTO, "the memory element sent no valid challenge: " + why);
  std::string nonce(kNonceSize, '\0');
  if (int rc = recv_exact(fd, nonce.data(), kNonceSize, deadline, nullptr)) return io_error(rc);
  std::string body = encode_auth({grant_id, aid, compute_mac(secret, nonce, grant_id, aid)});
  Header ah;
  ah.opcode = kAuth;
  ah.addr = flags;
  ah.size = body.size();
  char ahdr[kHeaderSize];
  encode_header(ah, ahdr);
  std::string msg = std::string(ahdr, kHeaderSize) + body;
  if (int rc = send_all(fd, msg.data(), msg.size(), deadline)) return io_error(rc);
  if (int rc = recv_exact(fd, hdr, kHeaderSize, deadline, &memfd)) return io_error(rc);
  if (decode_header(hdr, &h, &why) || h.opcode != kAuthOk)
    return fail(-EPROTO, "the memory element sent no valid answer: " + why);
  if (h.status != 0) return fail(h.status, refusal_reason(h.status));
  std::string gbody(size_t(payload_length(h)), '\0');
  if (int rc = recv_exact(fd, gbody.data(), gbody.size(), deadline, memfd >= 0 ? nullptr : &memfd)) return io_error(rc);
  if (decode_grant(gbody.data(), gbody.size(), g, &why)) return fail(-EPROTO, why);
  *out_fd = fd;
  *out_memfd = memfd;
  if (nonce_out) *nonce_out = nonce;
  return 0;
}

// A shared connection to one memory server's unix socket (see the top of this file).
class ShmSession : public FrameReader::Handler, public std::enable_shared_from_this<ShmSession> {
 public:
  using FailFn = std::function<void(int, const std::string &)>;
  using Alive = std::shared_ptr<std::atomic<bool>>;

  ~ShmSession() override {
    if (fd_ >= 0) ::close(fd_);
  }

  // Opens a session with `creds`' grant as handle 0 (lent memory only: *grant names the owner's
  // process and the memory's address).
  static int open(const std::string &path, const std::string &grant_id, const std::string &secret,
                  const std::string &aid, Deadline deadline, std::shared_ptr<ShmSession> *out, GrantBody *grant) {
    int fd, memfd;
    std::string nonce;
    if (int rc = shm_handshake(path, grant_id, secret, aid, kAuthSession, deadline, &fd, grant, &memfd, &nonce))
      return rc;
    if (memfd >= 0 || !grant->cma_pid) {  // a server that says "session" grants lent memory only
      if (memfd >= 0) ::close(memfd);
      ::close(fd);
      return set_error(-EPROTO, "the memory element answered a shared connection with a memory descriptor");
    }
    std::shared_ptr<ShmSession> s(new ShmSession());
    s->fd_ = fd;
    s->nonce_ = std::move(nonce);
    s->pid_ = pid_t(grant->cma_pid);
    s->table_ = grant->cma_table;
    s->slots_ = grant->cma_slots;
    s->start_watch();
    *out = std::move(s);
    return 0;
  }

  bool closed() const { return closed_flag_.load(std::memory_order_acquire); }
  // Every handle it can name is used (they are never reused): it serves its attachments to the
  // end, and the next transport opens a new session.
  bool spent() const { return spent_flag_.load(std::memory_order_acquire); }

  // The holder of handle `h` (0: the opener): told when its grant ends; `alive` flips to false then.
  Alive add_user(uint32_t h, FailFn fn) {
    std::lock_guard<std::mutex> lk(mu_);
    auto alive = std::make_shared<std::atomic<bool>>(!closed_);
    users_[h] = User{std::move(fn), alive};
    return alive;
  }

  int attach(const std::string &grant_id, const std::string &secret, const std::string &aid, Deadline deadline,
             FailFn fn, uint32_t *handle, GrantBody *grant, Alive *alive) {
    std::unique_lock<std::mutex> lk(mu_);
    if (closed_) return set_error(-ENOTCONN, "the connection to the memory element is closed (" + close_why_ + ")");
    if (!handles_left_locked()) return set_error(-ENOTCONN, "the shared connection has used all its handles");
    uint32_t h = next_handle_++;
    Attaching &a = attaches_[h];
    std::string frame = encode_attach(h, {grant_id, secret, aid}, nonce_);
    lk.unlock();
    int rc;
    {
      std::lock_guard<std::mutex> sl(send_mu_);
      rc = send_all(fd_, frame.data(), frame.size(), deadline);
    }
    lk.lock();
    if (rc) {
      attaches_.erase(h);
      fail_locked(-ECONNRESET, std::string("cannot reach the memory element: ") + strerror(-rc));
      return set_error(-ECONNRESET, "cannot reach the memory element: " + std::string(strerror(-rc)));
    }
    // The loop's watch reads the answer.
    if (!cv_.wait_until(lk, deadline.at(), [&] { return a.done || closed_; })) {
      // This attachment alone is given up (the session serves others, whose transfers never wait
      // for the server): its answer, when it comes, is dropped, and the DETACH behind it lets go
      // of whatever it opened (the server takes frames in order and ignores a refused handle).
      attaches_.erase(h);
      abandoned_.insert(h);
      lk.unlock();
      send_detach(h);
      return set_error(-ETIMEDOUT, "no answer to ATTACH from the memory element within the deadline");
    }
    Attaching got = std::move(a);
    attaches_.erase(h);
    if (got.done && got.status == -EMFILE) spent_flag_.store(true, std::memory_order_release);  // full: a new session
    if (!got.done) return set_error(-ECONNRESET, "the connection to the memory element closed (" + close_why_ + ")");
    if (got.status != 0) return set_error(got.status, refusal_reason(got.status));
    std::string why;
    if (decode_grant(got.body.data(), got.body.size(), grant, &why) || !grant->cma_pid) {
      fail_locked(-EPROTO, "protocol error from the memory element: " + (why.empty() ? "no cross-memory grant" : why));
      return set_error(-EPROTO, "the memory element answered ATTACH with no usable grant");
    }
    auto al = std::make_shared<std::atomic<bool>>(true);
    users_[h] = User{std::move(fn), al};
    *handle = h;
    *alive = al;
    return 0;
  }

  // Attaches a grant with a slot in the owner's grant table without a round trip (proto::CmaSlot):
  // 0 with the grant, the slot's address and its seq (which the transport checks before each
  // transfer); -EAGAIN when the table cannot vouch for it (no table, not a slotted id, a slot
  // that is free, changing or not this grant's): the caller asks the server, whose answer is
  // final. The server still hears of the attachment (ATTACH, not waited for), so the holder's
  // word and its leaving reach the owner as for any other; a refusal there ends it.
  //
  // announce false (announce,0): the ATTACH is not sent now but with the holder's word (NOTIFY),
  // and not at all if it leaves without one: nothing wakes the owner's server for a holder whose
  // owner waits for no word (the slot, checked before each transfer, still cuts it off). The
  // price: a holder that dies before its word is not reported lost.
  // The grant's slot in the owner's table, if the table vouches for it now (live, stable, tagged
  // with the grant's secret): 0 with the slot and its address, else -EAGAIN.
  int vouched_slot(const std::string &grant_id, const std::string &secret, const std::string &aid, CmaSlot *out,
                   uint64_t *slot_addr) {
    if (!table_) return -EAGAIN;
    int64_t slot = cma_slot_of(grant_id);
    if (slot < 0 || slot >= int64_t(slots_)) return -EAGAIN;
    uint64_t addr = table_ + uint64_t(slot) * sizeof(CmaSlot);
    CmaSlot &c = *out;
    uint64_t again = 0;
    // The slot, then its seq once more, in one system call (the kernel copies in order): a seq
    // that changed in between is a slot being rewritten while it was read.
    struct iovec l[2] = {{&c, sizeof c}, {&again, sizeof again}};
    struct iovec r[2] = {{reinterpret_cast<void *>(uintptr_t(addr)), sizeof c},
                         {reinterpret_cast<void *>(uintptr_t(addr)), sizeof again}};
    if (process_vm_readv(pid_, l, 2, r, 2, 0) != ssize_t(sizeof c + sizeof again) || (c.seq & 1) || !c.live ||
        again != c.seq || c.rights == 0 || c.rights > 3)
      return -EAGAIN;
    // The grant is for anyone holding it ("*"), or for this action alone (its tag is made only
    // when the first does not match).
    auto matches = [&](const std::string &tag) {
      return tag.size() == sizeof c.tag && CRYPTO_memcmp(tag.data(), c.tag, sizeof c.tag) == 0;
    };
    bool ranges = c.ranges != 0;
    if (!matches(cma_tag(secret, grant_id, "*", ranges)) && !matches(cma_tag(secret, grant_id, aid, ranges)))
      return -EAGAIN;
    *slot_addr = addr;
    return 0;
  }

  int attach_local(const std::string &grant_id, const std::string &secret, const std::string &aid, FailFn fn,
                   uint32_t *handle, GrantBody *grant, Alive *alive, uint64_t *slot_addr, uint64_t *slot_seq,
                   bool announce = true) {
    CmaSlot c;
    uint64_t addr = 0;
    if (vouched_slot(grant_id, secret, aid, &c, &addr)) return -EAGAIN;
    std::unique_lock<std::mutex> lk(mu_);
    if (closed_ || !handles_left_locked()) return -EAGAIN;
    uint32_t h = next_handle_++;
    auto al = std::make_shared<std::atomic<bool>>(true);
    users_[h] = User{std::move(fn), al};
    int rc = 0;
    if (announce) {
      // Quiet: only a refusal is answered (as DETACHED would be: the watch ends the attachment).
      std::string frame = encode_attach(h, {grant_id, secret, aid}, nonce_, true);
      lk.unlock();
      std::lock_guard<std::mutex> sl(send_mu_);
      rc = send_all(fd_, frame.data(), frame.size(), Deadline::after_ms(1000));
    } else {
      unannounced_[h] = Credentials{grant_id, secret, aid};
      lk.unlock();
    }
    if (rc) {
      lk.lock();
      users_.erase(h);
      attaches_.erase(h);
      fail_locked(-ECONNRESET, std::string("cannot reach the memory element: ") + strerror(-rc));
      return -EAGAIN;
    }
    *grant = GrantBody{c.length, 0, c.length, c.rights};
    grant->cma_pid = uint32_t(pid_);
    grant->cma_base = c.base;
    grant->cma_ranges = c.ranges;
    *handle = h;
    *alive = std::move(al);
    *slot_addr = addr;
    *slot_seq = c.seq;
    return 0;
  }

  // Lets an attachment go (no answer). Nothing of it runs any more: shm copies complete inline.
  void detach(uint32_t h) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = users_.find(h);
      if (it == users_.end() || closed_) {  // the owner ended it already, or there is no owner
        if (it != users_.end()) users_.erase(it);
        return;
      }
      it->second.alive->store(false);
      users_.erase(it);
      if (unannounced_.erase(h)) return;  // the server never heard of it: nothing to let go of
    }
    send_detach(h);
  }

  void send_detach(uint32_t h) {
    Header d;
    d.opcode = kDetach;
    d.addr = h;
    char hdr[kHeaderSize];
    encode_header(d, hdr);
    std::lock_guard<std::mutex> sl(send_mu_);
    send_all(fd_, hdr, kHeaderSize, Deadline::after_ms(1000));  // a failure is the watch's to see
  }

  // detach: and the DETACH of h in the same write (the holder is done with the grant).
  // An attachment not announced yet (attach_local, announce false) is announced first, in the same
  // write: the word must reach the owner as any holder's does.
  int notify(uint32_t h, uint64_t value, int status, Deadline deadline, bool detach = false) {
    std::string frames;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto un = unannounced_.find(h);
      if (un != unannounced_.end()) {
        frames = encode_attach(h, un->second, nonce_, true);
        unannounced_.erase(un);
      }
      if (detach) {
        auto it = users_.find(h);
        if (it != users_.end()) {
          it->second.alive->store(false);
          users_.erase(it);
        }
      }
    }
    char hdr[kHeaderSize];
    encode_notify(value, status, hdr, h);
    frames.append(hdr, kHeaderSize);
    if (detach) {
      Header d;
      d.opcode = kDetach;
      d.addr = h;
      encode_header(d, hdr);
      frames.append(hdr, kHeaderSize);
    }
    std::lock_guard<std::mutex> sl(send_mu_);  // one frame at a time on the socket
    if (int rc = send_all(fd_, frames.data(), frames.size(), deadline))
      return set_error(rc == -ETIMEDOUT ? rc : -ECONNRESET, "cannot tell the memory's owner: " + std::string(strerror(-rc)));
    return 0;
  }

  void set_on_dead(std::function<void()> fn) {
    std::lock_guard<std::mutex> lk(mu_);
    on_dead_ = std::move(fn);
    if (closed_ && on_dead_) IoLoop::shared().post(on_dead_);
  }

  // ---- FrameReader::Handler (the loop thread, under mu_) ----
  int on_header(const Header &h, char **dest) override {
    if (h.opcode == kAttachOk) {
      if (h.addr == 0 || h.addr >= next_handle_) return -EPROTO;
      if (abandoned_.erase(uint32_t(h.addr))) return 0;  // its attach gave up waiting: dropped
      auto it = attaches_.find(uint32_t(h.addr));
      if (it == attaches_.end()) return h.status != 0 && h.size == 0 ? 0 : -EPROTO;  // a quiet ATTACH refused
      if (it->second.done) return -EPROTO;
      it->second.body.assign(size_t(payload_length(h)), '\0');
      *dest = it->second.body.data();
      return 0;
    }
    if (h.opcode == kDetached) return h.addr <= UINT32_MAX && h.size == 0 ? 0 : -EPROTO;
    return -EPROTO;  // nothing else comes from a server after AUTH_OK
  }

  int on_frame(const Header &h) override {
    if (h.opcode == kAttachOk) {
      auto at = attaches_.find(uint32_t(h.addr));
      if (at != attaches_.end()) {
        at->second.done = true;
        at->second.status = h.status;
        cv_.notify_all();
        return 0;
      }
      // A quiet ATTACH refused: the grant ended between the table's word and the server's, as if
      // it ended after.
    }
    auto it = users_.find(uint32_t(h.addr));  // DETACHED, or a refused ATTACH the table vouched for
    if (it == users_.end()) return 0;
    User u = std::move(it->second);
    users_.erase(it);
    u.alive->store(false, std::memory_order_release);
    if (u.fn)
      u.fn(-ECONNRESET, h.status == -EKEYEXPIRED ? "the memory's owner let this grant expire"
                                                  : "the memory's owner ended this grant (revoked, or the memory withdrawn)");
    return 0;
  }

 private:
  struct User {
    FailFn fn;
    Alive alive;
  };
  std::unordered_map<uint32_t, Credentials> unannounced_;  // attach_local without announce: not sent yet
  std::unordered_set<uint32_t> abandoned_;  // ATTACHes whose caller stopped waiting: their answers are dropped
  struct Attaching {
    bool done = false;
    int status = 0;
    std::string body;
  };

  ShmSession() : reader_(this) {}

  void start_watch() {
    holder_ = new std::shared_ptr<ShmSession>(shared_from_this());  // the watch keeps the session alive
    IoLoop::shared().run_sync([&] {
      poll_ = new uv_poll_t;
      uv_poll_init(IoLoop::shared().loop(), poll_, fd_);
      poll_->data = this;
      uv_poll_start(poll_, UV_READABLE | UV_DISCONNECT, [](uv_poll_t *ph, int status, int events) {
        static_cast<ShmSession *>(ph->data)->on_poll(status, events);
      });
    });
  }

  void on_poll(int status, int events) {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    if (status < 0) {
      fail_locked(-ECONNRESET, "the memory element closed the connection");
      return;
    }
    while (!closed_) {
      ssize_t n = recv(fd_, staging_, sizeof staging_, MSG_DONTWAIT);
      if (n == 0) {
        fail_locked(-ECONNRESET, "the memory element closed the connection (server gone)");
        return;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN) fail_locked(-ECONNRESET, std::string("lost the memory element: ") + strerror(errno));
        break;
      }
      std::string why;
      if (reader_.feed(staging_, size_t(n), &why)) {
        fail_locked(-EPROTO, "protocol error from the memory element: " + why);
        return;
      }
      if (size_t(n) < sizeof staging_) break;
    }
    if (!closed_ && (events & UV_DISCONNECT)) fail_locked(-ECONNRESET, "the memory element closed the connection (server gone)");
  }

  // The connection is over: every holder hears it, the watch stops (on the loop).
  void fail_locked(int err, const std::string &why) {
    if (closed_) return;
    closed_ = true;
    closed_flag_.store(true, std::memory_order_release);
    close_why_ = why;
    ::shutdown(fd_, SHUT_RDWR);
    for (auto &[h, u] : users_) {
      u.alive->store(false, std::memory_order_release);
      if (u.fn) u.fn(err, why);
    }
    users_.clear();
    unannounced_.clear();
    cv_.notify_all();
    if (on_dead_) IoLoop::shared().post(on_dead_);
    auto *holder = holder_;
    holder_ = nullptr;
    uv_poll_t *p = poll_;
    poll_ = nullptr;
    IoLoop::shared().post([p, holder] {
      if (!p) { delete holder; return; }
      p->data = holder;
      uv_close(reinterpret_cast<uv_handle_t *>(p), [](uv_handle_t *h) {
        delete static_cast<std::shared_ptr<ShmSession> *>(h->data);
        delete reinterpret_cast<uv_poll_t *>(h);
      });
    });
  }

  int fd_ = -1;
  std::string nonce_;
  pid_t pid_ = 0;         // the owner's process
  uint64_t table_ = 0;    // its grant table, if it has one
  uint32_t slots_ = 0;
  std::mutex mu_;
  std::mutex send_mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::atomic<bool> closed_flag_{false};
  std::atomic<bool> spent_flag_{false};
  bool handles_left_locked() {  // false (and spent) once the handles ran out
    if (next_handle_ < UINT32_MAX) return true;
    spent_flag_.store(true, std::memory_order_release);
    return false;
  }
  std::string close_why_;
  uint32_t next_handle_ = 1;
  std::unordered_map<uint32_t, User> users_;
  std::unordered_map<uint32_t, Attaching> attaches_;
  std::function<void()> on_dead_;
  FrameReader reader_;
  char staging_[4096];
  uv_poll_t *poll_ = nullptr;                        // loop thread (after start_watch)
  std::shared_ptr<ShmSession> *holder_ = nullptr;   // the watch's reference
};

using ShmSessions = SessionRegistry<ShmSession>;

class ShmTransport : public Transport {
 protected:
  bool configured() const override {
    return params_.has("path") && params_.has("grant") && params_.has("secret");
  }

  int do_init() override {
    if (!configured()) return set_error(-EINVAL, "needs path, grant and secret");
    if (params_.get_or("path", "").size() >= sizeof(sockaddr_un::sun_path))
      return set_error(-EINVAL, "parameter 'path' is too long for a unix socket");
    std::string share = params_.get_or("share", "0");
    if (share != "0" && share != "1") return set_error(-EINVAL, "parameter 'share' must be 0 or 1");
    std::string announce = params_.get_or("announce", "1");
    if (announce != "0" && announce != "1") return set_error(-EINVAL, "parameter 'announce' must be 0 or 1");
    return 0;
  }

  // share,1: attach this transport's grant to the process's session with the server.
  int connect_shared(Deadline deadline) {
    std::string path = params_.get_or("path", "");
    std::string grant_id = params_.get_or("grant", ""), secret = params_.get_or("secret", "");
    GrantBody g;
    auto on_fail = [this](int err, const std::string &why) { fail(err, why); };
    for (int tries = 0; tries < 2; tries++) {
      auto session = ShmSessions::get().find(path);
      if (!session) break;
      ShmSession::Alive alive;
      if (session->attach_local(grant_id, secret, aid(), on_fail, &handle_, &g, &alive, &slot_addr_, &slot_seq_,
                                params_.get_or("announce", "1") == "1") == 0) {
        session_ = std::move(session);
        alive_ = std::move(alive);
        return adopt_cma(g, false);
      }
      int rc = session->attach(grant_id, secret, aid(), deadline, on_fail, &handle_, &g, &alive);
      if (rc == 0) {
        session_ = std::move(session);
        alive_ = std::move(alive);
        follow_slot(grant_id, secret);
        return adopt_cma(g, false);
      }
      if (!session->closed() && !session->spent()) return rc;
    }
    std::shared_ptr<ShmSession> session;
    if (int rc = ShmSession::open(path, grant_id, secret, aid(), deadline, &session, &g)) return rc;
    handle_ = 0;
    alive_ = session->add_user(0, on_fail);
    session_ = session;
    ShmSessions::get().put(path, session);
    follow_slot(grant_id, secret);
    return adopt_cma(g, true);
  }

  // A grant the server admitted (AUTH, ATTACH) that has a slot in the owner's table: every
  // transfer checks the slot too, as for one the table vouched for. The owner rewrites a slot as it
  // ends the grant, before it returns; its DETACHED on the socket, which the loop reads, may come
  // after this process's next transfer. (If the table does not vouch for it now, the grant
  // ended already, or its slot is another's: DETACHED is on its way.)
  void follow_slot(const std::string &grant_id, const std::string &secret) {
    CmaSlot c;
    uint64_t addr = 0;
    if (session_->vouched_slot(grant_id, secret, aid(), &c, &addr) == 0) {
      slot_addr_ = addr;
      slot_seq_ = c.seq;
    }
  }

  // The owner's process and where its lent memory is (for several ranges, their table, read from
  // there once: it never changes while the element lives); then the grant.
  int adopt_cma(const GrantBody &g, bool probe) {
    cma_pid_ = pid_t(g.cma_pid);
    cma_base_ = g.cma_base;
    ranges_.clear();
    starts_.clear();
    if (g.cma_ranges) {
      // The table comes from the owner's process: a holder checks all of it before it trusts
      // any (a count past the bound, a range of no bytes or no address, sizes that do not add up
      // to the grant are refused).
      auto bogus = [&](int e, const std::string &why) {
        ranges_.clear();
        starts_.clear();
        return e ? cma_error(e) : set_error(-EPROTO, "the memory's owner describes its lent ranges wrongly: " + why);
      };
      if (g.cma_ranges > kMaxLentRanges || g.cma_base > UINT64_MAX - uint64_t(g.cma_ranges) * sizeof(CmaRange))
        return bogus(0, "a table of " + std::to_string(g.cma_ranges) + " ranges");
      if (g.offset != 0 || g.length != g.element_size) return bogus(0, "a grant on part of them");
      ranges_.resize(g.cma_ranges);
      struct iovec l = {ranges_.data(), ranges_.size() * sizeof(CmaRange)};
      struct iovec r = {reinterpret_cast<void *>(uintptr_t(g.cma_base)), l.iov_len};
      ssize_t n = process_vm_readv(cma_pid_, &l, 1, &r, 1, 0);
      if (n != ssize_t(l.iov_len)) return bogus(n < 0 ? errno : EFAULT, "");
      uint64_t total = 0;
      for (const CmaRange &x : ranges_) {
        if (x.base == 0 || x.size == 0 || x.base > UINT64_MAX - x.size || total > UINT64_MAX - x.size)
          return bogus(0, "a range of no bytes, or past the end of memory");
        starts_.push_back(total);
        total += x.size;
      }
      if (total != g.element_size) return bogus(0, "they do not add up to the grant");
    }
    if (probe)
      if (int rc = probe_cma(g)) return rc;
    set_remote(g.offset, g.length, g.rights);
    return 0;
  }

  // Where the owner's bytes [raddr, raddr+size) are, or 0 when they cross from one lent range
  // into the next (a transfer moves within one range).
  uint64_t owner_addr(uint64_t raddr, uint64_t size) const {
    if (ranges_.empty()) return cma_base_ + raddr;
    size_t i = size_t(std::upper_bound(starts_.begin(), starts_.end(), raddr) - starts_.begin()) - 1;
    uint64_t in = raddr - starts_[i];
    return size <= ranges_[i].size - in ? ranges_[i].base + in : 0;
  }

  int do_connect(Deadline deadline) override {
    shared_ = params_.get_or("share", "0") == "1";
    if (shared_) return connect_shared(deadline);
    int fd, memfd;
    GrantBody g;
    if (int rc = shm_handshake(params_.get_or("path", ""), params_.get_or("grant", ""), params_.get_or("secret", ""), aid(),
                               0, deadline, &fd, &g, &memfd, nullptr))
      return rc;
    sock_ = fd;
    if (memfd < 0 && g.cma_pid) {
      if (int rc = adopt_cma(g, true)) return rc;
      start_watch(fd);
      return 0;
    }
    if (memfd < 0) return set_error(-EPROTO, "the memory element sent no memory descriptor");
    int prot = PROT_READ | ((g.rights & LIBD_RIGHT_WRITE) ? PROT_WRITE : 0);
    void *p = mmap(nullptr, g.element_size, prot, MAP_SHARED, memfd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(memfd);
      return set_error(-e, std::string("cannot map the memory element: ") + strerror(e));
    }
    // Kept for large writes into pages the element does not have yet (write_segment); a
    // read-only grant's descriptor is read-only and is not kept.
    if (g.rights & LIBD_RIGHT_WRITE) {
      memfd_ = memfd;
    } else {
      ::close(memfd);
    }
    map_ = static_cast<char *>(p);
    map_size_ = g.element_size;
    if (memfd_ >= 0) written_ = std::vector<std::atomic<uint64_t>>(size_t(((g.element_size >> kPartShift) >> 6) + 1));
    set_remote(g.offset, g.length, g.rights);
    start_watch(fd);
    return 0;
  }

  // Attaching needs the kernel's leave: find out now, with a clear message, not at the first
  // transfer. A zero-length call checks nothing, so read one byte the grant allows (or, for a
  // write-only grant, write nothing and let the first transfer say it).
  int probe_cma(const GrantBody &g) {
    if (!(g.rights & LIBD_RIGHT_READ) || g.length == 0) return 0;
    char b;
    struct iovec l = {&b, 1}, r = {reinterpret_cast<void *>(uintptr_t(owner_addr(g.offset, 1))), 1};
    if (process_vm_readv(cma_pid_, &l, 1, &r, 1, 0) == 1) return 0;
    return cma_error(errno);
  }

  int cma_error(int e) {
    if (e == EPERM || e == EACCES)
      return set_error(-EACCES, "the kernel does not let this process attach to the memory's owner (pid " +
                                    std::to_string(cma_pid_) + "): cross-memory attach needs the same user and ptrace leave (Yama ptrace_scope)");
    if (e == ESRCH) return set_error(-ECONNRESET, "the memory's owner (pid " + std::to_string(cma_pid_) + ") is gone");
    if (e == EFAULT) return set_error(-ECONNRESET, "the memory's owner no longer maps the lent memory (withdrawn)");
    return set_error(-e, std::string("cross-memory attach: ") + strerror(e));
  }

  // A grant attached from the owner's table: its slot must still be the one checked then (one
  // 8-byte read of the owner's memory).
  bool slot_unchanged() {
    uint64_t seq = 0;
    struct iovec l = {&seq, sizeof seq}, r = {reinterpret_cast<void *>(uintptr_t(slot_addr_)), sizeof seq};
    return process_vm_readv(cma_pid_, &l, 1, &r, 1, 0) == ssize_t(sizeof seq) && seq == slot_seq_;
  }

  // Why the slot changed, for the error: the owner let the grant expire (the slot says so until
  // it is given to another grant), or `otherwise`.
  const char *slot_end_reason(const char *otherwise) {
    CmaSlot c;
    struct iovec l = {&c, sizeof c}, r = {reinterpret_cast<void *>(uintptr_t(slot_addr_)), sizeof c};
    if (process_vm_readv(cma_pid_, &l, 1, &r, 1, 0) != ssize_t(sizeof c)) return otherwise;
    bool stable = c.seq % 2 == 0 && c.seq == slot_seq_ + 2;  // one change since: this grant's end
    return stable && !c.live && c.ended == -EKEYEXPIRED ? "the memory's owner let this grant expire" : otherwise;
  }

  // A read of one segment from a grant attached from the owner's table, in one system call: the
  // slot's seq, the bytes, the seq again (the kernel copies in that order). True when all of it
  // moved and the slot stayed as checked at attach; otherwise the caller takes the careful path
  // (a read can be made again), which says what went wrong.
  bool checked_cma_read(const Segment &s) {
    uint64_t before = 0, after = 0;
    void *slot = reinterpret_cast<void *>(uintptr_t(slot_addr_));
    struct iovec l[3] = {{&before, sizeof before}, {s.buf, size_t(s.size)}, {&after, sizeof after}};
    struct iovec r[3] = {{slot, sizeof before},
                         {reinterpret_cast<void *>(uintptr_t(owner_addr(s.raddr, s.size))), size_t(s.size)},
                         {slot, sizeof after}};
    ssize_t want = ssize_t(s.size + sizeof before + sizeof after);
    return process_vm_readv(cma_pid_, l, 3, r, 3, 0) == want && before == slot_seq_ && after == slot_seq_ &&
           alive_->load(std::memory_order_acquire);
  }

  // Every segment whose owner bytes lie within one lent range: 0, or -EINVAL with the reason.
  int check_ranges(const Segments &segs) {
    if (ranges_.empty()) return 0;
    for (const auto &s : segs)
      if (!owner_addr(s.raddr, s.size))
        return set_error(-EINVAL, "the transfer of " + std::to_string(s.size) + " bytes at " + std::to_string(s.raddr) +
                                      " crosses from one of the grant's lent ranges into the next (give each range its own entry)");
    return 0;
  }

  // Several segments in one system call (the kernel copies them in order): true when all of
  // them moved; otherwise the caller copies them one at a time, which says what went wrong.
  bool cma_copy_all(bool is_read, const Segments &segs) {
    constexpr size_t kMost = 256;  // a larger list goes one segment at a time
    if (segs.size() < 2 || segs.size() > kMost) return false;
    struct iovec l[kMost], r[kMost];
    size_t want = 0;
    for (size_t i = 0; i < segs.size(); i++) {
      l[i] = {segs[i].buf, size_t(segs[i].size)};
      r[i] = {reinterpret_cast<void *>(uintptr_t(owner_addr(segs[i].raddr, segs[i].size))), size_t(segs[i].size)};
      want += size_t(segs[i].size);
    }
    unsigned long n = static_cast<unsigned long>(segs.size());
    ssize_t got = is_read ? process_vm_readv(cma_pid_, l, n, r, n, 0) : process_vm_writev(cma_pid_, l, n, r, n, 0);
    return got == ssize_t(want);
  }

  // One segment by cross-memory attach; the kernel may move less than asked, so loop.
  int cma_copy(bool is_read, const Segment &s) {
    uint64_t done = 0;
    uint64_t at = owner_addr(s.raddr, s.size);
    while (done < s.size) {
      struct iovec l = {s.buf + done, size_t(s.size - done)};
      struct iovec r = {reinterpret_cast<void *>(uintptr_t(at + done)), size_t(s.size - done)};
      ssize_t n = is_read ? process_vm_readv(cma_pid_, &l, 1, &r, 1, 0) : process_vm_writev(cma_pid_, &l, 1, &r, 1, 0);
      if (n <= 0) return cma_error(n < 0 ? errno : EFAULT);
      done += uint64_t(n);
    }
    return 0;
  }

  // A write into the element's pages. A large one that reaches a part of the element this
  // transport has not written before goes through the element's descriptor (pwrite): the kernel
  // fills each page in one pass, where a copy through the mapping takes a fault per page (and, for
  // a page the element does not have yet, zeroes it before the copy overwrites it). Measured on
  // 256 MiB: a new element 2.5 GB/s against 1.4. Once this mapping has its pages in place the
  // copy is the faster way (12 GB/s against 4), so a range written here before is copied into.
  // 0, or the error the kernel gave (no memory for the pages: a copy would take SIGBUS instead).
  int write_segment(const Segment &s) {
    constexpr uint64_t kLargeWrite = 256 << 10;
    if (memfd_ >= 0 && s.size >= kLargeWrite && !written_here(s.raddr, s.size)) {
      uint64_t done = 0;
      while (done < s.size) {
        ssize_t n = pwrite(memfd_, s.buf + done, size_t(s.size - done), off_t(s.raddr + done));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno != EINVAL && errno != EOPNOTSUPP)
          return set_error(-errno, "cannot write the memory element: " + std::string(strerror(errno)));
        if (n <= 0) break;  // a descriptor that takes no writes: the mapping does the rest
        done += uint64_t(n);
      }
      if (done < s.size) std::memcpy(map_ + s.raddr + done, s.buf + done, s.size - done);
      return 0;
    }
    std::memcpy(map_ + s.raddr, s.buf, s.size);
    return 0;
  }

  // True if every 64 KiB part of [raddr, raddr+size) was written through this transport before;
  // marks them written either way.
  bool written_here(uint64_t raddr, uint64_t size) {
    uint64_t first = raddr >> kPartShift, last = (raddr + size - 1) >> kPartShift;
    bool all = true;
    for (uint64_t part = first; part <= last && (part >> 6) < written_.size(); part++) {
      uint64_t bit = uint64_t(1) << (part & 63);
      all &= (written_[part >> 6].fetch_or(bit, std::memory_order_relaxed) & bit) != 0;
    }
    return all;
  }

  void start_watch(int fd) {
    alive_ = std::make_shared<std::atomic<bool>>(true);
    auto *w = new Watch();
    w->alive = alive_;
    w->on_gone = [this] { fail(-ECONNRESET, "the memory element closed the connection (grant revoked or server gone)"); };
    watch_ = w;
    IoLoop::shared().run_sync([&] {
      uv_poll_init(IoLoop::shared().loop(), &w->poll, fd);
      w->poll.data = w;
      uv_poll_start(&w->poll, UV_READABLE | UV_DISCONNECT, [](uv_poll_t *ph, int status, int events) {
        auto *w = static_cast<Watch *>(ph->data);
        char c;
        bool gone = status < 0 || (events & UV_DISCONNECT);
        if (!gone) {
          int fd;
          uv_fileno(reinterpret_cast<uv_handle_t *>(ph), &fd);
          ssize_t r = recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK);
          gone = r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) || r > 0;  // the server sends nothing after AUTH_OK: any byte is a broken peer
        }
        if (gone) {
          w->alive->store(false);
          uv_poll_stop(ph);
          if (w->on_gone) w->on_gone();
        }
      });
    });
  }

  void do_disconnect() override {
    if (session_) {
      if (!detached_) session_->detach(handle_);  // the connection stays, for the next transport
      session_.reset();
    }
    detached_ = false;
    slot_addr_ = slot_seq_ = 0;
    if (watch_) {
      Watch *w = watch_;
      watch_ = nullptr;
      IoLoop::shared().run_sync([w] {
        w->on_gone = nullptr;
        uv_close(reinterpret_cast<uv_handle_t *>(&w->poll), [](uv_handle_t *h) { delete static_cast<Watch *>(h->data); });
      });
    }
    if (sock_ >= 0) ::close(sock_);
    sock_ = -1;
    if (memfd_ >= 0) ::close(memfd_);
    memfd_ = -1;
    written_.clear();
    if (map_) munmap(map_, map_size_);
    map_ = nullptr;
    cma_pid_ = 0;
    ranges_.clear();
    starts_.clear();
    alive_.reset();
  }

  int do_notify(uint64_t value, int status, bool last, std::shared_lock<IoGate> &, Deadline deadline) override {
    if (!alive_->load(std::memory_order_acquire))
      return set_error(-ECONNRESET, "the memory element closed the connection (grant revoked or server gone)");
    // The owner ends a grant without waiting for peers on this host, and its DETACHED may not be
    // read yet: a word after it would report transfers the owner no longer stands behind (it may
    // have cancelled, and let the memory go). Its slot says at once that the grant ended, as it
    // does for a transfer, so the outcome does not hang on when the socket is read.
    if (slot_addr_ && !slot_unchanged()) {
      const char *why = slot_end_reason("the memory's owner ended this grant before its holder's word (cancelled, "
                                        "revoked, expired, or the memory withdrawn)");
      fail(-ECONNRESET, why);
      return set_error(-ECONNRESET, why);
    }
    if (session_) {
      if (last) detached_ = true;  // terminate then has nothing left to say
      return session_->notify(handle_, value, status, deadline, last);
    }
    char hdr[kHeaderSize];
    encode_notify(value, status, hdr);
    std::lock_guard<std::mutex> lk(notify_mu_);  // one frame at a time on the socket
    if (int rc = send_all(sock_, hdr, kHeaderSize, deadline))
      return set_error(rc == -ETIMEDOUT ? rc : -ECONNRESET, "cannot tell the memory's owner: " + std::string(strerror(-rc)));
    return 0;
  }

  // A second mapping of the element's pages (mremap of the transport's own with old size 0
  // duplicates a shared mapping: no descriptor kept, the same pages). The caller's to unmap; it
  // outlives this transport. Lent memory has no pages to share (the owner's heap).
  int do_map(void **addr, uint64_t *size) override {
    if (map_ && !(remote_rights() & LIBD_RIGHT_READ))
      return set_error(-EACCES, "the grant does not allow reads: its memory is not mapped for a write-only holder");
    if (!map_)
      return set_error(-EOPNOTSUPP, "this grant is lent memory of the owner's process, reached by cross-memory "
                                    "attach: it cannot be mapped here (use read/write)");
    void *p = mremap(map_, 0, map_size_, MREMAP_MAYMOVE);
    if (p == MAP_FAILED) return set_error(-errno, std::string("cannot map the memory element: ") + strerror(errno));
    *addr = p;
    *size = map_size_;
    return 0;
  }

  Caps caps() const override { return {.inline_copy = true, .notify = true}; }

  int do_post(const std::shared_ptr<Op> &op) override {
    if (!alive_->load(std::memory_order_relaxed)) {
      // The watch saw the peer go and is about to say so; the failed operation must not find
      // the transport still READY, so say it here too (fail() acts once).
      fail(-ECONNRESET, "the memory element closed the connection (grant revoked or server gone)");
      op->complete(-ECONNRESET, "the memory element is gone");
      return 0;
    }
    if (slot_addr_ && !slot_unchanged()) {
      const char *why = slot_end_reason("the memory's owner ended this grant (revoked, expired, or the memory withdrawn)");
      fail(-ECONNRESET, why);
      op->complete(-ECONNRESET, why);
      return 0;
    }
    bool is_read = op->kind() == OpKind::Read;
    if (int rc = check_ranges(op->segments())) {
      op->complete(rc, last_error());
      return 0;
    }
    if (is_read && slot_addr_ && cma_pid_ && op->segments().size() == 1 && checked_cma_read(op->segments()[0])) {
      op->complete(0);
      return 0;
    }
    bool moved = cma_pid_ && cma_copy_all(is_read, op->segments());
    for (const auto &s : op->segments()) {
      if (moved) break;
      if (cma_pid_) {
        if (int rc = cma_copy(is_read, s)) {
          std::string why = last_error();
          if (rc == -ECONNRESET) fail(rc, why);
          op->complete(rc, why);
          return 0;
        }
      } else if (is_read) {
        std::memcpy(s.buf, map_ + s.raddr, s.size);
      } else if (int rc = write_segment(s)) {
        op->complete(rc, last_error());
        return 0;
      }
    }
    // The owner may have ended the grant while the bytes moved (its revoke does not wait for
    // peers on this host): a read may then hold bytes of memory no longer lent, and a write may
    // have landed after the owner's call returned. Either way the caller must not trust it.
    if (slot_addr_ && !slot_unchanged()) {
      const char *why = slot_end_reason(
          "the memory's owner ended this grant during the transfer (revoked, expired, or the memory withdrawn)");
      fail(-ECONNRESET, why);
      op->complete(-ECONNRESET, why);
      return 0;
    }
    // A server that died during the copy leaves memory nobody will see again: say so.
    if (!alive_->load(std::memory_order_acquire)) {
      fail(-ECONNRESET, "the memory element closed the connection (grant revoked or server gone)");
      op->complete(-ECONNRESET, "the memory element went away during the transfer");
      return 0;
    }
    op->complete(0);
    return 0;
  }

 private:
  bool shared_ = false;
  std::atomic<bool> detached_{false};    // its last word detached it already (notify_last); set under the shared I/O lock
  std::shared_ptr<ShmSession> session_;  // share,1: the process's connection to the server
  uint32_t handle_ = 0;                  // this transport's attachment on it
  uint64_t slot_addr_ = 0, slot_seq_ = 0;  // its slot in the owner's grant table, when it came from there
  pid_t cma_pid_ = 0;       // lent memory: the owner's process, else 0 (memfd mapping)
  uint64_t cma_base_ = 0;   // the element's address in the owner
  std::vector<CmaRange> ranges_;  // memory lent as several ranges: their table (read from the owner)
  std::vector<uint64_t> starts_;  // where each range starts in the grant's offsets
  std::mutex notify_mu_;
  int sock_ = -1;
  int memfd_ = -1;  // the element's descriptor, under a writable grant (write_segment)
  static constexpr unsigned kPartShift = 16;      // 64 KiB parts
  std::vector<std::atomic<uint64_t>> written_;    // a bit per part written through this transport
  char *map_ = nullptr;
  uint64_t map_size_ = 0;
  std::shared_ptr<std::atomic<bool>> alive_;
  Watch *watch_ = nullptr;
};

}  // namespace

extern const ImplInfo kShmImpl = {
    "rdma_shm", {"shm", "rdma_shared"}, LIBD_KIND_RDMA, [] { return std::unique_ptr<Transport>(new ShmTransport()); }};

}  // namespace libd
