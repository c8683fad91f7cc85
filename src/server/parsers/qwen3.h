// Qwen3 reasoning parser (vLLM `qwen3`, Qwen3ReasoningParser) and the Hermes tool-call
// parser Qwen3 uses (vLLM `hermes`, Hermes2ProToolParser).
//
// Qwen3 output: "<think>\n...\n</think>\n\n" then the answer and/or tool calls
//   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
// (several, separated by "\n"). The hybrid models emit "<think>" themselves; the Thinking-2507
// and later templates put it in the prompt; enable_thinking false puts
// "<think>\n\n</think>\n\n" in the prompt.
#pragma once
#include "server/parsers/parser.h"

namespace moeserve::server {

// vLLM's Qwen3ReasoningParser (after vLLM PRs 34937 and 35230):
// - "<think>" in the reasoning part is dropped (old templates: the model emits it);
// - text before "</think>" is reasoning, after it content;
// - without "</think>" the output is reasoning (cut off while thinking), unless thinking is
//   off;
// - "<tool_call>" followed (after whitespace) by "<function=" / "<function " ends the
//   reasoning implicitly (Qwen3.5 / Qwen3-Coder models call tools without closing </think>).
// `ended_by_prompt` (see qwen3_reasoning_ended_by_prompt): all output is content, as vLLM's
// serving layer does when the prompt already ends the reasoning.
// Differences from vLLM, so that streaming and non-streaming agree:
// - enable_thinking false always means "all content" (vLLM's non-streaming path would still
//   split at a "</think>" the model emitted anyway);
// - only the prompt's last turn decides whether the prompt ended the reasoning (vLLM scans the
//   whole prompt, so a "</think>" of an earlier assistant turn in a multi-turn tool
//   conversation turned the whole next answer into content);
// - a "<think>" inside the reasoning is dropped and the text before it kept (vLLM's
//   non-streaming path drops the text before the first "<think>"; its streaming path keeps it).
class Qwen3ReasoningParser : public ReasoningParser {
 public:
  explicit Qwen3ReasoningParser(bool ended_by_prompt);
  void push(std::string_view text, ReasoningDelta& out) override;
  void finish(ReasoningDelta& out) override;

 private:
  enum class State { Reasoning, ToolCallCheck, Content } state_;
  void step(ReasoningDelta& out, bool final);
  std::string buf_;  // held-back text
};

// Last turn of the prompt (after its last "<|im_start|>") closes a "<think>" block, or
// chat_template_kwargs.enable_thinking is false.
bool qwen3_reasoning_ended_by_prompt(const ReasoningRequest& req);

// vLLM's Hermes2ProToolParser semantics, parsed incrementally with a JSON reader:
// - content is the text before the first <tool_call>; after the first call, text outside
//   calls is dropped (vLLM's non-streaming answer);
// - a call is streamed as soon as its "name" is read (id + name), then its "arguments" in
//   Python json.dumps(ensure_ascii=False) layout, one JSON token at a time (strings a
//   character at a time); the concatenation is exactly vLLM's non-streaming arguments text;
// - a <tool_call> block that is not a JSON object with a non-empty string "name" (checked
//   before anything of it is streamed) is left as content, as vLLM leaves unparseable output.
// Differences from vLLM, chosen so streaming and non-streaming always agree:
// - each block is judged on its own (vLLM's non-streaming path turns the whole message into
//   content when any block fails to parse);
// - a call whose JSON breaks or is cut off after its name was read is kept, its arguments
//   closed into valid JSON (vLLM's streaming path streams it too); text after the object
//   inside the block is ignored; a missing "arguments" is "{}" (as vLLM streams it);
// - a repeated key inside the arguments appears twice in the arguments text (JSON readers
//   keep the last); "</tool_call>" inside a JSON string does not end the call.
class HermesToolParser : public ToolParser {
 public:
  explicit HermesToolParser(const ojson& tools);  // tools are not read (vLLM's neither)
  ~HermesToolParser() override;
  void push(std::string_view text, ToolParseDelta& out) override;
  void finish(ToolParseDelta& out) override;
  const std::vector<ToolCall>& calls() const override { return calls_; }

  class CallReader;  // incremental JSON reader of one call object (hermes.cpp)

 private:
  enum class State { Content, Open, Tail, Malformed };
  void step(ToolParseDelta& out);
  void emit_content(std::string_view s, ToolParseDelta& out);
  void begin_block();
  void announce(ToolParseDelta& out);
  void flush_args(ToolParseDelta& out);
  void close_call(ToolParseDelta& out);

  State state_ = State::Content;
  std::string buf_;  // unconsumed text
  std::string raw_;  // the open block's text while its name is undecided (content if malformed)
  std::unique_ptr<CallReader> reader_;
  bool announced_ = false;  // the open block's call was streamed
  bool any_call_ = false;   // a call was found: text outside calls is dropped from now on
  std::vector<ToolCall> calls_;
};

}  // namespace moeserve::server
