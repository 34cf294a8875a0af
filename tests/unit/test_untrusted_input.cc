// The daemons' readers of untrusted input: JSON bodies and replies, launcher and agent replies,
// action limits, an action's code, list parameters and manifests. Each case here once crashed scad-server or could have.
#include <gtest/gtest.h>

#include <string>

#include "action_code.h"
#include "action_limits.h"
#include "agent_api.h"
#include "connection_guard.h"
#include "flag_number.h"
#include "flags.h"
#include "launcher_reply.h"
#include "list_page.h"
#include "manifest.h"
#include "safe_json.h"

namespace scad {
namespace {

using nlohmann::json;

TEST(SafeJson, RefusesNestingPastTheLimitWithoutBuildingIt) {
  json j;
  std::string why;
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_FALSE(parse_json(deep, &j, &why));
  EXPECT_NE(why.find("nests deeper than 128"), std::string::npos) << why;
  std::string at_limit = std::string(128, '[') + std::string(128, ']');
  ASSERT_TRUE(parse_json(at_limit, &j, &why)) << why;
  EXPECT_EQ(json_depth(j), 128);
  std::string past = "{\"a\":" + std::string(128, '[') + std::string(128, ']') + "}";
  EXPECT_FALSE(parse_json(past, &j, &why));
  EXPECT_FALSE(parse_json(std::string(100000, '{'), &j, &why));  // unterminated and deep
}

TEST(SafeJson, SaysWhereTextIsNotJson) {
  json j;
  std::string why;
  EXPECT_FALSE(parse_json("{not json", &j, &why));
  EXPECT_NE(why.find("not JSON (at line 1, column 3"), std::string::npos) << why;
  EXPECT_FALSE(parse_json("\"\xff\"", &j, &why));  // invalid UTF-8 inside a string is refused too
  EXPECT_FALSE(parse_json("", &j, &why));
}

TEST(SafeJson, DumpsInvalidUtf8WithReplacement) {
  json j = {{"log", std::string("a\xff\xfe" "b")}, {std::string("k\xc3"), 1}};
  EXPECT_THROW(j.dump(), json::type_error);  // what used to end scad-server
  std::string out = dump_json(j);
  EXPECT_EQ(out, "{\"k\xEF\xBF\xBD\":1,\"log\":\"a\xEF\xBF\xBD\xEF\xBF\xBD" "b\"}");
}

TEST(SafeJson, ValidUtf8ReplacesEachBadByte) {
  EXPECT_EQ(valid_utf8("plain"), "plain");
  EXPECT_EQ(valid_utf8("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"), "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");  // é € 😀
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(valid_utf8("\xff"), R);
  EXPECT_EQ(valid_utf8("\xc0\xaf"), R + R);              // overlong '/'
  EXPECT_EQ(valid_utf8("\xed\xa0\x80"), R + R + R);      // a surrogate
  EXPECT_EQ(valid_utf8("\xf4\x90\x80\x80"), R + R + R + R);  // past U+10FFFF
  EXPECT_EQ(valid_utf8("ab\xe2\x82"), "ab" + R + R);     // cut short
  EXPECT_EQ(valid_utf8(std::string("a\0b", 3)), std::string("a\0b", 3));
}

TEST(SafeJson, TypedReadersNeverThrow) {
  json j = json::parse(R"({"s": "x", "n": -1, "big": 18446744073709551615, "f": 1.5, "b": true})");
  EXPECT_EQ(get_string(j, "s"), "x");
  EXPECT_EQ(get_string(j, "n"), std::nullopt);
  EXPECT_EQ(get_uint(j, "n"), std::nullopt);
  EXPECT_EQ(get_int(j, "n"), -1);
  EXPECT_EQ(get_int(j, "big"), std::nullopt);
  EXPECT_EQ(get_uint(j, "big"), 18446744073709551615ull);
  EXPECT_EQ(get_int(j, "f"), std::nullopt);
  EXPECT_EQ(get_bool(j, "b"), true);
  EXPECT_EQ(get_bool(json::array(), "b"), std::nullopt);
  EXPECT_EQ(get_number(json(5), "n"), std::nullopt);
}

TEST(LauncherReply, OnlyTheLaunchersShapeIsTaken) {
  LauncherReply r;
  std::string why;
  EXPECT_FALSE(parse_launcher_reply(R"({"ok": 1})", &r, &why));
  EXPECT_FALSE(parse_launcher_reply(R"({"ok": "yes"})", &r, &why));
  EXPECT_FALSE(parse_launcher_reply(R"({"ok": true})", &r, &why));  // no result
  EXPECT_FALSE(parse_launcher_reply("[1]", &r, &why));
  EXPECT_FALSE(parse_launcher_reply(std::string(50000, '[') , &r, &why));
  ASSERT_TRUE(parse_launcher_reply(R"({"ok": true, "result": [1, 2], "init_ms": 7})", &r, &why)) << why;
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.result, json::array({1, 2}));
  EXPECT_EQ(r.init_ms, 7);
  ASSERT_TRUE(parse_launcher_reply(R"({"ok": false, "error": {"type": "E", "message": "m", "traceback": 7}, "init_ms": "x"})",
                                   &r, &why));
  EXPECT_EQ(r.error, (json{{"type", "E"}, {"message", "m"}}));
  EXPECT_EQ(r.traceback, "");
  EXPECT_EQ(r.init_ms, 0);
  ASSERT_TRUE(parse_launcher_reply(R"({"ok": false, "error": ["odd"]})", &r, &why));
  EXPECT_EQ(r.error, (json{{"type", "Error"}, {"message", "[\"odd\"]"}}));
}

TEST(LauncherReply, AnInitFailureSaysWhichOnly) {
  LauncherReply r;
  std::string why;
  ASSERT_TRUE(parse_launcher_reply(R"({"ok": false, "error": {"type": "InitError", "message": "m", "init": "start"}})", &r, &why));
  EXPECT_EQ(r.init, "start");
  EXPECT_EQ(r.error, (json{{"type", "InitError"}, {"message", "m"}}));
  ASSERT_TRUE(parse_launcher_reply(R"({"ok": false, "error": {"type": "E", "message": "m", "init": "anything"}})", &r, &why));
  EXPECT_EQ(r.init, "");
  ASSERT_TRUE(parse_launcher_reply(R"({"ok": false, "error": {"type": "E", "message": "m", "init": ["start"]}})", &r, &why));
  EXPECT_EQ(r.init, "");
}

TEST(ActionCode, AZipIsTakenOnlyAsBase64OfAZip) {
  const std::string zip =
      "UEsDBBQAAAAAAEY2eF1YXf+qFgAAABYAAAALAAAAX19tYWluX18ucHlkZWYgbWFpbihhKTogcmV0dXJuIGEKUEsBAhQDFAAAAAAARjZ4XVhd/6oW"
      "AAAAFgAAAAsAAAAAAAAAAAAAAIABAAAAAF9fbWFpbl9fLnB5UEsFBgAAAAABAAEAOQAAAD8AAAAAAA==";
  EXPECT_EQ(check_zip_code(zip), "");
  EXPECT_EQ(check_zip_code("\n  " + zip + "\n"), "");              // white space around, as OpenWhisk trims it
  EXPECT_EQ(check_zip_code("UEsFBgAAAAAAAAAAAAAAAAAAAAAAAA=="), "");  // empty: it fails when it runs
  for (const std::string bad : {"", "%%%%", "UEsDB", "UEsD Bxxx", "UEsDBA=A", "UEsDBAA=="})
    EXPECT_NE(check_zip_code(bad).find("it is not base64"), std::string::npos) << bad;
  for (const std::string bad : {"bm90IGEgemlw", "UEsDBCBub3QgcmVhbGx5IGEgemlw"})  // "not a zip", "PK\3\4 not really a zip"
    EXPECT_NE(check_zip_code(bad).find("it is not a zip file"), std::string::npos) << bad;
  EXPECT_TRUE(is_zip_code({{"code", "def main(a): return a"}, {"binary", true}}));
  EXPECT_TRUE(is_zip_code({{"code", " " + zip}}));  // a client that sends a zip without the flag
  EXPECT_FALSE(is_zip_code({{"code", "def main(a): return a"}}));
  EXPECT_FALSE(is_zip_code({{"code", "def main(a): return a"}, {"binary", "yes"}}));  // a flag that is not a boolean is none
  EXPECT_FALSE(is_zip_code({{"code", 7}, {"binary", "yes"}}));
}

TEST(ActionCode, TheExecSizeLimitIsOpenWhisks) {
  EXPECT_EQ(check_exec_size(std::string(kMaxExecBytes - 4, 'x'), "main"), "");
  EXPECT_EQ(check_exec_size(std::string(kMaxExecBytes - 3, 'x'), "main"),
            "exec larger than allowed: 50331649 > 50331648 bytes.");
}

TEST(ListPage, LimitAndSkipAsOpenWhiskReadsThem) {
  ListPage p;
  EXPECT_EQ(parse_list_page("actions", nullptr, nullptr, &p), "");
  EXPECT_EQ(p.limit, 30);
  EXPECT_EQ(p.skip, 0);
  std::string zero = "0", five = "5", max = "200", plus = "+7";
  EXPECT_EQ(parse_list_page("actions", &zero, &five, &p), "");
  EXPECT_EQ(p.limit, 200);  // 0 is the most there is
  EXPECT_EQ(p.skip, 5);
  EXPECT_EQ(parse_list_page("actions", &max, &plus, &p), "");
  EXPECT_EQ(p.limit, 200);
  EXPECT_EQ(p.skip, 7);
  std::string over = "201", minus = "-1", word = "many", huge = "99999999999", empty = "", half = "1.5";
  EXPECT_EQ(parse_list_page("actions", &over, nullptr, &p), "The value '201' is not in the range of 0 to 200 for actions.");
  EXPECT_EQ(parse_list_page("rules", &minus, nullptr, &p), "The value '-1' is not in the range of 0 to 200 for rules.");
  EXPECT_EQ(parse_list_page("triggers", nullptr, &minus, &p),
            "The value '-1' is not greater than or equal to 0 for triggers.");
  for (auto *bad : {&word, &huge, &empty, &half}) {
    EXPECT_EQ(parse_list_page("packages", bad, nullptr, &p), "The value '" + *bad + "' is not an integer for packages.");
    EXPECT_EQ(parse_list_page("packages", nullptr, bad, &p), "The value '" + *bad + "' is not an integer for packages.");
  }
}

TEST(AgentReplies, AnOutcomeMustAgreeWithItself) {
  ComputeOutcome o;
  std::string why;
  EXPECT_FALSE(outcome_from_json(json::parse(R"({"ok": "yes"})"), &o, &why));
  EXPECT_FALSE(outcome_from_json(json::parse(R"({"ok": true, "status": "application error"})"), &o, &why));
  EXPECT_FALSE(outcome_from_json(json::parse(R"({"ok": false, "status": "made up"})"), &o, &why));
  EXPECT_FALSE(outcome_from_json(json(3), &o, &why));
  ASSERT_TRUE(outcome_from_json(json::parse(R"({"ok": true, "status": "success", "result": 1,
                                                "logs": ["a", 2], "init_ms": -5, "start": 9})"), &o, &why));
  EXPECT_EQ(o.logs, (std::vector<std::string>{"a", "2"}));
  EXPECT_EQ(o.init_ms, 0);
  EXPECT_EQ(o.start, "");
  ASSERT_TRUE(outcome_from_json(json::parse(R"({"ok": false, "status": "application error", "error": 5})"), &o, &why));
  EXPECT_EQ(o.error["type"], "AgentError");
}

TEST(ActionLimits, StoredLimitsAreCheckedAgainstTheirRanges) {
  LimitRanges r;
  json out;
  std::string why;
  EXPECT_FALSE(validate_limits(json{{"timeout", "soon"}}, r, &out, &why));
  EXPECT_NE(why.find("'timeout' must be an integer from 100 to 300000 ms"), std::string::npos) << why;
  EXPECT_FALSE(validate_limits(json(5), r, &out, &why));
  EXPECT_FALSE(validate_limits(json{{"timeout", -1}}, r, &out, &why));
  EXPECT_FALSE(validate_limits(json{{"timeout", uint64_t(1) << 63}}, r, &out, &why));
  EXPECT_FALSE(validate_limits(json{{"memory", 1e-9}}, r, &out, &why));
  EXPECT_FALSE(validate_limits(json{{"size", 1}}, r, &out, &why));
  ASSERT_TRUE(validate_limits(json{{"timeout", 100}, {"logs", 0}}, r, &out, &why)) << why;
  EXPECT_EQ(out, (json{{"timeout", 100}, {"memory", 256}, {"logs", 0}, {"concurrency", 1}}));
}

TEST(ActionLimits, TheOperatorSetsTheRanges) {
  LimitRanges r;
  std::string why;
  ASSERT_TRUE(parse_limit_ranges("timeout=1000:900000:120000,memory=64:2048", &r, &why)) << why;
  EXPECT_EQ(r.timeout_ms.max, 900000);
  EXPECT_EQ(r.timeout_ms.dflt, 120000);
  EXPECT_EQ(r.memory_mb.min, 64);
  EXPECT_EQ(r.memory_mb.dflt, 256);
  EXPECT_FALSE(parse_limit_ranges("timeout=5:1", &r, &why));
  EXPECT_FALSE(parse_limit_ranges("timeout=-1:5", &r, &why));
  EXPECT_FALSE(parse_limit_ranges("speed=1:2", &r, &why));
  EXPECT_FALSE(parse_limit_ranges("timeout", &r, &why));
  EXPECT_FALSE(parse_limit_ranges("timeout=1:99999999999999999999", &r, &why));
}

TEST(ActionLimits, AStoredDocumentIsReadDefensively) {
  LimitRanges r;
  for (json doc : {json{{"limits", {{"timeout", "soon"}}}}, json{{"limits", 5}}, json(7), json::object(),
                   json{{"limits", {{"timeout", -1}, {"memory", 1 << 30}}}}}) {
    ActionLimits a = effective_limits(doc, r);
    EXPECT_EQ(a.timeout_ms, 60000) << doc;
    EXPECT_EQ(a.memory_bytes, 256ull << 20) << doc;
  }
  EXPECT_EQ(effective_limits(json{{"limits", {{"timeout", 500}}}}, r).timeout_ms, 500);
}

TEST(Manifest, HugeScalarsDeepNestingAndAliasBombsAreRefused) {
  json doc;
  std::string why;
  std::string digits(100000, '7');
  ASSERT_TRUE(manifest_to_json("name: x\nelements:\n  m: {kind: memory, size: " + digits + "}\n", &doc, &why)) << why;
  EXPECT_EQ(doc["elements"]["m"]["size"], digits);  // too long to be a number: kept as text
  auto problems = validate_manifest(doc, {}, Capacity{}, nullptr);
  ASSERT_FALSE(problems.empty());
  EXPECT_NE(problems[0].find("'size' must be a size"), std::string::npos) << problems[0];
  EXPECT_FALSE(manifest_to_json("a: " + std::string(100000, '['), &doc, &why));
  EXPECT_FALSE(manifest_to_json(std::string(70, '[') + std::string(70, ']'), &doc, &why));
  EXPECT_NE(why.find("nests deeper than 64"), std::string::npos) << why;
  std::string laughs = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 1; i < 9; i++) {
    std::string prev = "*a" + std::to_string(i - 1);
    laughs += "a" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
    for (int k = 0; k < 10; k++) laughs += (k ? ", " : "") + prev;
    laughs += "]\n";
  }
  EXPECT_FALSE(manifest_to_json(laughs, &doc, &why));
  EXPECT_NE(why.find("expands to more than 100000 values"), std::string::npos) << why;
  ASSERT_TRUE(manifest_to_json("a: -12\nb: 1.5e3\nc: 12a\nd: '7'\ne: .5\nf: 99999999999999999999\n", &doc, &why));
  EXPECT_EQ(doc, json::parse(R"({"a": -12, "b": 1500.0, "c": "12a", "d": "7", "e": 0.5, "f": "99999999999999999999"})"));
}

TEST(Manifest, LimitsAreClamped) {
  auto problems_of = [](const std::string &element) {
    json doc;
    std::string why;
    EXPECT_TRUE(manifest_to_json("name: x\nelements:\n  a: {kind: compute, code: a.py, " + element + "}\n", &doc, &why));
    std::string all;
    for (auto &p : validate_manifest(doc, {"a.py"}, Capacity{}, nullptr)) all += p + "\n";
    return all;
  };
  EXPECT_NE(problems_of("cpu: 1e-9").find("'cpu' must be"), std::string::npos);
  EXPECT_NE(problems_of("timeout: -1").find("'timeout' must be"), std::string::npos);
  EXPECT_NE(problems_of("timeout: 1000000000000000").find("'timeout' must be"), std::string::npos);
  EXPECT_NE(problems_of("memory: 1KiB").find("'memory' must be"), std::string::npos);
  EXPECT_EQ(problems_of("cpu: 0.5, timeout: 1000, memory: 64MiB"), "");
  // Fields of the wrong type are problems, not exceptions (found by fuzz_manifest).
  json doc = json::parse(R"({"name": "x", "elements": {"m": {"kind": ["memory"]}, "a": {"kind": "compute",
                            "code": "a.py", "transports": {"t": {"element": "m", "rights": 5}}}}})");
  std::string all;
  for (auto &p : validate_manifest(doc, {"a.py"}, Capacity{}, nullptr)) all += p + "\n";
  EXPECT_NE(all.find("'kind' must be 'memory' or 'compute'"), std::string::npos) << all;
  EXPECT_NE(all.find("rights must be r, w or rw"), std::string::npos) << all;
}

