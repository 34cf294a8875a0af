#include <gtest/gtest.h>

#include "core/params.h"

TEST(Params, Sizes) {
  uint64_t v;
  EXPECT_TRUE(libd::parse_size("4096", &v)); EXPECT_EQ(4096u, v);
  EXPECT_TRUE(libd::parse_size("64KiB", &v)); EXPECT_EQ(64u << 10, v);
  EXPECT_TRUE(libd::parse_size("512MiB", &v)); EXPECT_EQ(512ull << 20, v);
  EXPECT_TRUE(libd::parse_size("1G", &v)); EXPECT_EQ(1ull << 30, v);
  EXPECT_TRUE(libd::parse_size("10MB", &v)); EXPECT_EQ(10000000u, v);
  for (const char *bad : {"", "MiB", "-1", "1.5GiB", "12 MiB", "1XiB", "99999999999999999999", "20000000TiB"})
    EXPECT_FALSE(libd::parse_size(bad, &v)) << bad;
}

TEST(Params, TypedReadsNameTheKeyAndRedactSecrets) {
  libd::Params p({{"port", "x"}, {"secret", "s3cr3t"}, {"size", "1Q"}});
  uint64_t v;
  EXPECT_EQ(-EINVAL, p.get_u64("port", 0, &v));
  EXPECT_EQ(-EINVAL, p.get_size("size", 0, &v));
  EXPECT_EQ(0, p.get_u64("absent", 7, &v));
  EXPECT_EQ(7u, v);
  EXPECT_EQ(std::string::npos, p.redacted().find("s3cr3t"));
  EXPECT_NE(std::string::npos, p.redacted().find("secret,<redacted>"));
}

TEST(Params, AssignmentsFromTheCommandLine) {
  libd::Params p;
  ASSERT_TRUE(libd::parse_assignments("dev=rxe0,gid_index=1,mw=", &p));
  EXPECT_EQ("rxe0", p.get_or("dev", ""));
  EXPECT_EQ("1", p.get_or("gid_index", ""));
  EXPECT_TRUE(p.has("mw"));
  EXPECT_EQ("", p.get_or("mw", "x"));
  libd::Params bad;
  EXPECT_FALSE(libd::parse_assignments("dev", &bad));
  EXPECT_FALSE(libd::parse_assignments("dev=rxe0,,mw=0", &bad));
  EXPECT_FALSE(libd::parse_assignments("=rxe0", &bad));
  EXPECT_FALSE(libd::parse_assignments("", &bad));
}
