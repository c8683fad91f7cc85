// The engine's public surface, used by the server and the CLI.
//
// Threads: one engine thread owns all scheduling state (requests, sequences, KV blocks)
// and drives the ModelExecutor. Callers (HTTP io threads, CLI) only call submit/abort/
// stats, which enqueue work under a short mutex and never wait for a model step. Outputs
// are delivered through the request's `on_output` callback, invoked on the engine thread:
// it must be cheap and non-blocking (push into a queue, post to an io strand).
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/executor.h"
#include "engine/spec_config.h"
#include "engine/spec_policy.h"

namespace moeserve {
namespace structured {
struct StructuredConstraint;  // structured/constraint.h
}

struct SamplingParams {
  float temperature = 1.0f;  // 0 = greedy (ties break to the lowest token id)
  float top_p = 1.0f;
  int top_k = 0;  // 0 or -1: disabled
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::optional<uint64_t> seed;
  int max_tokens = 16;  // generated tokens at most (already clamped to the model length)
  int min_tokens = 0;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;  // -1: none; k >= 0: sampled token's logprob plus k top alternatives
  // vLLM's prompt_logprobs: nullopt none; k >= 0: each prompt token's logprob (after the first)
  // plus k top alternatives at its position; -1: the whole vocabulary. A request with it does
  // not read the prefix cache (vLLM's skip_reading_prefix_cache): every position is computed.
  std::optional<int> prompt_logprobs;
  // Per-row logits processors (engine/sampler.h applies them in vLLM's order). Token ids are
  // validated against the vocabulary by the server; the sampler ignores any outside it.
  std::vector<std::pair<int32_t, float>> logit_bias;  // (id, bias in [-100, 100]), ascending id
  std::vector<int32_t> allowed_token_ids;  // empty: every token; else only these may be sampled
  // Token sequences that may not be generated: the last id of each is masked when the output
  // so far ends with the others (vLLM's bad_words, tokenised with and without a leading space).
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  // Structured outputs / forced tool calls: the compiled grammar the output must follow
  // (null: unconstrained). Shared by the request's choices; see engine/structured_sampling.h.
  std::shared_ptr<const structured::StructuredConstraint> structured;
  // vLLM's thinking_token_budget: at most `max_tokens` generated tokens inside the reasoning
  // section (after `start_token`, before `end_token`; a prompt that ends inside an opened
  // section counts as inside). When the budget is spent, `end_token` is forced as the next
  // token (the "thinking_budget" logits stage) and generation goes on after it. max_tokens
  // -1: no budget; 0: the section is closed at once (Anthropic's thinking disabled).
  struct ThinkingBudget {
    int max_tokens = -1;
    int32_t start_token = -1;
    int32_t end_token = -1;
  } thinking;
};

enum class FinishReason { None, Stop, Length, Abort, Error };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // sorted by logprob, descending
};

// One prompt position's distribution (raw model logprobs): the prompt token there, its rank
// (1 + tokens with a larger logprob), and the top alternatives (ranks 1..k, in that order).
struct PromptTokenLogprob {
  int32_t token_id = 0;
  float logprob = 0;
  int64_t rank = 0;
  std::vector<std::pair<int32_t, float>> top;  // sorted by logprob, descending (ties: lower id)
};

// One delivery for one request: the tokens generated since the last delivery.
struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> new_token_ids;
  std::vector<TokenLogprob> logprobs;  // one per new token when requested
  // With prompt_logprobs, on the request's first delivery only: one per prompt token after
  // the first (prompt position p + 1 from the logits of position p).
  std::vector<PromptTokenLogprob> prompt_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::None;
  std::optional<int32_t> stop_token_id;  // the EOS / stop token that finished it, if any
  int num_prompt_tokens = 0;
  int num_cached_tokens = 0;  // prompt tokens served from the prefix cache
  int num_generated_tokens = 0;
  std::string error;  // when finish_reason == Error
  // Engine timestamps (steady clock; a default-constructed value = not reached yet), as vLLM's
  // QUEUED / SCHEDULED / first and last NEW_TOKENS events: when the engine thread took the
  // request, when it was first scheduled, its first and its latest generated token.
  std::chrono::steady_clock::time_point queued_time{}, scheduled_time{}, first_token_time{}, last_token_time{};
  int num_preemptions = 0;  // times this request was preempted (recomputed)
};

// Immutable once submitted.
struct Request {
  std::string id;
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  std::function<void(RequestOutput&&)> on_output;
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
  // 0: the shared prefix cache. Else the request's cache_salt as an identity with the top bit
  // set (content ids count up from 1 and never reach it): its blocks chain from this root, so
  // only requests with the same salt share cached prefixes (vLLM's cache_salt).
  uint64_t prefix_cache_root = 0;
};