TEST(Manifest, AnEnvironmentIsBoundedAndLeavesThePlatformsNamesAlone) {
  auto problems_of = [](const json &environment) {
    json doc = {{"name", "x"}, {"elements", {{"a", {{"kind", "compute"}, {"code", "a.py"}, {"environment", environment}}}}}};
    std::string all;
    for (auto &p : validate_manifest(doc, {"a.py"}, Capacity{}, nullptr)) all += p + "\n";
    return all;
  };
  EXPECT_EQ(problems_of({{"NPY_DISABLE_CPU_FEATURES", "AVX512F"}, {"_x9", ""}}), "");
  EXPECT_NE(problems_of(json::array()).find("must map variable names to text"), std::string::npos);
  EXPECT_NE(problems_of({{"A-B", "x"}}).find("letters, digits and '_'"), std::string::npos);
  EXPECT_NE(problems_of({{"__OW_NAMESPACE", "x"}}).find("platform's"), std::string::npos);
  EXPECT_NE(problems_of({{"A", std::string("a\0b", 3)}}).find("NUL"), std::string::npos);
  json many = json::object();
  for (int i = 0; i < 65; i++) many["V" + std::to_string(i)] = "x";
  EXPECT_NE(problems_of(many).find("at most 64"), std::string::npos);
  std::string secret = "s3cr3t-" + std::string(5000, 'x');
  std::string big = problems_of({{"BIG", secret}});
  EXPECT_NE(big.find("at most 4096"), std::string::npos) << big;
  EXPECT_EQ(big.find("s3cr3t"), std::string::npos) << "a problem never shows a value";
  ComputeSpec s = spec_from_json({{"aid", "a"}, {"code", "c"}, {"code_key", "k"}, {"code_files", json::object()},
                                  {"env", {{"__OW_NAMESPACE", "ns"}, {"MODE", "fast"}, {"SCAD_RUNTIME_URL", "x"},
                                           {"A B", "x"}, {"N", 3}, {"Z", std::string("a\0b", 3)}}}});
  EXPECT_EQ(s.env, (std::map<std::string, std::string>{{"__OW_NAMESPACE", "ns"}, {"MODE", "fast"}}))
      << "the agent takes no variable a manifest could not set";
}

