// Reasoning and tool-call parsers: results must not depend on how the text is split.
#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "server/parsers/minimax_m2.h"
#include "server/parsers/parser.h"

using namespace moeserve::server;

namespace {

struct ToolResult {
  std::string content;
  std::vector<ToolCall> calls;  // ids blanked
  std::vector<std::string> streamed_args;
  std::vector<std::string> names;
};

ToolResult run_tools(const std::vector<std::string>& pieces, const ojson& tools) {
  auto p = make_tool_parser("minimax_m2", tools);
  ToolResult r;
  auto absorb = [&](ToolParseDelta& d) {
    r.content += d.content;
    for (auto& c : d.calls) {
      if (c.index >= static_cast<int>(r.streamed_args.size())) r.streamed_args.resize(c.index + 1);
      r.streamed_args[c.index] += c.arguments;
      if (c.name) {
        EXPECT_TRUE(c.id.has_value());
        EXPECT_EQ(c.id->size(), 29u);  // call_ + 24 hex
        r.names.push_back(*c.name);
      }
    }
  };
  for (auto& s : pieces) {
    ToolParseDelta d;
    p->push(s, d);
    absorb(d);
  }
  ToolParseDelta d;
  p->finish(d);
  absorb(d);
  r.calls = p->calls();
  for (auto& c : r.calls) c.id.clear();
  return r;
}

void expect_same(const ToolResult& a, const ToolResult& b, const std::string& where) {
  EXPECT_EQ(a.content, b.content) << where;
  EXPECT_EQ(a.streamed_args, b.streamed_args) << where;
  EXPECT_EQ(a.names, b.names) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].name, b.calls[i].name) << where;
    EXPECT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
}

// Every 2-way and 3-way split plus random splits give the whole-text result.
void check_all_splits(const std::string& text, const ojson& tools) {
  ToolResult whole = run_tools({text}, tools);
  for (size_t i = 0; i <= text.size(); ++i) {
    expect_same(whole, run_tools({text.substr(0, i), text.substr(i)}, tools), "split at " + std::to_string(i));
    for (size_t j = i; j <= text.size(); j += 7)
      expect_same(whole, run_tools({text.substr(0, i), text.substr(i, j - i), text.substr(j)}, tools),
                  "split " + std::to_string(i) + "," + std::to_string(j));
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  expect_same(whole, run_tools(bytes, tools), "bytewise");
}

const ojson kTools = ojson::parse(R"([
  {"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{
    "city":{"type":"string"},"days":{"type":"integer"},"temp":{"type":"number"},
    "metric":{"type":"boolean"},"tags":{"type":"array"},"opts":{"anyOf":[{"type":"object"},{"type":"null"}]},
    "unit":{"enum":["c","f"]}}}}},
  {"type":"function","function":{"name":"search","parameters":{"type":"object","properties":{"q":{"type":"string"}}}}}
])");

const std::string kText =
    "Let me check.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n"
    "<parameter name=\"city\">Paris \"Île\"\n</parameter>\n<parameter name=\"days\">3</parameter>\n"
    "<parameter name=\"temp\">21.5</parameter>\n<parameter name=\"metric\">yes</parameter>\n"
    "<parameter name=\"tags\">[\"a\", 1]</parameter>\n<parameter name=\"opts\">{\"x\":1}</parameter>\n"
    "<parameter name=\"unit\">c</parameter>\n<parameter name=\"extra\">null</parameter>\n</invoke>\n"
    "<invoke name=\"search\">\n<parameter name=\"q\">weather &lt; 5</parameter>\n</invoke>\n"
    "</minimax:tool_call>";

}  // namespace

TEST(MinimaxM2Tool, ParsesTypedArguments) {
  ToolResult r = run_tools({kText}, kTools);
  EXPECT_EQ(r.content, "Let me check.\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments,
            "{\"city\": \"Paris \\\"Île\\\"\", \"days\": 3, \"temp\": 21.5, \"metric\": true, \"tags\": [\"a\", 1], "
            "\"opts\": {\"x\": 1}, \"unit\": \"c\", \"extra\": null}");
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(r.calls[1].arguments, "{\"q\": \"weather &lt; 5\"}");
  EXPECT_EQ(r.streamed_args[0], r.calls[0].arguments);
  // The streamed fragments concatenate to valid JSON.
  EXPECT_NO_THROW((void)ojson::parse(r.streamed_args[0]));
}

TEST(MinimaxM2Tool, ChunkingIndependent) { check_all_splits(kText, kTools); }

TEST(MinimaxM2Tool, ChunkingIndependentEdgeCases) {
  // No tools schema (all strings), an invoke without params, a broken block, text between blocks.
  check_all_splits("<minimax:tool_call><invoke name='f'></invoke></minimax:tool_call> mid "
                   "<minimax:tool_call><invoke name=g><parameter name=a>1</parameter></invoke></minimax:tool_call>",
                   ojson());
  check_all_splits("a <minimax:tool_call> nothing here </minimax:tool_call>", kTools);
  check_all_splits("<minimax:tool_call\n not a tag <minimax:tool", kTools);
}

