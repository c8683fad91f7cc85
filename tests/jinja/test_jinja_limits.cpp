// Hostile templates and values (issue 25): integer edge cases, the float dict-key encoding,
// and the limits on nesting, recursion, loop iterations and output size. Each must end in a
// moeserve::Error naming what was exceeded, never a crash.
#include <gtest/gtest.h>

#include <string>

#include "../sanitize/asan_build.h"
#include "core/error.h"
#include "tokenizer/jinja/jinja.h"

using moeserve::jinja::CompiledTemplate;
using moeserve::jinja::RenderLimits;
using json = nlohmann::ordered_json;

namespace {

std::string R(const std::string& src, const json& ctx = json::object(), const RenderLimits& lim = {}) {
  return CompiledTemplate::compile(src).render(ctx, lim);
}

std::string Err(const std::string& src, const json& ctx = json::object(), const RenderLimits& lim = {}) {
  try {
    R(src, ctx, lim);
  } catch (const moeserve::Error& e) {
    return e.what();
  }
  return "";
}

std::string repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

TEST(JinjaLimits, IntegerDivisionEdgeCasesMatchPython) {
  const json ctx = {{"m", INT64_MIN}, {"x", -7}};
  EXPECT_EQ(R("{{ m % -1 }} {{ x % -1 }} {{ x // -1 }} {{ 7 // -1 }} {{ m // 1 }}", ctx),
            "0 0 7 -7 -9223372036854775808");
  // Python's answer (2**63) does not fit 64 bits: a clear error, not SIGFPE.
  EXPECT_NE(Err("{{ m // -1 }}", ctx).find("integer overflow"), std::string::npos);
  EXPECT_NE(Err("{{ -m }}", ctx).find("integer overflow"), std::string::npos);
  EXPECT_NE(Err("{{ m * -1 }}", ctx).find("integer overflow"), std::string::npos);
  EXPECT_EQ(R("{{ range(9223372036854775800, 9223372036854775807, 4) | list }}"),
            "[9223372036854775800, 9223372036854775804]");
}

TEST(JinjaLimits, FloatDictKeysRoundTrip) {
  EXPECT_EQ(R("{{ {1.5: 'a'}[1.5] }}"), "a");
  EXPECT_EQ(R("{% for k in {1.5: 1, 2: 2, none: 3} %}{{ k }},{% endfor %}"), "1.5,2,None,");
  EXPECT_EQ(R("{{ {0.25: 1} | tojson }}"), "{\"0.25\": 1}");
}

TEST(JinjaLimits, DeepTemplateNestingIsASyntaxError) {
  const std::pair<std::string, std::string> shapes[] = {{"(", ")"}, {"[", "]"}, {"not ", ""}, {"-", ""}, {"{'a': ", "}"}};
  for (const auto& [open, close] : shapes) {
    std::string src = "{{ " + repeat(open, 100000) + "1" + repeat(close, 100000) + " }}";
    EXPECT_NE(Err(src).find("nesting too deep (limit 400 levels)"), std::string::npos) << open;
  }
  EXPECT_EQ(R("{{ " + repeat("(", 50) + "1" + repeat(")", 50) + " }}"), "1");
  EXPECT_NE(Err("{{ " + repeat("1 if x else ", 100000) + "1 }}").find("nesting too deep"), std::string::npos);
  EXPECT_NE(Err(repeat("{% if x %}", 100000)).find("nesting too deep"), std::string::npos);
}

TEST(JinjaLimits, LongChainsAreBoundedToo) {
  // Left-associative chains build trees as deep as they are long.
  for (const std::string& link : {"+ 1 ", "~ 'a' ", "| string ", ".a ", "[0] ", "* 1 ", "and 1 "}) {
    std::string src = "{{ 1 " + repeat(link, 100000) + "}}";
    EXPECT_NE(Err(src).find("nesting too deep"), std::string::npos) << link;
  }
  EXPECT_EQ(R("{{ 1 " + repeat("+ 1 ", 100) + "}}"), "101");  // ordinary lengths still work
}

TEST(JinjaLimits, MacroRecursionLimit) {
  const std::string src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
  // With the default stack budget the depth limit (256) comes first, except where frames are
  // several times larger (ASan builds: scripts/sanitize.sh): then the stack budget stops it,
  // just as cleanly.
  const std::string err = Err(src);
#if MOESERVE_TEST_ASAN
  EXPECT_TRUE(err.find("maximum recursion depth (256)") != std::string::npos ||
              err.find("template recursion too deep") != std::string::npos)
      << err;
#else
  EXPECT_NE(err.find("maximum recursion depth (256)"), std::string::npos) << err;
#endif
  RenderLimits lim;
  lim.max_recursion_depth = 10;
  EXPECT_NE(Err(src, json::object(), lim).find("maximum recursion depth (10)"), std::string::npos);
}

TEST(JinjaLimits, StackBudgetBoundsRecursionWhateverItsShape) {
  // A recursive macro whose every level also nests loops and conditions (found by fuzz_jinja:
  // 256 macro levels of this shape overflowed an 8 MiB stack under ASan).
  const std::string src =
      "{% macro f(n) %}{% for i in [1] %}{% if true %}{{ ((((f(n + 1))))) }}{% endif %}{% endfor %}{% endmacro %}"
      "{{ f(0) }}";
  RenderLimits lim;
  lim.max_stack_bytes = 64 << 10;
  EXPECT_NE(Err(src, json::object(), lim).find("template recursion too deep (more than 64 KiB of stack)"),
            std::string::npos);
  const std::string err = Err(src);  // default budget: the recursion limit or the stack budget, cleanly
  EXPECT_TRUE(err.find("maximum recursion depth") != std::string::npos ||
              err.find("template recursion too deep") != std::string::npos)
      << err;
}

TEST(JinjaLimits, LoopIterationLimit) {
  RenderLimits lim;
  lim.max_loop_iterations = 1010;  // 10 outer + 10 x 100 inner
  EXPECT_EQ(R("{% for i in range(10) %}{% for j in range(100) %}{% endfor %}{% endfor %}ok", json::object(), lim),
            "ok");
  EXPECT_NE(Err("{% for i in range(11) %}{% for j in range(100) %}{% endfor %}{% endfor %}", json::object(), lim)
                .find("more than 1010 iterations"),
            std::string::npos);
  // A nest that would run 10^15 times stops at the limit.
  lim.max_loop_iterations = 100000;
  EXPECT_NE(Err("{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
                "{% endfor %}{% endfor %}{% endfor %}", json::object(), lim)
                .find("(the loop limit)"),
            std::string::npos);
  EXPECT_EQ(RenderLimits{}.max_loop_iterations, 10000000);
}

TEST(JinjaLimits, OutputAndStringSizeLimit) {
  RenderLimits lim;
  lim.max_output_bytes = 1000;
  EXPECT_EQ(R("{{ 'x' * 1000 }}", json::object(), lim).size(), 1000u);
  EXPECT_NE(Err("{{ 'x' * 600 }}{{ 'y' * 600 }}", json::object(), lim).find("output limit"), std::string::npos);
  const std::string doubling =
      "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}";
  EXPECT_NE(Err(doubling, json::object(), lim).find("output limit (1000 bytes)"), std::string::npos);
  // With the default limit doubling stops at 64 MiB instead of exhausting memory.
  EXPECT_NE(Err(doubling).find("output limit (67108864 bytes)"), std::string::npos);
  EXPECT_NE(Err("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}{% endfor %}")
                .find("size limit"),
            std::string::npos);
}

TEST(JinjaLimits, ValueNestingLimit) {
  // A list nested once per iteration: refused at kMaxValueDepth, before any recursive walk.
  const std::string src =
      "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x | length }}";
  EXPECT_NE(Err(src).find("value nested deeper than 2048 levels"), std::string::npos);
  EXPECT_EQ(R("{% set ns = namespace(x=[]) %}{% for i in range(100) %}{% set ns.x = [ns.x] %}{% endfor %}"
              "{{ ns.x | tojson | length }}"),
            "202");
  // A namespace stored in a namespace could form a cycle: refused.
  EXPECT_NE(Err("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}").find("namespace attribute"),
            std::string::npos);
  EXPECT_NE(Err("{% set ns = namespace() %}{% set ns.me = [ns] %}").find("namespace attribute"), std::string::npos);
}

}  // namespace