TEST(DaemonFlags, NumbersAreCheckedNotThrown) {
  double v = 0;
  EXPECT_TRUE(flag_number("3233", 0, 65535, true, &v));
  EXPECT_EQ(v, 3233);
  EXPECT_TRUE(flag_number("0.5", 0.01, 1e6, false, &v));
  for (const char *bad : {"", "abc", "12x", " 5", "1e400", "nan", "inf", "-1", "65536", "1.5"})
    EXPECT_FALSE(flag_number(bad, 0, 65535, true, &v)) << bad;
  EXPECT_FALSE(flag_number(std::string(1000, '9'), 0, 1e300, false, &v));
}

TEST(ConnectionLimits, ParsesEachKeyAndRefusesTheRest) {
  ConnectionLimits l;
  std::string why;
  ASSERT_TRUE(parse_connection_limits("deadline=1500,per-client=8", &l, &why)) << why;
  EXPECT_EQ(l.request_deadline_ms, 1500);
  EXPECT_EQ(l.per_client, 8);
  EXPECT_EQ(l.min_body_bytes_per_s, 1 << 20);  // untouched
  ASSERT_TRUE(parse_connection_limits("body-rate=2048", &l, &why)) << why;
  EXPECT_EQ(l.min_body_bytes_per_s, 2048);
  for (const char *bad : {"", "deadline", "deadline=", "deadline=50", "deadline=-1", "per-client=0",
                          "per-client=1e3", "colour=red", "deadline=1000,", "body-rate=99999999999999999999"}) {
    ConnectionLimits before = l;
    EXPECT_FALSE(parse_connection_limits(bad, &l, &why)) << bad;
    EXPECT_EQ(l.request_deadline_ms, before.request_deadline_ms) << bad;  // nothing half-applied
    EXPECT_NE(why.find("--connection-limits"), std::string::npos);
  }
}

