#include <gtest/gtest.h>

#include <random>

#include "core/durl.h"
#include "harness.h"

using libd::Durl;
using libd::parse_config;
using libd::parse_durl;

TEST(Durl, ParsesScadDescriptors) {
  Durl d;
  std::string why;
  ASSERT_EQ(0, parse_durl("mem1;rdma_tcp;host,10.0.0.1;port,7000", &d, &why)) << why;
  EXPECT_EQ("mem1", d.name);
  EXPECT_EQ("rdma_tcp", d.impl);
  ASSERT_EQ(2u, d.params.size());
  EXPECT_EQ("host", d.params[0].first);
  EXPECT_EQ("10.0.0.1", d.params[0].second);
  EXPECT_EQ("7000", d.params[1].second);
}

TEST(Durl, AcceptsTrailingSemicolonNoPairsAndEmptyOrCommaValues) {
  Durl d;
  std::string why;
  ASSERT_EQ(0, parse_durl("m;local;", &d, &why)) << why;
  EXPECT_TRUE(d.params.empty());
  ASSERT_EQ(0, parse_durl("m;local", &d, &why)) << why;
  ASSERT_EQ(0, parse_durl("m;local;size,4096;", &d, &why)) << why;
  ASSERT_EQ(0, parse_durl("m;local;list,a,b,c;empty,", &d, &why)) << why;
  EXPECT_EQ("a,b,c", d.params[0].second);
  EXPECT_EQ("", d.params[1].second);
}

struct BadDurl {
  const char *text;
  size_t position;  // 1-based, as reported
  const char *says;
};

class DurlRejects : public ::testing::TestWithParam<BadDurl> {};

TEST_P(DurlRejects, WithPositionAndReason) {
  Durl d;
  d.name = "untouched";
  std::string why;
  EXPECT_EQ(-EINVAL, parse_durl(GetParam().text, &d, &why));
  EXPECT_EQ("untouched", d.name) << "output must not change on error";
  EXPECT_NE(std::string::npos, why.find("position " + std::to_string(GetParam().position) + ":")) << why;
  EXPECT_NE(std::string::npos, why.find(GetParam().says)) << why;
}

INSTANTIATE_TEST_SUITE_P(
    Malformed, DurlRejects,
    ::testing::Values(BadDurl{"", 1, "empty transport name"}, BadDurl{";tcp", 1, "empty transport name"},
                      BadDurl{"mem1", 5, "expected ';'"}, BadDurl{"mem1;", 6, "empty implementation"},
                      BadDurl{"me m;tcp", 3, "unexpected ' '"}, BadDurl{"mem;TCP", 5, "unexpected 'T'"},
                      BadDurl{"mem;tcp;host", 13, "expected ','"}, BadDurl{"mem;tcp;;", 9, "empty key"},
                      BadDurl{"mem;tcp;,v", 9, "empty key"},
                      BadDurl{"mem;tcp;a,1;a,2", 13, "duplicate key 'a'"},
                      BadDurl{"mem;tcp;a,x\ny", 12, "byte 0x0a"},
                      BadDurl{"mem;tcp;a\x01,1", 10, "byte 0x01"}),
    [](const ::testing::TestParamInfo<BadDurl> &info) { return "case" + std::to_string(info.index); });

TEST(Durl, RejectsOverlongParts) {
  Durl d;
  std::string why;
  EXPECT_EQ(-EINVAL, parse_durl(std::string(65, 'n') + ";tcp", &d, &why));
  EXPECT_NE(std::string::npos, why.find("longer than 64")) << why;
  EXPECT_EQ(-EINVAL, parse_durl("m;" + std::string(33, 'i'), &d, &why));
  EXPECT_EQ(-EINVAL, parse_durl("m;tcp;k," + std::string(1025, 'v'), &d, &why));
  EXPECT_EQ(-EINVAL, parse_durl("m;tcp;k," + std::string(5000, 'v'), &d, &why));
  EXPECT_NE(std::string::npos, why.find("4096")) << why;
}

// Duplicates are found however many pairs come before them (a handful are looked through, more
// are kept in a set), and a durl of hundreds of pairs parses whole.
TEST(Durl, ADuplicateIsFoundAmongManyPairs) {
  for (int before : {1, 15, 16, 17, 40, 500}) {  // 500 pairs: about 3500 of the 4096 bytes
    std::string text = "m;tcp";
    for (int i = 0; i < before; i++) text += ";k" + std::to_string(i) + ",v";
    Durl d;
    std::string why;
    ASSERT_EQ(0, parse_durl(text, &d, &why)) << before << ": " << why;
    EXPECT_EQ(size_t(before), d.params.size());
    for (int dup : {0, before - 1}) {
      Durl again;
      EXPECT_EQ(-EINVAL, parse_durl(text + ";k" + std::to_string(dup) + ",w", &again, &why)) << before << " " << dup;
      EXPECT_NE(std::string::npos, why.find("duplicate key 'k" + std::to_string(dup) + "'")) << why;
    }
  }
}

