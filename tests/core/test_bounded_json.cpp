// core/bounded_json.h: nesting limits for JSON from outside.
#include <gtest/gtest.h>

#include <string>

#include "core/bounded_json.h"

using namespace moeserve;

namespace {
std::string nested(int depth, const char* open = "[", const char* close = "]") {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  s += "1";
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}
}  // namespace

TEST(BoundedJson, CountsNestingOutsideStrings) {
  EXPECT_EQ(json_nesting_depth("1", 100), 0);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}]})", 100), 4);
  EXPECT_EQ(json_nesting_depth(R"(["[[[[", "\"[[[", "\\"])", 100), 1);  // brackets and escapes in strings
  EXPECT_EQ(json_nesting_depth(nested(10), 100), 10);
  EXPECT_EQ(json_nesting_depth(nested(1000000), 5), 6);  // stops counting past the limit
}

TEST(BoundedJson, ParsesWithinTheLimitAndRefusesBeyond) {
  EXPECT_EQ(parse_json_bounded(nested(512), "doc", 512).dump().size(), 512u * 2 + 1);
  try {
    parse_json_bounded(nested(513), "tokenizer.json", 512);
    FAIL() << "no error";
  } catch (const JsonDepthError& e) {
    EXPECT_STREQ(e.what(), "tokenizer.json: JSON nested deeper than 512 levels (the nesting limit)");
    EXPECT_EQ(e.limit, 512);
  }
  // 10^6 levels: refused before a DOM exists (a recursive walk of it would overflow the stack).
  EXPECT_THROW(parse_json_bounded<nlohmann::ordered_json>(nested(1000000, "{\"a\":", "}"), "body"), JsonDepthError);
  EXPECT_TRUE(parse_json_bounded_or_discarded(nested(1000000)).is_discarded());
  EXPECT_TRUE(parse_json_bounded_or_discarded("[1,").is_discarded());
  EXPECT_TRUE(parse_json_bounded_or_discarded("1e400").is_discarded());
  EXPECT_THROW(parse_json_bounded("1e400", "x"), nlohmann::json::out_of_range);
  EXPECT_THROW(parse_json_bounded("{", "x"), nlohmann::json::parse_error);
}

TEST(BoundedJson, ProcessLimitIsConfigurable) {
  EXPECT_EQ(json_depth_limit(), kDefaultJsonDepthLimit);
  set_json_depth_limit(4);
  EXPECT_THROW(parse_json_bounded(nested(5), "x"), JsonDepthError);
  EXPECT_NO_THROW(parse_json_bounded(nested(4), "x"));
  set_json_depth_limit(kDefaultJsonDepthLimit);
  EXPECT_THROW(set_json_depth_limit(0), Error);
  EXPECT_THROW(set_json_depth_limit(kMaxJsonDepthLimit + 1), Error);
}

TEST(BoundedJson, ValueDepthWithoutRecursion) {
  auto j = nlohmann::json::parse(nested(300));
  EXPECT_EQ(json_value_depth(j, 1000), 300);
  EXPECT_EQ(json_value_depth(nlohmann::json(5), 10), 0);
}
