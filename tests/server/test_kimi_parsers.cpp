// Kimi-K2 parsers: `kimi_k2` tool calls and `kimi_k2` reasoning. Expected values are what vLLM's
// KimiK2ToolParser / KimiK2ReasoningParser return non-streaming where both paths agree (the
// documented differences in kimi_k2.h are tested as such); every two-piece split, a one-byte
// feed and random chunkings must give the same result as the whole text, and the concatenated
// argument deltas must equal calls()'s arguments.
#include <gtest/gtest.h>

#include <random>

#include "server/parsers/parser.h"

namespace moeserve::server {
namespace {

struct Call {
  std::string id, name, arguments;
  bool operator==(const Call& o) const { return id == o.id && name == o.name && arguments == o.arguments; }
};
struct Tools {
  std::string content;
  std::vector<Call> calls;     // from calls()
  std::vector<Call> streamed;  // from the deltas
  bool operator==(const Tools& o) const { return content == o.content && calls == o.calls && streamed == o.streamed; }
};

Tools run_tools(const std::vector<std::string_view>& pieces) {
  auto p = make_tool_parser("kimi_k2", ojson());
  Tools r;
  auto absorb = [&](ToolParseDelta& d) {
    r.content += d.content;
    for (auto& c : d.calls) {
      if (c.index == int(r.streamed.size())) {
        EXPECT_TRUE(c.id && c.name) << "first delta of a call carries id and name";
        r.streamed.push_back({c.id.value_or(""), c.name.value_or(""), ""});
      }
      ASSERT_EQ(c.index, int(r.streamed.size()) - 1);
      r.streamed.back().arguments += c.arguments;
    }
  };
  for (auto s : pieces) {
    ToolParseDelta d;
    p->push(s, d);
    absorb(d);
  }
  ToolParseDelta d;
  p->finish(d);
  absorb(d);
  for (auto& c : p->calls()) r.calls.push_back({c.id, c.name, c.arguments});
  return r;
}

Tools tools_every_split(const std::string& text) {
  const Tools whole = run_tools({text});
  const std::string_view t(text);
  for (size_t i = 0; i <= text.size(); ++i) EXPECT_EQ(run_tools({t.substr(0, i), t.substr(i)}), whole) << "split " << i;
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(t.substr(i, 1));
  EXPECT_EQ(run_tools(bytes), whole);
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<std::string_view> pieces;
    for (size_t i = 0; i < text.size();) {
      const size_t n = std::min<size_t>(text.size() - i, 1 + rng() % 12);
      pieces.push_back(t.substr(i, n));
      i += n;
    }
    EXPECT_EQ(run_tools(pieces), whole) << "trial " << trial;
  }
  EXPECT_EQ(whole.calls, whole.streamed);
  return whole;
}

const std::string kCall1 =
    "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>";
const std::string kCall2 = "<|tool_call_begin|> functions.now:1 <|tool_call_argument_begin|> {} \n<|tool_call_end|>";

TEST(KimiK2ToolParser, ContentThenCalls) {
  const Tools r = tools_every_split("Let me check.<|tool_calls_section_begin|>" + kCall1 + "\n" + kCall2 +
                                    "<|tool_calls_section_end|>");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], (Call{"functions.get_weather:0", "get_weather", "{\"city\": \"Paris\"}"}));
  EXPECT_EQ(r.calls[1], (Call{"functions.now:1", "now", "{}"}));  // surrounding whitespace stripped
}

TEST(KimiK2ToolParser, SingularVariantsAndIdWithoutPrefix) {
  const Tools r = tools_every_split(
      "<|tool_call_section_begin|><|tool_call_begin|>search:3<|tool_call_argument_begin|>{\"q\": \"北京 天气\"}"
      "<|tool_call_end|><|tool_call_section_end|> after");
  EXPECT_EQ(r.content, " after");  // text after a section end is content (vLLM's streaming path)
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0], (Call{"search:3", "search", "{\"q\": \"北京 天气\"}"}));
}

TEST(KimiK2ToolParser, MissingSectionEndAndCutOffCall) {
  // Truncated by max_tokens: the complete call is kept without a section end; the cut-off call
  // keeps the arguments streamed so far.
  const Tools r = tools_every_split("<|tool_calls_section_begin|>" + kCall1 +
                                    "<|tool_call_begin|>functions.read_file:1<|tool_call_argument_begin|>{\"path\": \"/tm");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[1], (Call{"functions.read_file:1", "read_file", "{\"path\": \"/tm"}));
  EXPECT_EQ(r.content, "");
}

