// Waiting in an event loop instead of a thread: libd_op_watch (the holder's operation) and
// libd_trdma_server_watch_notify (the owner's grant) write to the caller's eventfd.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "libd.h"

using test::make_action;

namespace {

struct EventFd {
  int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ~EventFd() { ::close(fd); }
  // Waits up to timeout_ms for a write; the counter it took, 0 if none came.
  uint64_t take(int timeout_ms) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) return 0;
    uint64_t v = 0;
    return read(fd, &v, sizeof v) == sizeof v ? v : 0;
  }
};

std::string field(const std::string &config, const std::string &key) {
  size_t at = config.rfind(key + ",");
  if (at == std::string::npos) return "";
  size_t start = at + key.size() + 1;
  return config.substr(start, config.find(';', start) - start);
}

// An owner lending `mem` through a server transport, and holders of its grants.
struct Owner {
  std::vector<char> mem = std::vector<char>(1 << 16, 'o');
  test::ActionPtr action = make_action("owner");
  libd_transport *srv = nullptr;
  std::vector<test::ActionPtr> holders;

  Owner() {
    std::string durl = "srv;tcp_server;size,0;host,127.0.0.1;port,0;path," + test::unique_socket_path("watch");
    EXPECT_EQ(0, libd_action_add_transport(action.get(), durl.c_str())) << libd_last_error();
    srv = libd_action_get_transport(action.get(), "srv");
    EXPECT_EQ(0, libd_trdma_server_serve(srv)) << libd_last_error();
    EXPECT_EQ(0, libd_trdma_server_expose(srv, "lent", mem.data(), mem.size())) << libd_last_error();
  }
  std::string grant() {
    libd_grant_spec spec = {};
    spec.element = "lent";
    spec.client = "*";
    spec.rights = LIBD_RIGHT_READ | LIBD_RIGHT_WRITE;
    char config[1024];
    int n = libd_trdma_server_grant_ex(srv, &spec, config, sizeof config);
    EXPECT_GT(n, 0) << libd_last_error();
    return n > 0 ? std::string(config, size_t(n)) : "";
  }
  libd_transport *holder(const std::string &config) {
    holders.push_back(make_action("holder"));
    std::string durl = "t;tcp;timeout_ms,5000;" + config;
    EXPECT_EQ(0, libd_action_add_transport(holders.back().get(), durl.c_str())) << libd_last_error();
    return libd_action_get_transport(holders.back().get(), "t");
  }
};

}  // namespace

TEST(OpWatch, TheEventFdIsWrittenWhenTheOperationCompletes) {
  Owner o;
  auto *t = o.holder(o.grant());
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 4096, reinterpret_cast<void **>(&buf)));
  EventFd e;
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async(t, 4096, 0, buf, &op)) << libd_last_error();
  ASSERT_EQ(0, libd_op_watch(op, e.fd));
  EXPECT_EQ(1u, e.take(5000)) << "no word of the completion";
  EXPECT_EQ(0, libd_op_poll(op)) << "the watcher woke before the operation completed";
  EXPECT_EQ(std::string(4096, 'o'), std::string(buf, 4096));
  libd_op_free(op);
}

TEST(OpWatch, AnOperationThatCompletedAlreadyIsToldAtOnce) {
  Owner o;
  auto *t = o.holder(o.grant());
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 64, reinterpret_cast<void **>(&buf)));
  libd_op *op = nullptr;
  ASSERT_EQ(0, libd_trdma_read_async(t, 64, 0, buf, &op)) << libd_last_error();
  ASSERT_EQ(0, libd_op_wait(op, 5000));
  EventFd e;
  ASSERT_EQ(0, libd_op_watch(op, e.fd));
  EXPECT_EQ(1u, e.take(0));
  libd_op_free(op);
}

TEST(NotifyWatch, TheOwnerIsWokenByAHoldersWordAndTakesItWithoutWaiting) {
  Owner o;
  std::string config = o.grant();
  std::string id = field(config, "grant");
  EventFd e;
  ASSERT_EQ(0, libd_trdma_server_watch_notify(o.srv, id.c_str(), e.fd)) << libd_last_error();
  auto *t = o.holder(config);
  ASSERT_EQ(0, libd_trdma_notify(t, 42, 0)) << libd_last_error();
  EXPECT_GE(e.take(5000), 1u) << "no word reached the watcher";
  uint64_t value = 0;
  int status = 1;
  ASSERT_EQ(0, libd_trdma_server_wait_notify(o.srv, id.c_str(), &value, &status, 0)) << libd_last_error();
  EXPECT_EQ(42u, value);
  EXPECT_EQ(0, status);
}

TEST(NotifyWatch, NoWriteComesAfterUnwatch) {
  Owner o;
  std::string config = o.grant();
  std::string id = field(config, "grant");
  EventFd e;
  ASSERT_EQ(0, libd_trdma_server_watch_notify(o.srv, id.c_str(), e.fd));
  ASSERT_EQ(0, libd_trdma_server_unwatch_notify(o.srv, id.c_str(), e.fd));
  auto *t = o.holder(config);
  ASSERT_EQ(0, libd_trdma_notify(t, 1, 0)) << libd_last_error();
  uint64_t value = 0;
  int status = 0;
  ASSERT_EQ(0, libd_trdma_server_wait_notify(o.srv, id.c_str(), &value, &status, 5000)) << libd_last_error();
  EXPECT_EQ(0u, e.take(0)) << "written after unwatch returned";
}

TEST(NotifyWatch, ARevokeWakesTheWatcherAndEndsTheWatch) {
  Owner o;
  std::string config = o.grant();
  std::string id = field(config, "grant");
  EventFd e;
  ASSERT_EQ(0, libd_trdma_server_watch_notify(o.srv, id.c_str(), e.fd));
  ASSERT_EQ(0, libd_trdma_server_revoke(o.srv, id.c_str()));
  EXPECT_GE(e.take(5000), 1u);
  EXPECT_EQ(-ENOENT, libd_trdma_server_watch_notify(o.srv, id.c_str(), e.fd));
  uint64_t value = 0;
  int status = 0;
  EXPECT_EQ(-ENOENT, libd_trdma_server_wait_notify(o.srv, id.c_str(), &value, &status, 0));
}

TEST(NotifyWatch, SeveralWatchersAreAllWoken) {
  Owner o;
  std::string config = o.grant();
  std::string id = field(config, "grant");
  EventFd a, b;
  ASSERT_EQ(0, libd_trdma_server_watch_notify(o.srv, id.c_str(), a.fd));
  ASSERT_EQ(0, libd_trdma_server_watch_notify(o.srv, id.c_str(), b.fd));
  auto *t = o.holder(config);
  ASSERT_EQ(0, libd_trdma_notify(t, 5, 0)) << libd_last_error();
  EXPECT_GE(a.take(5000), 1u);
  EXPECT_GE(b.take(5000), 1u);
}
