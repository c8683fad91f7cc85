// OpenAI request parsing and validation (chat and completions), as vLLM's protocol.py and
// SamplingParams._verify_args accept them. Wrong types and out-of-range values throw
// ApiError 400 with vLLM's wording where it has one. Every numeric field has a range that
// keeps the sampler's arithmetic finite (non-finite numbers are refused).
//
// Field audit (protocol.cpp, kNotImplemented): a field of vLLM's ChatCompletionRequest /
// CompletionRequest that moeserve does not implement gets 400 naming it when set to anything
// but its default; fields vLLM itself ignores (user, parallel_tool_calls, mm_processor_kwargs
// for a text model, kv_transfer_params without a KV connector, vllm_xargs without
// extensions, length_penalty without beam search, spaces_between_special_tokens with a
// tokenizer.json tokenizer) and unknown fields are accepted, as vLLM accepts them.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "server/errors.h"
#include "server/json_text.h"
#include "structured/constraint.h"

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
  // vLLM's prompt_logprobs k (>= 0) when set and not streaming (vLLM's stream responses carry
  // none; it refuses k > 0 with stream).
  std::optional<int> prompt_logprobs;
  bool echo = false;  // completions: the prompt; chat: the last message when it has the reply's role
  // vLLM's logits processors (SamplingParams); token ids are checked against the vocabulary
  // by check_token_ids once it is known.
  std::vector<std::pair<int64_t, float>> logit_bias;  // ascending id, values clamped to [-100, 100]
  std::optional<std::vector<int64_t>> allowed_token_ids;  // non-empty when set
  std::vector<std::string> bad_words;  // tokenised by bad_words_token_ids
  // Keep only the last k prompt tokens (-1: max_model_len), as vLLM's truncation_side left.
  std::optional<int64_t> truncate_prompt_tokens;
  // Accepted and validated; it changes nothing with a tokenizer.json (fast) tokenizer, exactly
  // as in vLLM, whose fast detokenizer does not read it.
  bool spaces_between_special_tokens = true;
  bool return_tokens_as_token_ids = false;  // logprob tokens as "token_id:<id>"
  bool include_reasoning = true;  // chat: false drops the reasoning text from the response
  std::string cache_salt;  // non-empty: prefix-cache sharing only with the same salt
  // vLLM's thinking_token_budget (>= 0): tokens allowed inside the reasoning section before
  // its end marker is forced (SamplingParams::thinking); needs the server's reasoning parser.
  std::optional<int64_t> thinking_token_budget;
  // chat
  ojson messages;
  ojson tools;  // null or array
  ToolChoice tool_choice = ToolChoice::None;
  std::string named_tool;
  bool parallel_tool_calls = true;
  // response_format / structured_outputs / guided_*: see server/structured_request.h.
  std::optional<structured::ConstraintSpec> structured;
  bool add_generation_prompt = true;
  bool continue_final_message = false;
  ojson chat_template_kwargs = ojson::object();
  ojson documents;  // null or a list of objects, given to the template as `documents`
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

// Request::prefix_cache_root for a cache_salt (0 for none): a 64-bit hash with the top bit set.
uint64_t prefix_cache_root(const std::string& salt);

// The token-id fields (logit_bias, allowed_token_ids) against the model's vocabulary size,
// with vLLM's messages (400).
void check_token_ids(const GenRequest& r, int vocab_size);

// vLLM's SamplingParams.update_from_tokenizer for bad_words: each word (leading spaces
// stripped) tokenised without and with a leading space; the spaced form is kept only when it
// starts with a different token and has as many tokens. Ids outside [0, vocab) are a 400.
std::vector<std::vector<int32_t>> bad_words_token_ids(
    const std::vector<std::string>& words, const std::function<std::vector<int32_t>(const std::string&)>& encode,
    int vocab_size);

// truncate_prompt_tokens on one tokenised prompt: keeps the last k tokens (k = -1:
// max_model_len). `num_special_prefix` / `num_special_suffix` tokens the tokenizer added
// around a text prompt stay (as HF truncation keeps them). k > max_model_len is a 400.
void truncate_prompt(std::vector<int32_t>& ids, int64_t k, int max_model_len, size_t num_special_prefix = 0,
                     size_t num_special_suffix = 0);

// Parses a JSON request body (parse_request_object): malformed JSON, invalid UTF-8, 1e400,
// nesting beyond the limit or a non-object throws ApiError 400.
ojson parse_json_body(std::string_view body);

}  // namespace moeserve::server
