// Number bounds (minimum / maximum / exclusive, integer or fractional, negative ranges): the
// grammar's language checked against an independent exact predicate over every plain decimal
// spelling up to a size (integer parts 0..29, fractions of 0..3 digits, both signs), plus
// exponents, leading zeros, long fractions, the tool-argument caps and bound errors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "structured/json_numbers.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"

#include "grammar_test_util.h"

using namespace moeserve::structured;
using namespace moeserve::structured::testing;

namespace {

struct Lang {
  std::shared_ptr<CompiledGrammar> cg;
  explicit Lang(const std::string& schema, JsonSchemaOptions o = {})
      : cg(std::make_shared<CompiledGrammar>(grammar_from_json_schema_text(schema, o), byte_vocab())) {}
  bool has(std::string_view s) const {
    int32_t st = cg->step_bytes(cg->initial_state(), s);
    return st >= 0 && cg->accepting(st);
  }
};

// Values in units of 1e-4 (exact for the spellings and bounds used here).
int64_t scaled(const std::string& s) {
  bool neg = s[0] == '-';
  size_t i = neg ? 1 : 0, dot = s.find('.');
  std::string ip = s.substr(i, dot == std::string::npos ? std::string::npos : dot - i);
  std::string fr = dot == std::string::npos ? "" : s.substr(dot + 1);
  fr.resize(4, '0');
  int64_t v = std::stoll(ip) * 10000 + std::stoll(fr);
  return neg ? -v : v;
}

struct Range {
  const char* schema_bounds;  // the bound keywords, spliced into {"type":"number", ...}
  std::optional<std::string> lo, hi;
  bool lo_incl, hi_incl;
};

}  // namespace

