// Host sampler chain over one row of logits, in vLLM v1's order:
//   raw logits --(logprobs are taken here: vLLM v1 returns raw-model logprobs)
//   -> the per-row logits stages (kLogitsStages below, on a copy of the row):
//      allowed_token_ids mask, bad_words mask, logit_bias, min_tokens mask (EOS / stop ids
//      to -inf until min_tokens are generated), penalties (repetition over prompt + output
//      tokens, presence / frequency over output tokens), thinking budget (once a request's
//      thinking_token_budget tokens are inside the reasoning section, its end token is forced)
//   -> temperature (< 1e-5: greedy argmax, ties to the lowest id)
//   -> min_p -> top_k -> top_p -> draw from the per-sequence RNG.
// Each stage is a free function so tests can check it alone. The draw uses one uniform
// variate from the sequence's own std::mt19937_64 per sampled token, so a seeded request
// gives the same tokens whatever else is in the batch.
//
// Total: whatever the logits hold, the sampler never picks from an empty set. NaN counts as
// -inf; a row whose largest value is not finite (every entry -inf / NaN, e.g. everything
// masked, or any +inf) throws SamplingError, which the engine turns into that request's
// failure (finish_reason error) while the other requests continue.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/executor.h"
#include "engine/sequence.h"

namespace moeserve {

constexpr float kSamplingEps = 1e-5f;

// A row that cannot be sampled (see the header comment). The message says why.
class SamplingError : public Error {
 public:
  using Error::Error;
};
// The reason given when a row's maximum is `max` (not finite).
std::string no_candidate_message(float max);

struct SampleInput;

// One per-row logits processor: `active` says whether it changes `seq`'s next row (cheap,
// no logits needed); `apply` edits the working copy of the row in place. Stages run in the
// order of logits_stages(); a new mask (e.g. a structured-output grammar) is one more entry.
struct LogitsStage {
  const char* name;
  bool (*active)(const Sequence& seq);
  void (*apply)(std::span<float> row, Sequence& seq, const SampleInput& in);
};
std::span<const LogitsStage> logits_stages();
// True when any stage changes `seq`'s next row: such rows are sampled on the host.
bool needs_logits_processing(const Sequence& seq);

// The stages' kernels, exposed for tests. Out-of-vocabulary ids are skipped.
void apply_allowed_token_ids(std::span<float> logits, std::span<const int32_t> allowed);
void apply_bad_words(std::span<float> logits, const std::vector<std::vector<int32_t>>& bad_words,
                     std::span<const int32_t> output_so_far);
void apply_logit_bias(std::span<float> logits, std::span<const std::pair<int32_t, float>> bias);

// Penalties in place, as vLLM defines them. repetition_penalty r: a logit l of a token seen
// in prompt or output becomes l / r if l > 0 else l * r. presence p / frequency f: a token
// generated c > 0 times loses p + f * c.
void apply_penalties(std::span<float> logits, const SamplingParams& p, std::span<const int32_t> prompt_set,
                     const std::unordered_map<int32_t, int>& output_counts);

// log-softmax of `logits` (max-subtracted, -inf safe).
std::vector<float> log_softmax(std::span<const float> logits);

// Greedy: the largest logit, lowest id on ties (NaN counts as -inf). A row with no value
// above -inf gives 0 (callers that must not guess check the maximum first, as sample_token).
int32_t argmax_lowest(std::span<const float> logits);

// The candidate set after temperature, min_p, top_k, top_p: ids with their probabilities
// (renormalised to sum 1), sorted by id, never empty. `logits` must already be penalised.
// Throws SamplingError when the row's maximum is not finite.
struct Candidates {
  std::vector<int32_t> ids;
  std::vector<double> probs;
};
Candidates filter_candidates(std::span<const float> logits, const SamplingParams& p);

// Inverse-CDF draw over candidates (in id order) with u in [0, 1). The exact slow path.
int32_t draw(const Candidates& c, double u);

// The fast path splits the vocabulary at z = (l - max) / T = -tail_cut: the head (z >= -cut)
// is filtered and weighed exactly; every tail id has probability < e^-cut relative to the top
// id, so the tail's mass is at most n_tail * e^-cut (< 5e-4 of the top id's at V = 200k).
// The draw keeps that bound as an extra slot; only when the uniform lands there (rarely) is
// the tail evaluated, and the draw stays exact in distribution. Tests lower tail_cut to
// exercise the tail.
constexpr double kSamplerTailCut = 20.0;
// One token from penalised logits: greedy below kSamplingEps, else temperature, min_p,
// top_k, top_p as filter_candidates + draw, with the same distribution. Consumes one uniform
// from rng (two in the rare tail-redraw case). Allocation-free in steady state (per-thread
// scratch). Throws SamplingError when the row's maximum is not finite (greedy too).
int32_t sample_token(std::span<const float> logits, const SamplingParams& p, std::mt19937_64& rng,
                     double tail_cut = kSamplerTailCut);
double uniform01(std::mt19937_64& rng);  // 53-bit uniform in [0, 1)

struct SampleResult {
  int32_t token = 0;
  bool has_logprobs = false;
  TokenLogprob logprob;
};

struct SampleInput {
  std::span<const float> logits;  // one row, vocab_size entries (not modified)
  const std::vector<int32_t>* eos_token_ids = nullptr;
};

// Samples the next token of `seq` (reads params, prompt, output counts, RNG; advances the
// RNG and nothing else: the caller appends the token and updates the counts). Throws
// SamplingError for a row that cannot be sampled.
SampleResult sample_next(Sequence& seq, const SampleInput& in);

// Records a generated token in the sampler state (output counts for penalties).
void note_generated(Sequence& seq, int32_t token);

// The device-sampling parameters of `seq`'s next token (seed left 0 for the caller to fill),
// or nullopt when it needs a host feature: any active logits stage (masks, bias, an active
// min_tokens mask, penalties), min_p or logprobs. The engine samples those rows on the host,
// so every feature gives the host sampler's result on a device-sampling executor too. temperature < kSamplingEps maps to greedy (0) and top_k -1
// to 0, so the device sees the host sampler's semantics.
std::optional<DeviceSampling> device_sampling_params(const Sequence& seq);

}  // namespace moeserve