TEST(KimiK2ToolParser, MalformedIdIsDroppedAndNoiseInSection) {
  const Tools r = tools_every_split(
      "<|tool_calls_section_begin|>noise<|tool_call_begin|>get_weather<|tool_call_argument_begin|>{}<|tool_call_end|>"
      " between " + kCall2 + "<|tool_calls_section_end|>");
  ASSERT_EQ(r.calls.size(), 1u);  // "get_weather" lacks ":IDX" (vLLM's regex skips it)
  EXPECT_EQ(r.calls[0].id, "functions.now:1");
  EXPECT_EQ(r.content, "");
}

TEST(KimiK2ToolParser, PlainContentAndPartialMarkers) {
  const Tools r = tools_every_split("no calls <|tool_calls_section here <| and a trailing <|tool_calls_sec");
  EXPECT_EQ(r.content, "no calls <|tool_calls_section here <| and a trailing <|tool_calls_sec");
  EXPECT_TRUE(r.calls.empty());
}

TEST(KimiK2ToolParser, ArgumentsStreamBeforeTheCallEnds) {
  auto p = make_tool_parser("kimi_k2", ojson());
  ToolParseDelta d;
  p->push("<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{\"a\": ", d);
  ASSERT_EQ(d.calls.size(), 2u);
  EXPECT_EQ(d.calls[0].name.value_or(""), "f");
  EXPECT_EQ(d.calls[1].arguments, "{\"a\":");  // the trailing space is held back
  ToolParseDelta d2;
  p->push("1}  <|tool_call_e", d2);
  ASSERT_EQ(d2.calls.size(), 1u);
  EXPECT_EQ(d2.calls[0].arguments, " 1}");
  EXPECT_TRUE(has_tool_parser("kimi_k2"));
}

struct Reasoning {
  std::string reasoning, content;
};
Reasoning run_reasoning(const std::vector<std::string_view>& pieces, bool ended = false) {
  auto p = make_reasoning_parser("kimi_k2", ended);
  Reasoning all;
  for (auto s : pieces) {
    ReasoningDelta d;
    p->push(s, d);
    all.reasoning += d.reasoning, all.content += d.content;
  }
  ReasoningDelta d;
  p->finish(d);
  all.reasoning += d.reasoning, all.content += d.content;
  return all;
}
Reasoning reasoning_every_split(const std::string& text) {
  const Reasoning whole = run_reasoning({text});
  const std::string_view t(text);
  for (size_t i = 0; i <= text.size(); ++i) {
    const Reasoning r = run_reasoning({t.substr(0, i), t.substr(i)});
    EXPECT_EQ(r.reasoning, whole.reasoning) << i;
    EXPECT_EQ(r.content, whole.content) << i;
  }
  return whole;
}

TEST(KimiK2ReasoningParser, ThinkBlocksAndImplicitEndAtToolSection) {
  Reasoning r = reasoning_every_split("<think>weigh it</think>The answer.");
  EXPECT_EQ(r.reasoning, "weigh it");
  EXPECT_EQ(r.content, "The answer.");
  // Thinking without a start marker.
  r = reasoning_every_split("weigh it</think>answer </think> kept");
  EXPECT_EQ(r.reasoning, "weigh it");
  EXPECT_EQ(r.content, "answer </think> kept");
  // A tool section ends reasoning and stays in the content for the tool parser.
  r = reasoning_every_split("<think>need data<|tool_calls_section_begin|>" + kCall1);
  EXPECT_EQ(r.reasoning, "need data");
  EXPECT_EQ(r.content, "<|tool_calls_section_begin|>" + kCall1);
  // Only a leading "<think>" is consumed; cut off while thinking: all reasoning.
  r = reasoning_every_split("a <think>b <thi");
  EXPECT_EQ(r.reasoning, "a <think>b <thi");
  EXPECT_EQ(r.content, "");
}

TEST(KimiK2ReasoningParser, ThinkingFalseMakesEverythingContent) {
  const ojson off = ojson::parse(R"({"thinking": false})"), on = ojson::parse(R"({"thinking": true})");
  EXPECT_TRUE(reasoning_ended_by_prompt("kimi_k2", {"", &off}));
  EXPECT_FALSE(reasoning_ended_by_prompt("kimi_k2", {"", &on}));
  EXPECT_FALSE(reasoning_ended_by_prompt("kimi_k2", {"", nullptr}));
  const Reasoning r = run_reasoning({"<think>x</think>", "y"}, true);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "<think>x</think>y");
}

}  // namespace
}  // namespace moeserve::server