TEST(DaemonFlags, SizesAndTheParserRefuseNonsense) {
  uint64_t v = 0;
  EXPECT_TRUE(parse_byte_size("4096", &v));
  EXPECT_EQ(v, 4096u);
  EXPECT_TRUE(parse_byte_size("64KiB", &v));
  EXPECT_EQ(v, 65536u);
  EXPECT_TRUE(parse_byte_size("10MB", &v));
  EXPECT_EQ(v, 10000000u);
  for (const char *bad : {"", "GiB", "4 GiB", "-1", "4gib", "1e9", "99999999999999999999", "2000TiB", "4GiBs"})
    EXPECT_FALSE(parse_byte_size(bad, &v)) << bad;

  std::string home;
  int port = 1;
  bool flag = false;
  uint64_t pool = 0;
  Flags f("t", "a test");
  f.text("--home", "DIR", "h", &home).integer("--port", "p", 0, 65535, &port).toggle("--x", "x", &flag).bytes("--pool", "s", &pool);
  std::vector<std::string> args = {"t", "--home", "/h", "--x", "--port", "80", "--pool", "1GiB"};
  std::vector<char *> argv;
  for (auto &a : args) argv.push_back(a.data());
  auto given = f.parse(int(argv.size()), argv.data());
  EXPECT_EQ(given, (std::vector<std::string>{"--home", "--x", "--port", "--pool"}));
  EXPECT_EQ(home, "/h");
  EXPECT_EQ(port, 80);
  EXPECT_TRUE(flag);
  EXPECT_EQ(pool, 1ull << 30);
  EXPECT_NE(f.usage().find("--pool SIZE"), std::string::npos);
  // A bad value or flag is a usage error (exit 2) naming the flag, never an exception.
  for (std::vector<std::string> bad : {std::vector<std::string>{"t", "--port", "http"}, {"t", "--port"}, {"t", "--colour", "red"},
                                       {"t", "--pool", "lots"}}) {
    std::vector<char *> bargv;
    for (auto &a : bad) bargv.push_back(a.data());
    EXPECT_EXIT(f.parse(int(bargv.size()), bargv.data()), testing::ExitedWithCode(2), bad[1]) << bad[1];
  }
}

}  // namespace
}  // namespace scad
