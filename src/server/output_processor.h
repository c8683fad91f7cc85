// Per-choice output processing on io threads: incremental detokenization, stop strings,
// reasoning and tool-call parsing, logprob formatting. Input: the engine's RequestOutput
// deliveries for one choice; output: the delta to stream (and, accumulated, the final
// message for non-streaming responses).
//
// Stop strings are searched in the not-yet-sent text after every token; the longest tail
// that is a prefix of some stop string is held back, so nothing past a stop string is
// ever streamed, whatever the token boundaries.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/frontend.h"
#include "server/parsers/parser.h"

namespace moeserve::server {

struct ChoiceSettings {
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;  // the request's own (reported as stop_reason)
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  int num_logprobs = -1;
  bool prompt_logprobs = false;  // keep the engine's prompt_logprobs for the response
  int min_tokens = 0;  // stop strings are looked for only once more tokens than this exist (vLLM)
  bool include_reasoning = true;  // false: reasoning text is parsed out and dropped
  std::string reasoning_parser;  // empty: none (chat only)
  bool reasoning_ended_by_prompt = false;  // the prompt closed the reasoning section (all content)
  std::string tool_parser;       // empty: no tool parsing (chat only)
  ojson tools;
};

struct TokenLogprobOut {
  int32_t token_id;
  float logprob;
  std::vector<std::pair<int32_t, float>> top;
};

struct ChoiceDelta {
  std::string text;       // completions: the new text; chat: the new content
  std::string reasoning;  // chat
  std::vector<ToolCallDelta> tool_calls;
  std::vector<TokenLogprobOut> logprobs;
  bool finished = false;
  std::string finish_reason;  // stop | length | tool_calls | abort | error
  ojson stop_reason;          // null, the stop string, or the stop token id
  bool empty() const { return text.empty() && reasoning.empty() && tool_calls.empty() && !finished; }
};

class OutputProcessor {
 public:
  OutputProcessor(const Frontend& frontend, ChoiceSettings settings);
  // Consumes one engine delivery; returns what to send now. After a stop string matched,
  // `stop_matched()` is true and the caller aborts the engine request; later deliveries
  // are ignored.
  ChoiceDelta process(const RequestOutput& out);
  bool finished() const { return finished_; }
  bool stop_matched() const { return stop_matched_; }
  int num_generated_tokens() const { return num_tokens_; }
  const std::vector<int32_t>& token_ids() const { return token_ids_; }

  // Final, accumulated results (valid once finished).
  const std::string& text() const { return all_text_; }
  const std::string& reasoning() const { return all_reasoning_; }
  const std::vector<ToolCall>* tool_calls() const { return tools_ ? &tools_->calls() : nullptr; }
  bool reports_reasoning() const { return reasoning_ && reasoning_->reports_reasoning(); }
  bool has_tool_calls() const { return tools_ && !tools_->calls().empty(); }
  const std::vector<TokenLogprobOut>& all_logprobs() const { return all_logprobs_; }
  const std::string& finish_reason() const { return finish_reason_; }
  // With ChoiceSettings::prompt_logprobs: one per prompt token after the first.
  bool has_prompt_logprobs() const { return s_.prompt_logprobs; }
  const std::vector<PromptTokenLogprob>& prompt_logprobs() const { return prompt_logprobs_; }
  const ojson& stop_reason() const { return stop_reason_; }

 private:
  void route_text(const std::string& text, bool final, ChoiceDelta& d);
  size_t stop_holdback(std::string_view s) const;

  const Frontend& frontend_;
  ChoiceSettings s_;
  std::unique_ptr<IncrementalDecoder> detok_;
  std::unique_ptr<ReasoningParser> reasoning_;
  std::unique_ptr<ToolParser> tools_;
  std::string unsent_;  // decoded text not yet passed on (possible stop-string prefix)
  bool finished_ = false;
  bool stop_matched_ = false;
  int num_tokens_ = 0;
  std::vector<int32_t> token_ids_;
  std::string all_text_, all_reasoning_;
  std::vector<TokenLogprobOut> all_logprobs_;
  std::vector<PromptTokenLogprob> prompt_logprobs_;
  std::string finish_reason_;
  ojson stop_reason_;
};

}  // namespace moeserve::server
