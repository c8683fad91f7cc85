// Qwen3's parsers: `hermes` tool calls and `qwen3` reasoning. Expected values are what vLLM
// returns (non-streaming arguments = Python json.dumps(ensure_ascii=False) of the parsed
// arguments); every split of the text must give the same result as the whole text.
#include <gtest/gtest.h>

#include <random>

#include "server/parsers/parser.h"
#include "server/parsers/qwen3.h"
#include "grammar_docs.h"
#include "structured/matcher.h"

namespace moeserve::server {
namespace {

struct ToolResult {
  std::string content;
  std::vector<ToolCall> calls;  // ids blanked
  std::vector<std::string> streamed_args;
  std::vector<std::string> names;
};

ToolResult run_tools(const std::vector<std::string>& pieces) {
  auto p = make_tool_parser("hermes", ojson());
  ToolResult r;
  auto absorb = [&](ToolParseDelta& d) {
    r.content += d.content;
    for (auto& c : d.calls) {
      if (c.name) {
        EXPECT_EQ(c.index, static_cast<int>(r.names.size()));  // a call's name comes first
        EXPECT_TRUE(c.id.has_value() && c.id->size() == 29u);
        r.names.push_back(*c.name);
        r.streamed_args.emplace_back();
      }
      ASSERT_LT(c.index, static_cast<int>(r.streamed_args.size()));
      r.streamed_args[c.index] += c.arguments;
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
  ASSERT_EQ(a.content, b.content) << where;
  ASSERT_EQ(a.streamed_args, b.streamed_args) << where;
  ASSERT_EQ(a.names, b.names) << where;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << where;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    ASSERT_EQ(a.calls[i].name, b.calls[i].name) << where;
    ASSERT_EQ(a.calls[i].arguments, b.calls[i].arguments) << where;
  }
}

// Every 2-way split, 3-way splits (second cut every 5 bytes) and byte-at-a-time.
void check_tool_splits(const std::string& text) {
  ToolResult whole = run_tools({text});
  for (size_t i = 0; i < whole.calls.size(); ++i) EXPECT_EQ(whole.streamed_args[i], whole.calls[i].arguments);
  for (size_t i = 0; i <= text.size(); ++i) {
    expect_same(whole, run_tools({text.substr(0, i), text.substr(i)}), "split at " + std::to_string(i));
    for (size_t j = i; j <= text.size(); j += 5)
      expect_same(whole, run_tools({text.substr(0, i), text.substr(i, j - i), text.substr(j)}),
                  "split " + std::to_string(i) + "," + std::to_string(j));
  }
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  expect_same(whole, run_tools(bytes), "bytewise");
}

const std::string kTwoCalls =
    "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n"
    "</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"vélo \\\"rouge\\\"\", \"n\": [1, 2.5]}}\n"
    "</tool_call>";

// Compact JSON with every kind of value: the arguments come out as json.dumps writes them
// (expected text produced with Python 3's json.dumps(json.loads(x)["arguments"], ensure_ascii=False)).
const std::string kCanon =
    R"(<tool_call>{"name":"f","arguments":{"a":1.50,"b":[1,2,{"c":null}],"e":"\u00e9\ud83d\ude00\n\"\/","n":-0,)"
    R"("big":123456789012345678901234567890,"x":1e5,"y":-1E-7,"z":1e400,"t":true,"f":false,"nan":NaN,)"
    R"("ni":-Infinity,"ctl":"\u0001\u001f","lone":"\ud800x\udc00","hi":"\ud83d\ud83d\ude00","k\"q":{},"emp":[]}}</tool_call>)";
const std::string kCanonArgs =
    "{\"a\": 1.5, \"b\": [1, 2, {\"c\": null}], \"e\": \"\xc3\xa9\xf0\x9f\x98\x80\\n\\\"/\", \"n\": 0, "
    "\"big\": 123456789012345678901234567890, \"x\": 100000.0, \"y\": -1e-07, \"z\": Infinity, \"t\": true, "
    "\"f\": false, \"nan\": NaN, \"ni\": -Infinity, \"ctl\": \"\\u0001\\u001f\", \"lone\": \"\\ud800x\\udc00\", "
    "\"hi\": \"\\ud83d\xf0\x9f\x98\x80\", \"k\\\"q\": {}, \"emp\": []}";

}  // namespace