TEST(MinimaxM2Tool, NoToolCallIsContent) {
  ToolResult r = run_tools({"hello <minimax:tool", "x> world"}, kTools);
  EXPECT_EQ(r.content, "hello <minimax:toolx> world");
  EXPECT_TRUE(r.calls.empty());
  // A block without any invoke: the raw text is content (vLLM's non-streaming answer).
  ToolResult e = run_tools({"a <minimax:tool_call> b </minimax:tool_call>"}, kTools);
  EXPECT_EQ(e.content, "a <minimax:tool_call> b </minimax:tool_call>");
}

TEST(MinimaxM2Tool, EmptyInvokeAndUnterminated) {
  ToolResult r = run_tools({"<minimax:tool_call><invoke name=\"search\"></invoke></minimax:tool_call>"}, kTools);
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
  // Cut off by max_tokens inside an invoke: completed parameters kept, JSON closed.
  ToolResult t = run_tools({"<minimax:tool_call><invoke name=\"search\"><parameter name=\"q\">x</parameter><param"}, kTools);
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].arguments, "{\"q\": \"x\"}");
}

TEST(MinimaxM2Tool, ConvertValue) {
  auto conv = [](const std::string& v, const char* schema) {
    ojson s = ojson::parse(schema);
    return py_json_dumps(MinimaxM2ToolParser::convert_value(v, &s));
  };
  EXPECT_EQ(conv("42", R"({"type":"integer"})"), "42");
  EXPECT_EQ(conv("4_2", R"({"type":"integer"})"), "42");
  EXPECT_EQ(conv("4.0", R"({"type":"integer"})"), "4.0");   // int() fails; json fallback
  EXPECT_EQ(conv("4.0", R"({"type":"number"})"), "4");      // integral float -> int
  EXPECT_EQ(conv("1e-5", R"({"type":"number"})"), "1e-05");
  EXPECT_EQ(conv("abc", R"({"type":"number"})"), "\"abc\"");
  EXPECT_EQ(conv("None", R"({"type":"string"})"), "null");
  EXPECT_EQ(conv("off", R"({"type":"boolean"})"), "false");
  EXPECT_EQ(conv("[1,2]", R"({"type":["string","array"]})"), "[1, 2]");
  EXPECT_EQ(conv("12", R"({"type":"string"})"), "\"12\"");
  EXPECT_EQ(conv("12", R"({"enum":[1,2]})"), "12");
  EXPECT_EQ(conv("{\"b\": 1, \"a\": [true]}", R"({"type":"object"})"), "{\"b\": 1, \"a\": [true]}");
  EXPECT_EQ(conv("tab\there", R"({"type":"string"})"), "\"tab\\there\"");
}

TEST(MinimaxM2Reasoning, SplitsAtThinkEnd) {
  auto run = [](const std::vector<std::string>& pieces) {
    auto p = make_reasoning_parser("minimax_m2");
    ReasoningDelta all;
    for (auto& s : pieces) p->push(s, all);
    p->finish(all);
    return all;
  };
  std::string text = "<think>I should greet.</think>\n\nHello <b>!</b>";
  ReasoningDelta whole = run({text});
  EXPECT_EQ(whole.reasoning, "I should greet.");
  EXPECT_EQ(whole.content, "\n\nHello <b>!</b>");
  for (size_t i = 0; i <= text.size(); ++i)
    for (size_t j = i; j <= text.size(); ++j) {
      ReasoningDelta d = run({text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      ASSERT_EQ(d.reasoning, whole.reasoning) << i << "," << j;
      ASSERT_EQ(d.content, whole.content) << i << "," << j;
    }
  ReasoningDelta noend = run({"still thinking </thi"});
  EXPECT_EQ(noend.reasoning, "still thinking </thi");
  EXPECT_EQ(noend.content, "");
  ReasoningDelta plain = run({"<thin", "king>x</think>y"});
  EXPECT_EQ(plain.reasoning, "<thinking>x");
  EXPECT_EQ(plain.content, "y");
}

TEST(MinimaxM2Reasoning, AppendThink) {
  auto p = make_reasoning_parser("minimax_m2_append_think");
  EXPECT_FALSE(p->reports_reasoning());
  ReasoningDelta d;
  p->push("a</think>", d);
  p->push("b", d);
  p->finish(d);
  EXPECT_EQ(d.content, "<think>a</think>b");
  EXPECT_EQ(d.reasoning, "");
}

TEST(Parsers, Registry) {
  EXPECT_TRUE(has_tool_parser("minimax_m2"));
  EXPECT_TRUE(has_reasoning_parser("minimax_m2_append_think"));
  EXPECT_THROW(make_tool_parser("nope", ojson()), moeserve::Error);
  EXPECT_EQ(py_strip("\xe3\x80\x80 x \n"), "x");
}