TEST(Durl, ConfigIsPairsOnly) {
  libd::Params::List kv;
  std::string why;
  ASSERT_EQ(0, parse_config("host,127.0.0.1;port,1", &kv, &why)) << why;
  EXPECT_EQ(2u, kv.size());
  ASSERT_EQ(0, parse_config("", &kv, &why));
  EXPECT_TRUE(kv.empty());
  EXPECT_EQ(-EINVAL, parse_config("host", &kv, &why));
}

// Random and mutated inputs never crash, never leak (ASan build), and either parse or explain.
TEST(Durl, HostileInputsNeverCrash) {
  std::mt19937 rng(42);
  const std::string alphabet = "ab;,_.-\x01\xff 9Z";
  const std::string seed = "mem1;rdma_tcp;host,127.0.0.1;port,7000;grant,g1;secret,abc";
  for (int i = 0; i < 20000; i++) {
    std::string s = seed;
    int edits = 1 + int(rng() % 6);
    for (int e = 0; e < edits; e++) {
      size_t pos = rng() % (s.size() + 1);
      switch (rng() % 3) {
        case 0: s.insert(s.begin() + long(pos), alphabet[rng() % alphabet.size()]); break;
        case 1: if (pos < s.size()) s.erase(pos, 1); break;
        case 2: if (pos < s.size()) s[pos] = alphabet[rng() % alphabet.size()]; break;
      }
    }
    Durl d;
    std::string why;
    int rc = parse_durl(s, &d, &why);
    if (rc != 0) {
      EXPECT_EQ(-EINVAL, rc);
      EXPECT_EQ(0u, why.find("position ")) << why;
    }
  }
}

TEST(Durl, ActionReportsUnknownImplAndDuplicates) {
  auto a = test::make_action("durl-test");
  ASSERT_TRUE(a);
  EXPECT_EQ(-EINVAL, libd_action_add_transport(a.get(), "m;warp_drive;size,1"));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("unknown implementation 'warp_drive'"));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("rdma_tcp (tcp)"));
  EXPECT_EQ(-EINVAL, libd_action_add_transport(a.get(), "m;;"));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("position 3"));
  ASSERT_EQ(0, libd_action_add_transport(a.get(), "m;local;size,4096"));
  EXPECT_EQ(-EEXIST, libd_action_add_transport(a.get(), "m;rdma_local;size,4096"));
  EXPECT_EQ(nullptr, libd_action_get_transport(a.get(), "nope"));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("it has: m")) << libd_last_error();
  // Every Scad name and alias resolves.
  for (const char *impl : {"rdma_local", "local", "fake"}) {
    std::string durl = std::string("x_") + impl + ";" + impl + ";size,64";
    EXPECT_EQ(0, libd_action_add_transport(a.get(), durl.c_str())) << libd_last_error();
  }
  for (const char *impl : {"rdma_shm", "shm", "rdma_tcp", "tcp", "rdma_tcp_server", "tcp_server", "rdma_shm_server", "shm_server"}) {
    std::string durl = std::string("y_") + impl + ";" + impl;
    EXPECT_EQ(0, libd_action_add_transport(a.get(), durl.c_str())) << impl << ": " << libd_last_error();
    EXPECT_EQ(LIBD_STATE_INIT, libd_transport_state(libd_action_get_transport(a.get(), (std::string("y_") + impl).c_str())));
  }
  char names[1024];
  EXPECT_EQ(12, libd_action_transport_names(a.get(), names, sizeof names));
}

TEST(Durl, BadActionOptions) {
  std::vector<std::string> bad = {"timeout_ms", "5"};
  EXPECT_FALSE(test::make_action("a", bad));
  EXPECT_NE(std::string::npos, std::string(libd_last_error()).find("expected '+key value'"));
  std::vector<std::string> dangling = {"+timeout_ms"};
  EXPECT_FALSE(test::make_action("a", dangling));
  EXPECT_FALSE(libd_action_init(nullptr, 0, nullptr));
  auto ok = test::make_action("a", {"+timeout_ms", "250"});
  ASSERT_TRUE(ok);
}