TEST(JsonNumbers, BoundedNumbersAreExactlyTheDecimalsInRange) {
  const std::vector<Range> ranges = {
      {R"("minimum":0,"exclusiveMaximum":1)", "0", "1", true, false},
      {R"("minimum":0,"maximum":1)", "0", "1", true, true},
      {R"("exclusiveMinimum":0)", "0", std::nullopt, false, true},
      {R"("minimum":-2.5,"maximum":3.75)", "-2.5", "3.75", true, true},
      {R"("exclusiveMinimum":-1,"exclusiveMaximum":-0.5)", "-1", "-0.5", false, false},
      {R"("maximum":10)", std::nullopt, "10", true, true},
      {R"("exclusiveMaximum":0)", std::nullopt, "0", true, false},
      {R"("maximum":0)", std::nullopt, "0", true, true},
      {R"("minimum":5,"maximum":5)", "5", "5", true, true},
      {R"("minimum":0.125,"maximum":0.13)", "0.125", "0.13", true, true},
      {R"("minimum":1.05,"exclusiveMaximum":12.5)", "1.05", "12.5", true, false},
      {R"("minimum":-13.001,"maximum":-12.999)", "-13.001", "-12.999", true, true},
      {R"("exclusiveMinimum":0.5,"minimum":0.25,"maximum":21)", "0.5", "21", false, true},  // tighter wins
      {R"("minimum":2,"exclusiveMinimum":true,"maximum":3,"exclusiveMaximum":true)", "2", "3", false, false},  // draft 4
      {R"("minimum":-0.001)", "-0.001", std::nullopt, true, true},
  };
  std::vector<std::string> spellings;
  std::vector<std::string> fracs{""};
  for (int n = 1; n <= 3; ++n)
    for (int v = 0, top = n == 1 ? 10 : n == 2 ? 100 : 1000; v < top; ++v) {
      std::string f = std::to_string(v);
      fracs.push_back("." + std::string(size_t(n) - f.size(), '0') + f);
    }
  for (const char* sign : {"", "-"})
    for (int ip = 0; ip < 30; ++ip)
      for (auto& f : fracs) spellings.push_back(sign + std::to_string(ip) + f);
  for (const auto& r : ranges) {
    Lang lang(std::string(R"({"type":"number",)") + r.schema_bounds + "}");
    const bool negatives = !r.lo || scaled(*r.lo) < 0;
    int in = 0;
    for (const auto& s : spellings) {
      int64_t v = scaled(s);
      bool ok = (!r.lo || (r.lo_incl ? v >= scaled(*r.lo) : v > scaled(*r.lo))) &&
                (!r.hi || (r.hi_incl ? v <= scaled(*r.hi) : v < scaled(*r.hi)));
      if (s[0] == '-' && v == 0) ok = ok && negatives && s != "-0";  // "-0.0..." only with negatives in range
      ASSERT_EQ(lang.has(s), ok) << r.schema_bounds << " on " << s;
      in += ok;
    }
    EXPECT_GT(in, 0) << r.schema_bounds;
    // No exponents, leading zeros or bare signs in a bounded number; long fractions are fine.
    for (const char* bad : {"1e0", "0.5e0", "1E1", "00", "01", "-", ".5", "0.", "+1", "--1"}) EXPECT_FALSE(lang.has(bad)) << bad;
  }
  Lang unit(R"({"type":"number","minimum":0,"exclusiveMaximum":1})");
  EXPECT_TRUE(unit.has("0.99999999999999999999"));
  EXPECT_TRUE(unit.has("0.00000000000000000001"));
  EXPECT_TRUE(unit.has("0.5000000000000000000"));
  EXPECT_FALSE(unit.has("1.00000000000000000000"));
  Lang big(R"({"type":"number","minimum":-1e15})");
  EXPECT_TRUE(big.has("-1000000000000000"));
  EXPECT_TRUE(big.has("-999999999999999.9999999"));
  EXPECT_FALSE(big.has("-1000000000000000.0000001"));
  EXPECT_TRUE(big.has("123456789012345678901234567890.5"));  // no upper bound
  Lang tiny(R"({"type":"number","exclusiveMinimum":1e-7,"maximum":2e-7})");
  EXPECT_TRUE(tiny.has("0.0000002"));
  EXPECT_TRUE(tiny.has("0.00000010000001"));
  EXPECT_FALSE(tiny.has("0.0000001"));
  EXPECT_FALSE(tiny.has("0.00000020000001"));
}

TEST(JsonNumbers, ToolArgumentCapsAndTypeLists) {
  JsonSchemaOptions capped;
  capped.bounded_numbers = true;
  Lang lang(R"({"type":"number","minimum":0})", capped);
  EXPECT_TRUE(lang.has("123456789012345678.1234567890123456"));    // 18 + 16 digits
  EXPECT_FALSE(lang.has("1234567890123456789"));                   // 19 integer digits
  EXPECT_FALSE(lang.has("1.12345678901234567"));                   // 17 fraction digits
  Lang both(R"({"type":["integer","number","null"],"minimum":1.5,"maximum":3})");
  EXPECT_TRUE(both.has("2"));
  EXPECT_TRUE(both.has("1.5"));
  EXPECT_TRUE(both.has("null"));
  EXPECT_FALSE(both.has("1"));
  EXPECT_FALSE(both.has("3.01"));
  Lang untyped(R"({"exclusiveMaximum":1})");  // a bound alone means a number
  EXPECT_TRUE(untyped.has("0.5"));
  EXPECT_FALSE(untyped.has("1"));
}

TEST(JsonNumbers, BoundErrorsAreNamed) {
  EXPECT_NE(schema_error(R"({"type":"number","minimum":2,"maximum":1})").find("no value"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"number","minimum":1,"exclusiveMaximum":1})").find("no value"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"number","exclusiveMinimum":0,"maximum":0})").find("no value"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"number","maximum":"3"})").find("'maximum' must be a number"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"number","maximum":1e300})").find("'maximum' is out of the supported range"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"number","minimum":1e-60})").find("'minimum' is out of the supported range"), std::string::npos);
  EXPECT_EQ(schema_error(R"({"type":"number","minimum":0,"maximum":0})"), "no error");
}