TEST(HermesTool, ParsesCallsAndContent) {
  ToolResult r = run_tools({kTwoCalls});
  EXPECT_EQ(r.content, "Let me check both.\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, "{\"city\": \"Paris\", \"days\": 3}");
  EXPECT_EQ(r.calls[1].name, "search");
  EXPECT_EQ(r.calls[1].arguments, "{\"q\": \"vélo \\\"rouge\\\"\", \"n\": [1, 2.5]}");
  EXPECT_EQ(r.streamed_args[1], r.calls[1].arguments);
}

TEST(HermesTool, ArgumentsInPythonJsonDumpsLayout) {
  ToolResult r = run_tools({kCanon});
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, kCanonArgs);
  // Non-object arguments are dumped as they are (vLLM json.dumps(function_call["arguments"])).
  ToolResult s = run_tools({"<tool_call>{\"name\": \"g\", \"arguments\": \"{\\\"a\\\":1}\"}</tool_call>"});
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, "\"{\\\"a\\\":1}\"");
}

TEST(HermesTool, StreamsNameThenArgumentsIncrementally) {
  auto p = make_tool_parser("hermes", ojson());
  ToolParseDelta d1, d2, d3;
  p->push("Hi<tool_call>\n{\"name\": \"get_weather\", \"argu", d1);
  EXPECT_EQ(d1.content, "Hi");
  ASSERT_EQ(d1.calls.size(), 1u);
  EXPECT_EQ(*d1.calls[0].name, "get_weather");
  EXPECT_EQ(d1.calls[0].arguments, "");
  p->push("ments\": {\"city\": \"Pa", d2);
  ASSERT_EQ(d2.calls.size(), 1u);
  EXPECT_FALSE(d2.calls[0].name.has_value());
  EXPECT_EQ(d2.calls[0].arguments, "{\"city\": \"Pa");  // strings stream a character at a time
  p->push("ris\", \"days\": 12", d3);
  EXPECT_EQ(d3.calls.at(0).arguments, "ris\"");  // a number waits for its end
  ToolParseDelta d4;
  p->push("}}\n</tool_call>", d4);
  EXPECT_EQ(d4.calls.at(0).arguments, ", \"days\": 12}");
  ToolParseDelta d5;
  p->push("\ntrailing text", d5);
  p->finish(d5);
  EXPECT_EQ(d5.content, "");  // after a call, text outside calls is dropped (vLLM non-streaming)
  EXPECT_TRUE(d5.calls.empty());
}

TEST(HermesTool, MalformedBlocksAreContent) {
  for (const std::string text : {
           "a <tool_call>\nnot json\n</tool_call> b",
           "<tool_call>{\"arguments\": {\"x\": 1}}</tool_call>",      // no name
           "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",  // name not a string
           "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",
           "<tool_call>[{\"name\": \"f\"}]</tool_call>",
           "<tool_call>{'name': 'f'}</tool_call>",
           "<tool_call>{\"name\": \"f\nx\"}</tool_call>",  // raw control character in a string
           "x <tool_call>\n{\"name\": \"get_we",            // cut off before the name ends
           "plain <tool_ca",
       }) {
    ToolResult r = run_tools({text});
    EXPECT_EQ(r.content, text);
    EXPECT_TRUE(r.calls.empty()) << text;
  }
  // A malformed block before a good one stays content; the good one is a call.
  ToolResult r = run_tools({"<tool_call>oops</tool_call>\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"});
  EXPECT_EQ(r.content, "<tool_call>oops</tool_call>\n");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].arguments, "{}");
}