struct EngineConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  // Prefill caps of one step (see engine/scheduler.h). vLLM's rule: when
  // max_num_partial_prefills > 1 and no threshold is given, the threshold becomes 4% of
  // max_model_len (resolved with max_model_len).
  int long_prefill_token_threshold = 0;  // 0: no cap
  int max_num_partial_prefills = 0;      // 0: no limit
  int max_model_len = 0;  // 0: the executor's
  bool enable_prefix_caching = true;
  int max_waiting_requests = 1024;  // submit() refuses beyond this (server answers 429/503)
  std::vector<int32_t> eos_token_ids;  // see read_eos_token_ids (engine/stop.h)
  uint64_t seed = 0;  // seeds the per-request RNG of requests without a seed
  // Sample next to the logits when the executor can (ExecutorInfo::device_sampling) and the
  // request needs no host feature (see device_sampling_params in engine/sampler.h); false
  // downloads every row and samples on the host (serve --host-sampling). The device and host
  // samplers draw from different random streams: seeded non-greedy outputs differ between
  // them (each is reproducible); greedy is the same argmax (lowest id on ties).
  bool device_sampling = true;
  // Structured-output masks of the rows sampled on the host are computed on a worker thread
  // while the executor runs the step (engine/structured_sampling.h); false computes them
  // after the step, at sampling. Outputs are the same either way.
  bool overlap_structured_masks = true;
  // Speculative decoding (--speculative-config; engine/spec_decode.h). SpecMethod::Ngram runs
  // on the host; eagle3 / mtp need an executor that loaded the draft (ExecutorInfo::draft_model).
  SpecConfig speculative;
  // How many of the num_speculative_tokens drafts each step runs (engine/spec_policy.h): by
  // default chosen per step from measured step costs and the running acceptance (0 included);
  // pinned_k >= 0 pins it (serve --no-speculative-adaptive: num_speculative_tokens).
  SpecPolicyOptions spec_policy;
};

// Live counters for /metrics, read without stopping the engine.
struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;
  double kv_cache_usage = 0;  // used blocks / total blocks, in [0, 1]
  uint64_t prefix_cache_queries = 0;  // prompt tokens looked up
  uint64_t prefix_cache_hits = 0;     // of those, served from the cache
  uint64_t num_preemptions = 0;
  // Tokens per engine step (prefill + decode), vllm:iteration_tokens_total's buckets.
  static constexpr std::array<int, 13> kIterationTokenBuckets = {1,   8,    16,   32,   64,   128, 256,
                                                                 512, 1024, 2048, 4096, 8192, 16384};
  std::array<uint64_t, kIterationTokenBuckets.size() + 1> iteration_tokens{};  // per bucket; last = +Inf
  uint64_t iteration_tokens_sum = 0;
  // Speculative decoding (vLLM's vllm:spec_decode_* counters); spec_k == 0: speculation off.
  int spec_k = 0;
  uint64_t spec_num_drafts = 0;           // verify rows (a sequence step with >= 1 draft)
  uint64_t spec_num_draft_tokens = 0;     // drafts verified
  uint64_t spec_num_accepted_tokens = 0;  // drafts accepted (bonus tokens excluded)
  std::vector<uint64_t> spec_accepted_per_pos;  // [spec_k]: drafts accepted at position i
  // The per-step k (engine/spec_policy.h): steps whose drafts were proposed with k (the choice
  // made at the end of a step for the next one), [spec_k + 1]; how many of those choices were
  // explorations; the latest choice; whether k adapts (false: pinned).
  bool spec_adaptive = false;
  std::vector<uint64_t> spec_chosen_k;
  uint64_t spec_k_explorations = 0;
  int spec_last_k = 0;
  // Where the engine thread's time goes (moeserve:engine_* on /metrics): steps run, their wall
  // time (schedule, execute, sampling, stop checks, delivery), the part inside the executor
  // (forward, device sampling, downloads), and the loop's time between one step and the next
  // while work was waiting (inbox, aborts, stats). Host overhead per step = step - execute + gap.
  uint64_t num_steps = 0;
  uint64_t step_ns = 0;
  uint64_t execute_ns = 0;
  uint64_t loop_gap_ns = 0;
};

class Engine {
 public:
  virtual ~Engine() = default;
  // Returns false (and does not take the request) when the waiting queue is full.
  // Throws moeserve::Error for an invalid request (e.g. prompt longer than max_model_len).
  virtual bool submit(Request request) = 0;
  // Cancels a request; frees its KV blocks; delivers a final output with Abort.
  virtual void abort(const std::string& request_id) = 0;
  virtual EngineStats stats() const = 0;
  virtual const EngineConfig& config() const = 0;
  virtual ExecutorInfo executor_info() const = 0;
  // Stops accepting; finishes (or, after `grace`, aborts) what runs; joins the thread.
  virtual void shutdown(std::chrono::milliseconds grace) = 0;
};

std::unique_ptr<Engine> make_engine(EngineConfig config, std::unique_ptr<ModelExecutor> executor);

}  // namespace moeserve