TEST(JsonNumbers, DecimalsAreWhatTheSchemaWrote) {
  auto dec = [](const char* text) { return parse_decimal(nlohmann::ordered_json::parse(text), "x"); };
  EXPECT_EQ(dec("0.1").frac, "1");
  EXPECT_EQ(dec("-2.50").ip, 2);
  EXPECT_TRUE(dec("-2.50").neg);
  EXPECT_EQ(dec("-2.50").frac, "5");
  EXPECT_EQ(dec("1e-7").frac, "0000001");
  EXPECT_EQ(dec("1.5e3").ip, 1500);
  EXPECT_TRUE(dec("1.5e3").frac.empty());
  EXPECT_FALSE(dec("-0.0").neg);
  EXPECT_LT(compare(dec("-1"), dec("-0.5")), 0);
  EXPECT_EQ(compare(dec("0.50"), dec("0.5")), 0);
  EXPECT_GT(compare(dec("0.05"), dec("0.049999")), 0);
}

// multipleOf on integers: exactly the multiples in range, checked for every integer in
// [-1200, 1200] (and a few large ones against unbounded sides); fractional multipleOf and
// multipleOf on numbers stay a 400 naming the keyword.
TEST(JsonNumbers, IntegerMultipleOfIsExact) {
  struct Case { const char* extra; int m; std::optional<int64_t> lo, hi; };
  const std::vector<Case> cases = {
      {"", 3, std::nullopt, std::nullopt},      {"", 7, std::nullopt, std::nullopt},
      {"", 12, std::nullopt, std::nullopt},     {R"(,"minimum":0,"maximum":1000)", 25, 0, 1000},
      {R"(,"exclusiveMinimum":-50,"maximum":7)", 4, -49, 7},   {R"(,"minimum":100)", 13, 100, std::nullopt},
      {R"(,"maximum":-3)", 6, std::nullopt, -3},              {R"(,"minimum":5,"maximum":5)", 5, 5, 5},
      {R"(,"minimum":-999,"maximum":999)", 1, -999, 999},      {R"(,"minimum":1)", 1000, 1, std::nullopt},
  };
  for (const auto& c : cases) {
    std::string schema = std::string(R"({"type":"integer","multipleOf":)") + std::to_string(c.m) + c.extra + "}";
    Lang lang(schema);
    for (int64_t v = -1200; v <= 1200; ++v) {
      bool ok = v % c.m == 0 && (!c.lo || v >= *c.lo) && (!c.hi || v <= *c.hi);
      ASSERT_EQ(lang.has(std::to_string(v)), ok) << schema << " on " << v;
    }
    for (int64_t v : {123456789012LL, -98765432101234LL, 1000000000000000000LL}) {
      bool ok = v % c.m == 0 && (!c.lo || v >= *c.lo) && (!c.hi || v <= *c.hi);
      EXPECT_EQ(lang.has(std::to_string(v)), ok) << schema << " on " << v;
    }
    EXPECT_FALSE(lang.has("-0"));
    EXPECT_FALSE(lang.has("03"));
  }
  Lang two(R"({"type":"integer","multipleOf":2.0})");
  EXPECT_TRUE(two.has("4"));
  EXPECT_FALSE(two.has("5"));
  EXPECT_NE(schema_error(R"({"type":"integer","multipleOf":1.5})").find("'multipleOf' must be a positive whole number"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"integer","multipleOf":0})").find("'multipleOf' must be a positive whole number"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"integer","multipleOf":1e9})").find("limit"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"number","multipleOf":0.5})").find("'multipleOf' is supported only for type 'integer'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"multipleOf":2})").find("'multipleOf'"), std::string::npos);
  EXPECT_NE(schema_error(R"({"type":"integer","multipleOf":10,"minimum":1,"maximum":9})").find("admit no value"), std::string::npos);
}