TEST(HermesTool, BrokenAfterNameIsClosed) {
  // Cut off by max_tokens inside a string: what was read is kept, the JSON closed.
  ToolResult t = run_tools({"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, {\"b\": \"Par"});
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.calls[0].arguments, "{\"a\": [1, {\"b\": \"Par\"}]}");
  // A number at the cut is complete; a partial literal or key is dropped.
  EXPECT_EQ(run_tools({"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 12"}).calls.at(0).arguments, "{\"a\": 12}");
  EXPECT_EQ(run_tools({"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": tr"}).calls.at(0).arguments, "{}");
  EXPECT_EQ(run_tools({"<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b"}).calls.at(0).arguments, "{\"a\": 1}");
  // A missing closing brace before </tool_call> (a common model slip).
  ToolResult m = run_tools({"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>"});
  ASSERT_EQ(m.calls.size(), 1u);
  EXPECT_EQ(m.calls[0].arguments, "{\"a\": 1}");
  // No arguments: "{}" (as vLLM streams it); arguments before the name are held for it.
  EXPECT_EQ(run_tools({"<tool_call>\n{\"name\": \"f\"}\n</tool_call>"}).calls.at(0).arguments, "{}");
  ToolResult late = run_tools({"<tool_call>{\"arguments\": {\"a\": \"x\"}, \"other\": [1], \"name\": \"f\"}</tool_call>"});
  ASSERT_EQ(late.calls.size(), 1u);
  EXPECT_EQ(late.calls[0].name, "f");
  EXPECT_EQ(late.calls[0].arguments, "{\"a\": \"x\"}");
  // "</tool_call>" inside a JSON string is text.
  EXPECT_EQ(run_tools({"<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"</tool_call>\"}}</tool_call>"})
                .calls.at(0)
                .arguments,
            "{\"s\": \"</tool_call>\"}");
}

TEST(HermesTool, ChunkingIndependent) {
  check_tool_splits(kTwoCalls);
  check_tool_splits(kCanon);
}

TEST(HermesTool, ChunkingIndependentEdgeCases) {
  check_tool_splits("a <tool_call> x </tool_call> b <tool_call>{\"name\": \"f\"}</tool_call> c");
  check_tool_splits("<tool_call>{\"arguments\": {\"k\": [true, null]}, \"name\": \"f\"} junk </tool_call><tool_call>");
  check_tool_splits("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": \"\\ud83d\\ude00\\u12");
  check_tool_splits("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": -");
  check_tool_splits("x </tool_call> <tool_cal");
}

TEST(Qwen3Reasoning, SplitsThinkBlock) {
  auto run = [](const std::vector<std::string>& pieces, bool ended = false) {
    auto p = make_reasoning_parser("qwen3", ended);
    ReasoningDelta all;
    for (auto& s : pieces) p->push(s, all);
    p->finish(all);
    return all;
  };
  const std::vector<std::pair<std::string, std::pair<std::string, std::string>>> cases = {
      // (output, (reasoning, content)) as vLLM's Qwen3ReasoningParser.extract_reasoning answers.
      {"<think>\nI should greet.\n</think>\n\nHello!", {"\nI should greet.\n", "\n\nHello!"}},
      {"Opened by the template.</think>Answer", {"Opened by the template.", "Answer"}},
      {"<think>\nstill thinking, cut off", {"\nstill thinking, cut off", ""}},
      {"no tags at all", {"no tags at all", ""}},
      {"a</think>b</think>c", {"a", "b</think>c"}},
      {"plan <tool_call>\n<function=f>\n</function>\n</tool_call>", {"plan ", "<tool_call>\n<function=f>\n</function>\n</tool_call>"}},
      // The hermes format does not end the reasoning implicitly.
      {"plan <tool_call>\n{\"name\": \"f\"}\n</tool_call>", {"plan <tool_call>\n{\"name\": \"f\"}\n</tool_call>", ""}},
      {"x <tool_call>  <functio", {"x <tool_call>  <functio", ""}},
  };
  for (auto& [text, want] : cases) {
    ReasoningDelta whole = run({text});
    EXPECT_EQ(whole.reasoning, want.first) << text;
    EXPECT_EQ(whole.content, want.second) << text;
    for (size_t i = 0; i <= text.size(); ++i)
      for (size_t j = i; j <= text.size(); ++j) {
        ReasoningDelta d = run({text.substr(0, i), text.substr(i, j - i), text.substr(j)});
        ASSERT_EQ(d.reasoning, whole.reasoning) << text << " @" << i << "," << j;
        ASSERT_EQ(d.content, whole.content) << text << " @" << i << "," << j;
      }
    // The prompt ended the reasoning: all content.
    ReasoningDelta ended = run({text}, true);
    EXPECT_EQ(ended.reasoning, "");
    EXPECT_EQ(ended.content, text);
  }
}

TEST(Qwen3Reasoning, EndedByPrompt) {
  const ojson off = {{"enable_thinking", false}}, on = {{"enable_thinking", true}};
  auto ended = [](std::string_view prompt, const ojson* kw = nullptr) {
    return reasoning_ended_by_prompt("qwen3", ReasoningRequest{prompt, kw});
  };
  EXPECT_TRUE(ended("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(ended("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_FALSE(ended("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"));
  // An earlier assistant turn's reasoning does not count (multi-step tool conversations).
  EXPECT_FALSE(ended("<|im_start|>assistant\n<think>\na\n</think>\n\n<tool_call>\n{}\n</tool_call><|im_end|>\n"
                     "<|im_start|>user\n<tool_response>\nx\n</tool_response><|im_end|>\n<|im_start|>assistant\n"));
  EXPECT_TRUE(ended("<|im_start|>assistant\n", &off));
  EXPECT_FALSE(ended("<|im_start|>assistant\n", &on));
  EXPECT_FALSE(reasoning_ended_by_prompt("minimax_m2", ReasoningRequest{"</think>", &off}));
}

TEST(Qwen3Parsers, Registry) {
  EXPECT_TRUE(has_tool_parser("hermes"));
  EXPECT_TRUE(has_reasoning_parser("qwen3"));
  EXPECT_TRUE(has_tool_call_grammar("hermes"));
  auto tn = tool_parser_names(), rn = reasoning_parser_names();
  EXPECT_NE(std::find(tn.begin(), tn.end(), "hermes"), tn.end());
  EXPECT_NE(std::find(rn.begin(), rn.end(), "qwen3"), rn.end());
}

// ---- forced tool calls: random documents of the grammar read back as allowed calls ----

namespace {
const ojson kGrammarTools = ojson::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
     "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
     "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city", "days"]}}},
  {"type": "function", "function": {"name": "now"}},
  {"type": "function", "function": {"name": "add \"x\"", "parameters": {"type": "object", "properties": {
     "a": {"type": "number"}, "opts": {"type": "object", "properties": {"round": {"type": "boolean"}}}},
     "required": ["a"]}}}
])");

