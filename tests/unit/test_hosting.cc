// Memory hosting through libd.h alone (what the host agent and libd-memd use): elements of the
// server's own under a capacity, what the server reports, grants restored with their id and secret,
// and a grant whose configuration did not fit the caller's buffer is not left behind.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "harness.h"
#include "libd.h"

using test::make_action;

namespace {

std::string field(const std::string &config, const std::string &key) {
  size_t at = config.rfind(key + ",");
  if (at == std::string::npos) return "";
  size_t start = at + key.size() + 1;
  return config.substr(start, config.find(';', start) - start);
}

struct Host {
  test::ActionPtr action = make_action("host");
  libd_transport *server = nullptr;
  explicit Host(const std::string &keys) {
    std::string durl = "pool;tcp_server;size,0;path," + test::unique_socket_path("host") + keys;
    EXPECT_EQ(0, libd_action_add_transport(action.get(), durl.c_str())) << libd_last_error();
    server = libd_action_get_transport(action.get(), "pool");
    EXPECT_EQ(0, libd_trdma_server_serve(server)) << libd_last_error();
  }
  std::string grant(const char *element, const char *client) {
    libd_grant_spec spec = {};
    spec.element = element;
    spec.client = client;
    spec.rights = LIBD_RIGHT_READ | LIBD_RIGHT_WRITE;
    char config[1024];
    int n = libd_trdma_server_grant_ex(server, &spec, config, sizeof config);
    EXPECT_GT(n, 0) << libd_last_error();
    return n > 0 ? std::string(config, size_t(n)) : "";
  }
};

// Writes `text` through a client holding `config`, then reads it back. 0 or the failing call's code.
int round_trip(const std::string &config, const std::string &client, const std::string &text) {
  auto a = make_action(client);
  std::string durl = "m;tcp;" + config;
  if (int rc = libd_action_add_transport(a.get(), durl.c_str())) return rc;
  auto *t = libd_action_get_transport(a.get(), "m");
  char *buf = nullptr;
  if (int rc = libd_trdma_reg(t, 4096, reinterpret_cast<void **>(&buf))) return rc;
  memcpy(buf, text.data(), text.size());
  if (int rc = libd_trdma_write(t, text.size(), 10, buf)) return rc;
  memset(buf, 0, 4096);
  if (int rc = libd_trdma_read(t, text.size(), 10, buf)) return rc;
  return std::string(buf, text.size()) == text ? 0 : -EIO;
}

}  // namespace

TEST(Hosting, ElementsOfItsOwnCountAgainstTheCapacity) {
  Host host(";capacity,1MiB");
  libd_server_attr attr;
  ASSERT_EQ(0, libd_trdma_server_query(host.server, &attr));
  EXPECT_EQ(0u, attr.used_bytes);
  EXPECT_EQ(1u << 20, attr.capacity);
  EXPECT_EQ(0, attr.verbs);
  EXPECT_STREQ("", attr.verbs_device);

  ASSERT_EQ(0, libd_trdma_server_add_element(host.server, "a", 768 << 10)) << libd_last_error();
  EXPECT_EQ(-EEXIST, libd_trdma_server_add_element(host.server, "a", 4096));
  EXPECT_EQ(-ENOSPC, libd_trdma_server_add_element(host.server, "b", 512 << 10));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("does not fit")) << libd_last_error();
  EXPECT_EQ(-EINVAL, libd_trdma_server_add_element(host.server, "", 4096));
  ASSERT_EQ(0, libd_trdma_server_query(host.server, &attr));
  EXPECT_EQ(768u << 10, attr.used_bytes);

  std::string config = host.grant("a", "reader");
  EXPECT_EQ(0, round_trip(config, "reader", "hosted"));

  // Withdrawn, the element's bytes are free again and its grant is dead.
  ASSERT_EQ(0, libd_trdma_server_withdraw(host.server, "a"));
  ASSERT_EQ(0, libd_trdma_server_query(host.server, &attr));
  EXPECT_EQ(0u, attr.used_bytes);
  EXPECT_NE(0, round_trip(config, "reader", "gone"));

  // Lent memory is the lender's: it takes none of the capacity, and its withdrawal frees none.
  std::vector<char> lent(2 << 20);
  ASSERT_EQ(0, libd_trdma_server_expose(host.server, "lent", lent.data(), lent.size())) << libd_last_error();
  EXPECT_EQ(0, libd_trdma_server_add_element(host.server, "b", 1 << 20)) << libd_last_error();
  ASSERT_EQ(0, libd_trdma_server_withdraw(host.server, "lent"));
  ASSERT_EQ(0, libd_trdma_server_query(host.server, &attr));
  EXPECT_EQ(1u << 20, attr.used_bytes);
  EXPECT_EQ(-ENOSPC, libd_trdma_server_add_element(host.server, "c", 4096)) << "the capacity is all taken by b";
}

