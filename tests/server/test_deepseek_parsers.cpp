// DeepSeek-V3 / R1 parsers: `deepseek_v3` tool calls and `deepseek_r1` reasoning. Expected values
// are what vLLM's DeepSeekV3ToolParser / DeepSeekR1ReasoningParser return non-streaming; every
// two-piece split (and a one-byte-at-a-time feed) must give the same result as the whole text.
#include <gtest/gtest.h>

#include "server/parsers/parser.h"

namespace moeserve::server {
namespace {

struct Tools {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;     // name, arguments (from calls())
  std::vector<std::pair<std::string, std::string>> streamed;  // name, arguments (from the deltas)
  bool operator==(const Tools& o) const { return content == o.content && calls == o.calls && streamed == o.streamed; }
};

Tools run_tools(const std::vector<std::string_view>& pieces) {
  auto p = make_tool_parser("deepseek_v3", ojson());
  Tools r;
  auto absorb = [&](ToolParseDelta& d) {
    r.content += d.content;
    for (auto& c : d.calls) {
      EXPECT_EQ(c.index, int(r.streamed.size()));
      EXPECT_TRUE(c.id && c.name);
      r.streamed.emplace_back(c.name.value_or(""), c.arguments);
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
  for (auto& c : p->calls()) r.calls.emplace_back(c.name, c.arguments);
  return r;
}

Tools tools_every_split(const std::string& text) {
  const Tools whole = run_tools({text});
  for (size_t i = 0; i <= text.size(); ++i) {
    const std::string_view t(text);
    EXPECT_EQ(run_tools({t.substr(0, i), t.substr(i)}), whole) << "split at " << i;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < text.size(); ++i) bytes.push_back(std::string_view(text).substr(i, 1));
  EXPECT_EQ(run_tools(bytes), whole);
  EXPECT_EQ(whole.calls, whole.streamed);
  return whole;
}

const std::string kCall1 =
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>";
const std::string kCall2 =
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜>";

TEST(DeepSeekV3ToolParser, ContentThenCalls) {
  const Tools r = tools_every_split("Let me check.<｜tool▁calls▁begin｜>" + kCall1 + kCall2 +
                                    "<｜tool▁calls▁end｜>ignored");
  EXPECT_EQ(r.content, "Let me check.");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0], (std::pair<std::string, std::string>{"get_weather", "{\"city\": \"Paris\"}"}));
  EXPECT_EQ(r.calls[1], (std::pair<std::string, std::string>{"now", "{}"}));
}

TEST(DeepSeekV3ToolParser, PlainContentAndPartialMarkers) {
  const Tools r = tools_every_split("no calls here <｜tool▁ not a marker");
  EXPECT_EQ(r.content, "no calls here <｜tool▁ not a marker");
  EXPECT_TRUE(r.calls.empty());
}

TEST(DeepSeekV3ToolParser, MalformedAndCutOffCallsAreDropped) {
  const Tools r = tools_every_split("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function get_weather {}<｜tool▁call▁end｜>" +
                                    kCall2 + "<｜tool▁call▁begin｜>function<｜tool▁sep｜>cut\n```json\n{\"a\":");
  EXPECT_EQ(r.content, "");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].first, "now");
}

TEST(DeepSeekV3ToolParser, MultiLineArguments) {
  const Tools r = tools_every_split(
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\n  \"x\": 1\n}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.calls[0].second, "{\n  \"x\": 1\n}");
}

ReasoningDelta run_reasoning(const std::vector<std::string_view>& pieces) {
  auto p = make_reasoning_parser("deepseek_r1");
  ReasoningDelta all;
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

ReasoningDelta reasoning_every_split(const std::string& text) {
  const ReasoningDelta whole = run_reasoning({text});
  for (size_t i = 0; i <= text.size(); ++i) {
    const std::string_view t(text);
    const ReasoningDelta r = run_reasoning({t.substr(0, i), t.substr(i)});
    EXPECT_EQ(r.reasoning, whole.reasoning) << i;
    EXPECT_EQ(r.content, whole.content) << i;
  }
  return whole;
}

TEST(DeepSeekR1ReasoningParser, SplitsAtThinkEnd) {
  ReasoningDelta r = reasoning_every_split("<think>\nweigh it</think>\n\nThe answer.");
  EXPECT_EQ(r.reasoning, "\nweigh it");
  EXPECT_EQ(r.content, "\n\nThe answer.");
  // The R1 template puts "<think>\n" in the prompt: the output starts inside the reasoning.
  r = reasoning_every_split("weigh it</think>answer </think> kept");
  EXPECT_EQ(r.reasoning, "weigh it");
  EXPECT_EQ(r.content, "answer </think> kept");
  // Cut off while thinking: everything is reasoning.
  r = reasoning_every_split("<think>still thinking <thi");
  EXPECT_EQ(r.reasoning, "still thinking <thi");
  EXPECT_EQ(r.content, "");
  EXPECT_TRUE(has_reasoning_parser("deepseek_r1"));
  EXPECT_TRUE(has_tool_parser("deepseek_v3"));
}

}  // namespace
}  // namespace moeserve::server
