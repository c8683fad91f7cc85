// Engine-local state of one request. The Request (engine.h) is immutable API input; the
// Sequence is what the engine thread mutates: tokens, KV progress, blocks, sampling state.
// Only the engine thread touches a Sequence.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/engine.h"
#include "engine/structured_sampling.h"

namespace moeserve {

enum class SeqStatus {
  Waiting,   // queued (new, or preempted and waiting for recompute)
  Running,   // has KV blocks; scheduled every step until it finishes or is preempted
  Finished,  // done; blocks released
};

// Sampling state that must survive preemption so a recomputed sequence continues exactly.
struct SamplerState {
  std::mt19937_64 rng;
  std::unordered_map<int32_t, int> output_counts;  // generated token -> occurrences
  std::vector<int32_t> prompt_set;  // sorted unique prompt ids (built lazily for repetition_penalty)
  bool prompt_set_ready = false;
  std::shared_ptr<StructuredState> structured;  // matcher of a constrained request (lazily made)
  // SamplingParams::thinking: whether the output is inside the reasoning section and how many
  // tokens it has there. Set from the prompt on first use (mutable: the logits stages' `active`
  // test reads a const Sequence), then advanced by note_generated; kept across preemption.
  struct Thinking {
    bool ready = false;
    bool inside = false;
    int count = 0;
  };
  mutable Thinking thinking;
};

struct Sequence {
  int64_t id = 0;  // unique for the engine's lifetime; the executor's seq_id
  std::shared_ptr<const Request> request;
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int num_prompt_tokens = 0;
  // Positions [0, num_computed_tokens) have K/V in the cache. In steady decode this is
  // tokens.size() - 1: the last sampled token is the next step's query token.
  int num_computed_tokens = 0;
  // Speculative decoding: drafts proposed for the next step (engine/spec_decode.h), not part of
  // `tokens`. The scheduler runs them as extra query tokens after the last sampled token (as
  // many as the budget, max_model_len and the KV blocks allow) and drops them on preemption.
  std::vector<int32_t> spec_tokens;
  // The k the policy asked the proposer for (engine/spec_policy.h; spec_tokens may be fewer: an
  // n-gram without a match); 0 when none was asked. Reset with spec_tokens.
  int spec_asked = 0;
  int num_cached_tokens = 0;  // prompt tokens served from the prefix cache at first admission
  bool admitted_once = false;
  SeqStatus status = SeqStatus::Waiting;
  int num_preemptions = 0;
  SeqBlocks blocks;
  SamplerState sampler;
  FinishReason finish_reason = FinishReason::None;
  // prompt_logprobs: entry p for prompt token p + 1, filled as prefill chunks run (a recompute
  // after preemption overwrites with the same values), moved out with the first delivery.
  std::vector<PromptTokenLogprob> prompt_logprobs;
  bool prompt_logprobs_delivered = false;
  // Engine timestamps reported in RequestOutput (default value: not reached).
  std::chrono::steady_clock::time_point queued_time{}, scheduled_time{}, first_token_time{}, last_token_time{};

  const SamplingParams& params() const { return request->params; }
  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  std::span<const int32_t> prompt() const { return {tokens.data(), size_t(num_prompt_tokens)}; }
  std::span<const int32_t> output() const {
    return {tokens.data() + num_prompt_tokens, size_t(num_output_tokens())};
  }
  // Tokens still to be computed before the next sample (prefill rest, or 1 in decode).
  int num_uncomputed() const { return num_tokens() - num_computed_tokens; }
  bool finished() const { return status == SeqStatus::Finished; }
};

}  // namespace moeserve
