// Forced tool calls: random documents of the MiniMax-M2 tool-call grammar (random walks over
// allowed bytes) are read back by MinimaxM2ToolParser as the allowed calls with arguments that
// satisfy the declared parameters.
#include <gtest/gtest.h>

#include <random>

#include "server/parsers/minimax_m2.h"
#include "server/parsers/parser.h"
#include "grammar_docs.h"
#include "structured/matcher.h"

namespace moeserve::server {
namespace {

const ojson kTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
     "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
     "unit": {"type": "string", "enum": ["c", "f"]}, "code": {"type": "string", "pattern": "[A-Z]{2}"}},
     "required": ["city", "days"]}}},
  {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
     "a": {"type": "number"}, "opts": {"type": "object", "properties": {"round": {"type": "boolean"}}}},
     "required": ["a"]}}}
])");

using grammar_docs::byte_vocab;

void check(bool parallel, std::vector<std::string> names) {
  auto g = std::make_shared<structured::CompiledGrammar>(
      tool_call_grammar("minimax_m2", ToolCallGrammarRequest{kTools, names, parallel}), byte_vocab());
  std::mt19937 rng(parallel ? 11 : 5);
  int multi = 0;
  for (int doc = 0; doc < 40; ++doc) {
    structured::Matcher m(g);
    std::string text = grammar_docs::random_document(m, rng, {'<'});
    MinimaxM2ToolParser p(kTools);
    ToolParseDelta d;
    p.push(text, d);
    p.finish(d);
    const auto& calls = p.calls();
    ASSERT_FALSE(calls.empty()) << text;
    if (!parallel) ASSERT_EQ(calls.size(), 1u) << text;
    multi += calls.size() > 1;
    for (auto& c : calls) {
      if (!names.empty()) EXPECT_EQ(c.name, names[0]);
      ojson args = ojson::parse(c.arguments);
      if (c.name == "get_weather") {
        ASSERT_TRUE(args.contains("city") && args.contains("days")) << text;
        EXPECT_TRUE(args["city"].is_string());
        ASSERT_TRUE(args["days"].is_number_integer()) << text;
        EXPECT_GE(args["days"].get<int>(), 1);
        EXPECT_LE(args["days"].get<int>(), 7);
        if (args.contains("unit")) EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f");
        if (args.contains("code")) EXPECT_EQ(args["code"].get<std::string>().size(), 2u);
      } else {
        ASSERT_EQ(c.name, "add");
        ASSERT_TRUE(args.contains("a") && args["a"].is_number()) << text;
        if (args.contains("opts")) EXPECT_TRUE(args["opts"].is_object()) << text;
      }
    }
  }
  if (parallel) EXPECT_GT(multi, 0);
}

TEST(ToolCallGrammar, RequiredSingleCall) { check(false, {}); }
TEST(ToolCallGrammar, RequiredParallelCalls) { check(true, {}); }
TEST(ToolCallGrammar, NamedTool) { check(false, {"add"}); }

TEST(ToolCallGrammar, ErrorsAreGrammarErrors) {
  const ojson bad = ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"x": {"type": "integer", "not": {"const": 2}}}}}}])");
  EXPECT_THROW(tool_call_grammar("minimax_m2", ToolCallGrammarRequest{bad, {}, true}), structured::GrammarError);
  EXPECT_THROW(tool_call_grammar("minimax_m2", ToolCallGrammarRequest{kTools, {"nope"}, true}), structured::GrammarError);
  EXPECT_FALSE(has_tool_call_grammar("no_such_parser"));
}

}  // namespace
}  // namespace moeserve::server
