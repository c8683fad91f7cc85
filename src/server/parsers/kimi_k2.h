// Kimi-K2 / K2.5 parsers (vLLM names: `kimi_k2` tool calls, `kimi_k2` reasoning).
//
// Output layout (wave2-research.md 5.4):
//   <think>REASONING</think>CONTENT<|tool_calls_section_begin|>
//   <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{JSON}<|tool_call_end|>
//   ... more calls ...<|tool_calls_section_end|>
// The singular section markers <|tool_call_section_begin|> / <|tool_call_section_end|> occur too,
// and a generation cut off by max_tokens has no section end.
#pragma once
#include "server/parsers/parser.h"

namespace moeserve::server {

// vLLM's KimiK2ReasoningParser: reasoning runs from the start of the output (a "<think>" at the
// very start is consumed) to "</think>" (dropped; the rest is content) or to a tool-calls section
// begin (kept: it starts the content, so the tool parser sees it), whichever comes first; without
// either everything is reasoning. chat_template_kwargs {"thinking": false} (vLLM's identity mode)
// makes everything content: see kimi_k2_reasoning_ended_by_prompt. Differences from vLLM, so that
// streaming and non-streaming agree: the first of the two end markers decides (vLLM's non-streaming
// path prefers a later "</think>"), and the singular section-begin variant ends reasoning too.
class KimiK2ReasoningParser : public ReasoningParser {
 public:
  explicit KimiK2ReasoningParser(bool ended_by_prompt);
  void push(std::string_view text, ReasoningDelta& out) override;
  void finish(ReasoningDelta& out) override;

 private:
  void step(ReasoningDelta& out, bool final);
  enum class State { Start, Reasoning, Content } state_;
  std::string buf_;  // held back: a possible partial marker
};
// true when chat_template_kwargs.thinking is false (the template then renders no thinking).
bool kimi_k2_reasoning_ended_by_prompt(const ReasoningRequest& req);

// vLLM's KimiK2ToolParser semantics, parsed incrementally:
// - content is the text outside tool-calls sections (before the first one, and after a section
//   end, as vLLM's streaming path returns it);
// - a call is "<|tool_call_begin|> ID <|tool_call_argument_begin|> ARGS <|tool_call_end|>", ID
//   stripped and of the form [^<]+:\d+ (vLLM's regex); the call id is ID ("functions.NAME:IDX"),
//   the name is ID before the last ':' after its last '.'; the arguments are ARGS stripped of
//   surrounding whitespace, as raw text (vLLM does not re-serialise them);
// - the id and name are streamed once "<|tool_call_argument_begin|>" arrived, the arguments as
//   they arrive (held back: trailing whitespace, a possible partial marker, an incomplete UTF-8
//   character), so every split of the text gives the same concatenation;
// - a call cut off (no "<|tool_call_end|>" before the end of generation, a section end or the
//   next "<|tool_call_begin|>") keeps the arguments streamed so far (vLLM's streaming path has
//   sent them too; its non-streaming regex would drop the call);
// - a call with a malformed ID, and text inside a section between calls, are dropped.
class KimiK2ToolParser : public ToolParser {
 public:
  explicit KimiK2ToolParser(const ojson& tools);  // tools are not read (vLLM's neither)
  void push(std::string_view text, ToolParseDelta& out) override;
  void finish(ToolParseDelta& out) override;
  const std::vector<ToolCall>& calls() const override { return calls_; }

 private:
  enum class State { Content, Section, Id, Args, Skip };
  void step(ToolParseDelta& out, bool final);
  void emit_args(ToolParseDelta& out, std::string_view avail);
  State state_ = State::Content;
  std::string buf_;
  std::string raw_args_;  // the current call's ARGS text so far (unstripped)
  std::vector<ToolCall> calls_;
};

}  // namespace moeserve::server
