// What a transport can do, declared once (libd_transport_caps), and the server calls that a
// client transport does not have.
#include <gtest/gtest.h>

#include <cerrno>
#include <string>

#include "harness.h"
#include "libd.h"

using test::make_action;

TEST(Caps, EachImplementationSaysWhatItCanDo) {
  struct Case {
    const char *impl;
    int caps;
  } cases[] = {
      {"local", LIBD_CAP_NOWAIT},
      {"shm", LIBD_CAP_NOWAIT | LIBD_CAP_NOTIFY},
      {"tcp", LIBD_CAP_NOTIFY},
  };
  for (const auto &c : cases) {
    auto r = test::make_rig(c.impl, 4096);
    EXPECT_EQ(c.caps, libd_transport_caps(r.t)) << c.impl;
  }
  auto shared = test::make_rig("tcp", 4096, 3, "share,1");
  EXPECT_EQ(LIBD_CAP_NOTIFY | LIBD_CAP_LAZY_CONNECT, libd_transport_caps(shared.t));
  EXPECT_EQ(-EINVAL, libd_transport_caps(nullptr));
}

TEST(Caps, AServerIsOneAndAClientRefusesTheServersCalls) {
  auto a = make_action("owner");
  std::string durl = "srv;tcp_server;size,4096;path," + test::unique_socket_path("caps");
  ASSERT_EQ(0, libd_action_add_transport(a.get(), durl.c_str())) << libd_last_error();
  auto *srv = libd_action_get_transport(a.get(), "srv");
  EXPECT_EQ(int(LIBD_CAP_SERVER), libd_transport_caps(srv));

  auto r = test::make_rig("tcp", 4096);
  char config[512];
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_server_serve(r.t));
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_server_grant(r.t, "*", 0, 0, LIBD_RIGHT_READ, config, sizeof config));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("does not support grant")) << libd_last_error();
  EXPECT_EQ(-EOPNOTSUPP, libd_trdma_server_run(r.t));
}