TEST(Hosting, ARestoredGrantKeepsItsIdAndSecret) {
  std::string config;
  {
    Host first("");
    ASSERT_EQ(0, libd_trdma_server_add_element(first.server, "e", 4096));
    config = first.grant("e", "c1");
  }
  Host second("");
  ASSERT_EQ(0, libd_trdma_server_add_element(second.server, "e", 4096));
  libd_grant_spec spec = {};
  spec.element = "e";
  spec.client = "c1";
  spec.rights = LIBD_RIGHT_READ | LIBD_RIGHT_WRITE;
  std::string id = field(config, "grant"), secret = field(config, "secret");
  char out[1024];
  int n = libd_trdma_server_grant_as(second.server, &spec, id.c_str(), secret.c_str(), out, sizeof out);
  ASSERT_GT(n, 0) << libd_last_error();
  EXPECT_EQ(id, field(out, "grant"));
  EXPECT_EQ(secret, field(out, "secret"));
  // The old configuration, with only the new address, works against the new server.
  std::string moved = out;
  EXPECT_EQ(0, round_trip(moved, "c1", "again"));
  EXPECT_EQ(-EEXIST, libd_trdma_server_grant_as(second.server, &spec, id.c_str(), secret.c_str(), out, sizeof out));
  EXPECT_EQ(-EINVAL, libd_trdma_server_grant_as(second.server, &spec, "g2", "not;hex,at-all-but-long-enough-0123456789",
                                                out, sizeof out));
  EXPECT_EQ(-EINVAL, libd_trdma_server_grant_as(second.server, &spec, nullptr, secret.c_str(), out, sizeof out));
}

TEST(Hosting, AGrantWhoseConfigurationDidNotFitIsRevoked) {
  Host host("");
  ASSERT_EQ(0, libd_trdma_server_add_element(host.server, "e", 4096));
  libd_grant_spec spec = {};
  spec.element = "e";
  spec.client = "c";
  spec.rights = LIBD_RIGHT_READ;
  std::string id = "g-too-small", secret(64, 'a');
  char tiny[16];
  EXPECT_EQ(-ERANGE, libd_trdma_server_grant_as(host.server, &spec, id.c_str(), secret.c_str(), tiny, sizeof tiny));
  // Had it stayed, the id would still be taken.
  EXPECT_EQ(-ENOENT, libd_trdma_server_revoke(host.server, id.c_str()));
  char out[1024];
  EXPECT_GT(libd_trdma_server_grant_as(host.server, &spec, id.c_str(), secret.c_str(), out, sizeof out), 0)
      << libd_last_error();
}

TEST(Hosting, CallsOnAServerThatIsNotServingSayWhy) {
  auto a = make_action("host");
  EXPECT_EQ(-EINVAL, libd_action_add_transport(a.get(), "bad;tcp_server;size,0;capacity,abc"));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("capacity")) << libd_last_error();
  ASSERT_EQ(0, libd_action_add_transport(a.get(), "pool;tcp_server;size,0;capacity,1GiB"));
  auto *s = libd_action_get_transport(a.get(), "pool");
  libd_server_attr attr;
  EXPECT_EQ(-ENOTCONN, libd_trdma_server_query(s, &attr));
  EXPECT_EQ(-ENOTCONN, libd_trdma_server_add_element(s, "x", 4096));
  EXPECT_EQ(-EINVAL, libd_trdma_server_query(s, nullptr));
  // A client transport has no hosting calls.
  auto c = make_action("c");
  ASSERT_EQ(0, libd_action_add_transport(c.get(), "m;local;size,4096"));
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_server_add_element(libd_action_get_transport(c.get(), "m"), "x", 4096));
  EXPECT_GE(libd_verbs_available(), 0);
}

TEST(Counters, TheTimeOperationsTookIsCounted) {
  auto a = make_action("timed");
  ASSERT_EQ(0, libd_action_add_transport(a.get(), "m;local;size,1MiB"));
  auto *t = libd_action_get_transport(a.get(), "m");
  uint64_t ns = 1;
  ASSERT_EQ(0, libd_transport_busy_ns(t, &ns));
  EXPECT_EQ(0u, ns);  // nothing ran yet
  char *buf = nullptr;
  ASSERT_EQ(0, libd_trdma_reg(t, 1 << 20, reinterpret_cast<void **>(&buf)));
  for (int i = 0; i < 200; i++) ASSERT_EQ(0, libd_trdma_write(t, 1 << 20, 0, buf));
  ASSERT_EQ(0, libd_transport_busy_ns(t, &ns));
  // 200 writes of 1 MiB take at least the time of copying 200 MiB once at 100 GB/s.
  EXPECT_GT(ns, 2'000'000u);
  libd_stats s;
  ASSERT_EQ(0, libd_transport_stats(t, &s));
  EXPECT_EQ(200u, s.write_ops);
  EXPECT_EQ(-EINVAL, libd_transport_busy_ns(t, nullptr));
}