using grammar_docs::byte_vocab;

void check_grammar(bool parallel, std::vector<std::string> names) {
  auto g = std::make_shared<structured::CompiledGrammar>(
      tool_call_grammar("hermes", ToolCallGrammarRequest{kGrammarTools, names, parallel}), byte_vocab());
  std::mt19937 rng(parallel ? 7 : 3);
  int multi = 0;
  for (int doc = 0; doc < 40; ++doc) {
    structured::Matcher m(g);
    std::string text = grammar_docs::random_document(m, rng, {'"', '}', ']'});
    ToolResult r = run_tools({text});
    ASSERT_FALSE(r.calls.empty()) << text;
    EXPECT_EQ(py_strip(r.content), "") << text;
    if (!parallel) { ASSERT_EQ(r.calls.size(), 1u) << text; }
    multi += r.calls.size() > 1;
    for (auto& c : r.calls) {
      if (!names.empty()) { EXPECT_EQ(c.name, names[0]); }
      ojson args = ojson::parse(c.arguments);
      ASSERT_TRUE(args.is_object()) << text;
      if (c.name == "get_weather") {
        ASSERT_TRUE(args.contains("city") && args["city"].is_string()) << text;
        ASSERT_TRUE(args.contains("days") && args["days"].is_number_integer()) << text;
        EXPECT_GE(args["days"].get<int>(), 1);
        EXPECT_LE(args["days"].get<int>(), 7);
        if (args.contains("unit")) { EXPECT_TRUE(args["unit"] == "c" || args["unit"] == "f"); }
      } else if (c.name == "add \"x\"") {
        ASSERT_TRUE(args.contains("a") && args["a"].is_number()) << text;
        if (args.contains("opts")) { EXPECT_TRUE(args["opts"].is_object()) << text; }
      } else {
        ASSERT_EQ(c.name, "now") << text;
      }
    }
  }
  if (parallel) { EXPECT_GT(multi, 0); }
}
}  // namespace

TEST(HermesToolCallGrammar, RequiredSingleCall) { check_grammar(false, {}); }
TEST(HermesToolCallGrammar, RequiredParallelCalls) { check_grammar(true, {}); }
TEST(HermesToolCallGrammar, NamedTool) { check_grammar(false, {"add \"x\""}); }

TEST(HermesToolCallGrammar, Errors) {
  const ojson bad = ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
      "properties": {"x": {"type": "integer", "not": {"const": 2}}}}}}])");
  EXPECT_THROW(tool_call_grammar("hermes", ToolCallGrammarRequest{bad, {}, true}), structured::GrammarError);
  EXPECT_THROW(tool_call_grammar("hermes", ToolCallGrammarRequest{kGrammarTools, {"nope"}, true}),
               structured::GrammarError);
}

}  // namespace moeserve::server
