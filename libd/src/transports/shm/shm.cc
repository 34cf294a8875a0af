// rdma_shm (shm): same-host, zero-copy access to a memory element. The handshake runs over the
// element's unix socket (the same authenticated CHALLENGE/AUTH as tcp); the server then passes
// the element's memfd with SCM_RIGHTS — read-only for read-only grants — and the client maps it.
// Reads and writes are bounds-checked memcpy. The socket stays open as a liveness channel: when
// the server goes away or revokes the grant, the shared loop sees it and the transport moves to
// ERROR. Config keys: path, grant, secret; optional timeout_ms.
#include <sys/mman.h>
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
    if (memfd < 0) return set_error(-EPROTO, "the memory element sent no memory descriptor");
    int prot = PROT_READ | ((g.rights & LIBD_RIGHT_WRITE) ? PROT_WRITE : 0);
    void *p = mmap(nullptr, g.element_size, prot, MAP_SHARED, memfd, 0);
    ::close(memfd);
    if (p == MAP_FAILED) return set_error(-errno, std::string("cannot map the memory element: ") + strerror(errno));
    map_ = static_cast<char *>(p);
    map_size_ = g.element_size;
    set_remote(g.offset, g.length, g.rights);

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
    return 0;
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
    alive_.reset();
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
      if (is_read) std::memcpy(s.buf, map_ + s.raddr, s.size);
      else std::memcpy(map_ + s.raddr, s.buf, s.size);
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
