// MiniMax-M2 / M2.5 parsers (vLLM names `minimax_m2`, `minimax_m2_append_think`).
// Output format: minimax-m2.md §7-8. The prompt ends with "<think>\n", so the model emits
// reasoning, "</think>", then the answer and/or
//   <minimax:tool_call>\n<invoke name="f">\n<parameter name="k">v</parameter>\n</invoke>\n</minimax:tool_call>
#pragma once
#include "server/parsers/parser.h"

namespace moeserve::server {

// Text before "</think>" is reasoning, after it content. A leading "<think>" (M2.5 sometimes
// emits it) is dropped. Without "</think>" everything is reasoning.
class MinimaxM2ReasoningParser : public ReasoningParser {
 public:
  void push(std::string_view text, ReasoningDelta& out) override;
  void finish(ReasoningDelta& out) override;

 private:
  enum class State { Start, Reasoning, Content } state_ = State::Start;
  std::string buf_;  // held-back text
};

// No split: content = "<think>" + output; reasoning stays null.
class MinimaxM2AppendThinkParser : public ReasoningParser {
 public:
  void push(std::string_view text, ReasoningDelta& out) override;
  void finish(ReasoningDelta& out) override;
  bool reports_reasoning() const override { return false; }

 private:
  bool started_ = false;
};

// vLLM MinimaxM2ToolParser semantics, parsed incrementally. Streams the function name as soon
// as `<invoke name="X">` is complete and arguments one complete <parameter> at a time.
// Differences from vLLM, chosen so streaming and non-streaming always agree:
// - an <invoke> left open at a block end or at the end of generation is closed ("}") and
//   kept, where vLLM's non-streaming path would drop it;
// - a repeated parameter name appears twice in the arguments text (JSON readers keep the last).
class MinimaxM2ToolParser : public ToolParser {
 public:
  explicit MinimaxM2ToolParser(const ojson& tools);
  void push(std::string_view text, ToolParseDelta& out) override;
  void finish(ToolParseDelta& out) override;
  const std::vector<ToolCall>& calls() const override { return calls_; }

  // Types a raw parameter value by its JSON schema (vLLM _convert_param_value_with_types).
  static ojson convert_value(std::string_view value, const ojson* schema);

 private:
  enum class State { Content, Block, InvokeName, Invoke, Param, AfterBlock };
  void step(ToolParseDelta& out, bool final);
  void close_invoke(ToolParseDelta& out);
  const ojson* param_schema(const std::string& param) const;

  ojson tools_;
  State state_ = State::Content;
  std::string buf_;        // unconsumed text
  std::string raw_tools_;  // all text from the first <minimax:tool_call> (fallback content)
  bool emitted_content_ = false;
  std::vector<ToolCall> calls_;
  const ojson* properties_ = nullptr;  // of the current invoke's function
  int num_params_ = 0;
};

}  // namespace moeserve::server
