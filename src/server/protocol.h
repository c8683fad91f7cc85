// OpenAI request parsing and validation (chat and completions), as vLLM's protocol.py and
// SamplingParams._verify_args accept them. Unknown fields are ignored; wrong types and
// out-of-range values throw ApiError 400 with vLLM's wording where it has one.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/errors.h"
#include "server/json_text.h"

namespace moeserve::server {

enum class ToolChoice { None, Auto, Required, Named };

// Sampling defaults from generation_config.json (--generation-config auto).
struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  std::optional<int> max_new_tokens;
  static SamplingDefaults from_json(const ojson& generation_config);
};

struct CompletionPrompt {
  std::optional<std::string> text;
  std::vector<int32_t> ids;  // when given as token ids (or after tokenizing text)
};

struct GenRequest {
  bool chat = true;
  std::string model;  // empty: the default served model
  bool stream = false;
  bool include_usage = false;
  bool continuous_usage_stats = false;
  int n = 1;
  std::optional<int64_t> max_tokens;  // max_completion_tokens or max_tokens
  int min_tokens = 0;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int> top_k;
  float presence_penalty = 0, frequency_penalty = 0;
  std::optional<int64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  bool ignore_eos = false;
  // Logprobs: chat (logprobs bool, top_logprobs k) and completions (logprobs k) both map to
  // `num_logprobs` = k (-1: none).
  int num_logprobs = -1;
  bool echo = false;  // completions
  // chat
  ojson messages;
  ojson tools;  // null or array
  ToolChoice tool_choice = ToolChoice::None;
  std::string named_tool;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  ojson chat_template_kwargs = ojson::object();
  // completions
  std::vector<CompletionPrompt> prompts;
  bool add_special_tokens = true;
};

struct ProtocolLimits {
  int max_logprobs = 20;
  bool auto_tool_choice_enabled = false;  // --enable-auto-tool-choice and a tool parser
};

GenRequest parse_chat_request(const ojson& body, const ProtocolLimits& limits);
GenRequest parse_completion_request(const ojson& body, const ProtocolLimits& limits);

// Checks prompt length against max_model_len (vLLM wording) and fills engine parameters.
// Default max_tokens: max_model_len - prompt_len (chat) or 16 (completions).
SamplingParams make_sampling_params(const GenRequest& r, const SamplingDefaults& defaults, int prompt_len,
                                    int max_model_len, int choice_index);

// Parses a JSON request body (parse_request_object): malformed JSON, invalid UTF-8, 1e400,
// nesting beyond the limit or a non-object throws ApiError 400.
ojson parse_json_body(std::string_view body);

}  // namespace moeserve::server
