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
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "core/transport.h"
#include "io/ioloop.h"
#include "io/sockio.h"
#include "proto/auth.h"
#include "proto/client_handshake.h"
#include "proto/frame.h"

namespace libd {
namespace {

using namespace proto;

// Watches the unix socket on the shared loop; flips `alive` when the server hangs up.
struct Watch {
  uv_poll_t poll;
  std::shared_ptr<std::atomic<bool>> alive;
  std::function<void()> on_gone;
};

class ShmTransport : public Transport {
 protected:
  bool configured() const override {
    return params_.has("path") && params_.has("grant") && params_.has("secret");
  }

  int do_init() override {
    if (!configured()) return set_error(-EINVAL, "needs path, grant and secret");
    if (params_.get_or("path", "").size() >= sizeof(sockaddr_un::sun_path))
      return set_error(-EINVAL, "parameter 'path' is too long for a unix socket");
    return 0;
  }

  int do_connect(Deadline deadline) override {
    std::string path = params_.get_or("path", "");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return set_error(-errno, std::string("socket: ") + strerror(errno));
    sock_ = fd;
    struct sockaddr_un sa = {};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
    if (::connect(fd, reinterpret_cast<sockaddr *>(&sa), sizeof sa) != 0 && errno != EINPROGRESS)
      return set_error(-errno, "cannot connect to the memory element at '" + path + "': " + strerror(errno));

    char hdr[kHeaderSize];
    Header h;
    std::string why;
    auto io_error = [&](int rc) {
      return set_error(rc, "handshake with the memory element at '" + path + "' failed: " +
                               (rc == -ETIMEDOUT ? std::string("no answer in time") : std::string(strerror(-rc))));
    };
    if (int rc = recv_exact(fd, hdr, kHeaderSize, deadline, nullptr)) return io_error(rc);
    if (decode_header(hdr, &h, &why) || h.opcode != kChallenge || h.size != kNonceSize)
      return set_error(-EPROTO, "the memory element sent no valid challenge: " + why);
    std::string nonce(kNonceSize, '\0');
    if (int rc = recv_exact(fd, nonce.data(), kNonceSize, deadline, nullptr)) return io_error(rc);

    std::string grant = params_.get_or("grant", ""), secret = params_.get_or("secret", "");
    std::string body = encode_auth({grant, aid(), compute_mac(secret, nonce, grant, aid())});
    Header ah;
    ah.opcode = kAuth;
    ah.size = body.size();
    char ahdr[kHeaderSize];
    encode_header(ah, ahdr);
    std::string msg = std::string(ahdr, kHeaderSize) + body;
    if (int rc = send_all(fd, msg.data(), msg.size(), deadline)) return io_error(rc);

    int memfd = -1;
    if (int rc = recv_exact(fd, hdr, kHeaderSize, deadline, &memfd)) return io_error(rc);
    auto close_memfd = [&] { if (memfd >= 0) ::close(memfd); };
    if (decode_header(hdr, &h, &why) || h.opcode != kAuthOk) {
      close_memfd();
      return set_error(-EPROTO, "the memory element sent no valid answer: " + why);
    }
    if (h.status != 0) {
      close_memfd();
      return set_error(h.status, refusal_reason(h.status));
    }
    std::string gbody(size_t(payload_length(h)), '\0');
    GrantBody g;
    if (int rc = recv_exact(fd, gbody.data(), gbody.size(), deadline, memfd >= 0 ? nullptr : &memfd)) {
      close_memfd();
      return io_error(rc);
    }
    if (decode_grant(gbody.data(), gbody.size(), &g, &why)) {
      close_memfd();
      return set_error(-EPROTO, why);
    }
    if (memfd < 0 && g.cma_pid) {
      cma_pid_ = pid_t(g.cma_pid);
      cma_base_ = g.cma_base;
      if (int rc = probe_cma(g)) return rc;
      set_remote(g.offset, g.length, g.rights);
      start_watch(fd);
      return 0;
    }
    if (memfd < 0) return set_error(-EPROTO, "the memory element sent no memory descriptor");
    int prot = PROT_READ | ((g.rights & LIBD_RIGHT_WRITE) ? PROT_WRITE : 0);
    void *p = mmap(nullptr, g.element_size, prot, MAP_SHARED, memfd, 0);
    ::close(memfd);
    if (p == MAP_FAILED) return set_error(-errno, std::string("cannot map the memory element: ") + strerror(errno));
    map_ = static_cast<char *>(p);
    map_size_ = g.element_size;
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
    struct iovec l = {&b, 1}, r = {reinterpret_cast<void *>(uintptr_t(cma_base_ + g.offset)), 1};
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

  // One segment by cross-memory attach; the kernel may move less than asked, so loop.
  int cma_copy(bool is_read, const Segment &s) {
    uint64_t done = 0;
    while (done < s.size) {
      struct iovec l = {s.buf + done, size_t(s.size - done)};
      struct iovec r = {reinterpret_cast<void *>(uintptr_t(cma_base_ + s.raddr + done)), size_t(s.size - done)};
      ssize_t n = is_read ? process_vm_readv(cma_pid_, &l, 1, &r, 1, 0) : process_vm_writev(cma_pid_, &l, 1, &r, 1, 0);
      if (n <= 0) return cma_error(n < 0 ? errno : EFAULT);
      done += uint64_t(n);
    }
    return 0;
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
    if (map_) munmap(map_, map_size_);
    map_ = nullptr;
    cma_pid_ = 0;
    alive_.reset();
  }

  int do_notify(uint64_t value, int status, std::shared_lock<IoGate> &, Deadline deadline) override {
    if (!alive_->load(std::memory_order_acquire))
      return set_error(-ECONNRESET, "the memory element closed the connection (grant revoked or server gone)");
    char hdr[kHeaderSize];
    encode_notify(value, status, hdr);
    std::lock_guard<std::mutex> lk(notify_mu_);  // one frame at a time on the socket
    if (int rc = send_all(sock_, hdr, kHeaderSize, deadline))
      return set_error(rc == -ETIMEDOUT ? rc : -ECONNRESET, "cannot tell the memory's owner: " + std::string(strerror(-rc)));
    return 0;
  }

  bool completes_inline() const override { return true; }

  int do_post(const std::shared_ptr<Op> &op) override {
    if (!alive_->load(std::memory_order_relaxed)) {
      // The watch saw the peer go and is about to say so; the failed operation must not find
      // the transport still READY, so say it here too (fail() acts once).
      fail(-ECONNRESET, "the memory element closed the connection (grant revoked or server gone)");
      op->complete(-ECONNRESET, "the memory element is gone");
      return 0;
    }
    bool is_read = op->kind() == OpKind::Read;
    for (const auto &s : op->segments()) {
      if (cma_pid_) {
        if (int rc = cma_copy(is_read, s)) {
          std::string why = last_error();
          if (rc == -ECONNRESET) fail(rc, why);
          op->complete(rc, why);
          return 0;
        }
      } else if (is_read) {
        std::memcpy(s.buf, map_ + s.raddr, s.size);
      } else {
        std::memcpy(map_ + s.raddr, s.buf, s.size);
      }
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
  pid_t cma_pid_ = 0;       // lent memory: the owner's process, else 0 (memfd mapping)
  uint64_t cma_base_ = 0;   // the element's address in the owner
  std::mutex notify_mu_;
  int sock_ = -1;
  char *map_ = nullptr;
  uint64_t map_size_ = 0;
  std::shared_ptr<std::atomic<bool>> alive_;
  Watch *watch_ = nullptr;
};

}  // namespace

extern const ImplInfo kShmImpl = {
    "rdma_shm", {"shm", "rdma_shared"}, LIBD_KIND_RDMA, [] { return std::unique_ptr<Transport>(new ShmTransport()); }};

}  // namespace libd
