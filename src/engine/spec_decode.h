// Speculative decoding on the host: the n-gram prompt-lookup proposer and the verification of
// one sequence's drafts against the target's logits.
//
// A speculating sequence's step has 1 + k query tokens (its last sampled token, then the k
// drafts); the executor returns the logits of all 1 + k positions (SequenceStep::num_logits).
// Verification walks the positions in order with the one host sampler (sample_next): position
// j is sampled with the sequence's state exactly as it would be without speculation (output
// counts for penalties, bad_words' history, min_tokens, the thinking budget and the
// structured-output matcher all include the drafts accepted before j), the token is appended,
// and the walk stops at the first token that differs from draft j (or at a stop condition);
// when every draft matched, the token of position k is the bonus token.
//   - greedy: the sampled token is the argmax, so this is "the longest prefix of drafts equal
//     to the target's argmax, then the target's token" (vLLM's rejection_greedy_sample).
//   - temperature > 0: drawing y ~ p (the filtered target distribution) and accepting draft x
//     iff y == x accepts x with probability p(x) and otherwise outputs a token from p with x
//     removed: the same law as vLLM's rule for drafts without probabilities (accept iff
//     p(x) >= u, else the recovered token from p without x). Each emitted token uses the
//     sequence's own RNG exactly as a non-speculative step would, so a seeded request gives
//     the same tokens with speculation on and off (on the host sampler).
// Rejected positions cost nothing but bookkeeping: the caller sets num_computed_tokens back
// and frees the blocks past it (Scheduler::rollback_rejected); their K/V is overwritten later.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "engine/sequence.h"
#include "engine/spec_config.h"
#include "engine/stop.h"

namespace moeserve {

// vLLM's n-gram proposer (_find_longest_matched_ngram_and_propose_tokens): the longest n-gram
// (min_n <= n <= max_n) ending the sequence that also occurs earlier, the earliest such
// occurrence on ties; returns up to k tokens that followed it (fewer near the end; none if no
// match of at least min_n tokens).
std::vector<int32_t> propose_ngram(std::span<const int32_t> tokens, int min_n, int max_n, int k);

// The most drafts `seq`'s next step may take under `cfg` (0: none), for every method: k capped
// so the step stays inside max_model_len (vLLM's cap) and does not draft past max_tokens (a
// token after the last allowed one would be dropped anyway). The step's k (spec_policy.h) is
// at most this.
int draft_budget(const SpecConfig& cfg, const Sequence& seq, int max_model_len);

// What verification of one sequence produced. `emitted` were appended to seq.tokens (and
// recorded with note_generated) in order; `stop` is the decision after the last of them.
struct VerifyOutcome {
  std::vector<SampleResult> emitted;
  StopDecision stop;
  int num_accepted = 0;  // leading drafts equal to the emitted tokens (the bonus excluded)
  std::string error;     // position 0 could not be sampled: the request fails (nothing emitted)
};

struct VerifyInput {
  std::span<const float> logits;         // [drafts.size() + 1, vocab] rows of the step, in position order
  std::span<const int32_t> drafts;       // the step's drafts (may be empty: a plain decode row)
  const std::vector<int32_t>* eos_token_ids = nullptr;
  int max_model_len = 0;
};

// Samples position 0, then each further position while the previous token equals its draft
// and no stop fired (see the header comment). A failure to sample position j > 0 ends the walk
// before j without an error: the sequence then re-runs position j as its next plain decode
// and fails there exactly as without speculation.
VerifyOutcome verify_and_sample(Sequence& seq, const VerifyInput& in);

}  // namespace moeserve
