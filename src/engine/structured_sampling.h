// Structured outputs on the engine's sampling path (host rows).
//
// A request with SamplingParams::structured gets a Matcher the first time one of its rows is
// sampled; its state lives in the Sequence's SamplerState, so it survives preemption
// (recompute re-runs the prompt and the generated tokens, not the sampler). The constraint
// starts after any of `start_after_tokens` (the reasoning section's end) is generated, or at
// the first token when that list is empty. Constrained rows are sampled on the host:
// device_sampling_params() sends them here (the device bitmask path is not built yet).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace moeserve {

struct Sequence;
namespace structured {
class Matcher;
}

struct StructuredState {
  std::unique_ptr<structured::Matcher> matcher;
  bool started = false;  // the reasoning section is over (or there is none)
  bool failed = false;   // a token the grammar rejected was produced (see structured_note_token)
  // A mask computed ahead by prepare_structured_mask, valid while the matcher is at
  // `ready_at` (its position()).
  std::vector<uint32_t> ready_mask;
  std::pair<size_t, int32_t> ready_at{0, -1};
  ~StructuredState();
};

// The logits row to sample from: `logits` itself when the sequence is unconstrained (or the
// constraint has not started), else a thread-local copy with disallowed tokens at -inf.
// Throws SamplingError when the grammar allows no token at all: the request then finishes
// with finish_reason "error" (as vLLM's FINISHED_ERROR), never unconstrained.
std::span<const float> apply_structured_mask(Sequence& seq, std::span<const float> logits);

// Whether the grammar is complete and allows nothing but a stop token now: min_tokens then
// lets the stop tokens through, so the value ends instead of the row being empty (vLLM
// lets terminal grammars stop under min_tokens the same way).
bool structured_allows_only_stop(Sequence& seq, std::span<const int32_t> stop_ids);
// The grammar has accepted its stop token (the constrained output is finished).
bool structured_terminated(const Sequence& seq);

// Advances the matcher by the generated token (and starts the constraint after a start token).
void structured_note_token(Sequence& seq, int32_t token);

// Computes the mask apply_structured_mask will need next, ahead of time: the engine calls it
// on a worker thread while the executor runs the step whose logits the mask applies to, so
// the mask work overlaps the model step. Only touches this sequence's StructuredState (and
// the shared grammar, which locks); never throws (a failure is left to apply_structured_mask,
// which computes again and reports it).
void prepare_structured_mask(Sequence& seq);
// For a device row: the buffer its DeviceSampling::mask points at (mask_words() words), sized
// here on the engine thread so the pointer stays put while prepare_structured_mask fills it on
// a worker thread; empty when no mask applies now (no constraint, not started, finished).
std::span<const uint32_t> structured_device_mask(Sequence& seq);

// Masks taken from prepare_structured_mask so far (process-wide; tests).
uint64_t structured_masks_taken_ahead();

// Whether sampling this sequence needs the host (it has a constraint).
bool has_structured_constraint(const Sequence& seq);

}  // namespace moeserve
