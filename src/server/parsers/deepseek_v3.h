// DeepSeek-V3 / R1 parsers: the `deepseek_r1` reasoning parser (vLLM DeepSeekR1ReasoningParser)
// and the `deepseek_v3` tool-call parser (vLLM DeepSeekV3ToolParser).
//
// DeepSeek-V3 tool calls (full-width bars U+FF5C and U+2581 in the markers):
//   <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>
//   ... more calls ...<｜tool▁calls▁end｜>
#pragma once
#include "server/parsers/parser.h"

namespace moeserve::server {

// vLLM's DeepSeekR1ReasoningParser: text before "</think>" is reasoning, after it content;
// without "</think>" everything is reasoning; "<think>" markers are dropped. Difference from
// vLLM, so that streaming and non-streaming agree: text before a "<think>" is kept as reasoning
// (vLLM's non-streaming path drops it; its streaming path keeps it).
class DeepSeekR1ReasoningParser : public ReasoningParser {
 public:
  void push(std::string_view text, ReasoningDelta& out) override;
  void finish(ReasoningDelta& out) override;

 private:
  void step(ReasoningDelta& out, bool final);
  bool content_ = false;
  std::string buf_;  // held back: a possible partial marker
};

// vLLM's DeepSeekV3ToolParser semantics: content is the text before "<｜tool▁calls▁begin｜>";
// each "<｜tool▁call▁begin｜>TYPE<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>" is a
// call with the raw ARGS text as its arguments (as vLLM returns them); text after the calls
// section is dropped. A call is streamed whole (id, name and arguments in one delta) once its
// "<｜tool▁call▁end｜>" arrived, so every split of the text gives the same deltas. Differences
// from vLLM: ARGS may span lines (vLLM's regex has no DOTALL, so its non-streaming path misses
// multi-line arguments); a block that does not have the layout above, or is cut off, is
// dropped (vLLM's regex skips it too).
class DeepSeekV3ToolParser : public ToolParser {
 public:
  explicit DeepSeekV3ToolParser(const ojson& tools);  // tools are not read (vLLM's neither)
  void push(std::string_view text, ToolParseDelta& out) override;
  void finish(ToolParseDelta& out) override;
  const std::vector<ToolCall>& calls() const override { return calls_; }

 private:
  enum class State { Content, Calls, Done };
  void step(ToolParseDelta& out, bool final);
  State state_ = State::Content;
  std::string buf_;
  std::vector<ToolCall> calls_;
};

}  // namespace moeserve::server
