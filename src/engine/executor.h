// The seam between the engine (scheduling, KV block accounting, sampling) and a model
// running on a backend. The engine plans which tokens of which sequences run this step
// and where their K/V live; the executor turns that into AttentionMeta, runs the forward
// pass and returns logits for the sequences that sample this step.
//
// Device sampling (ExecutorInfo::device_sampling): an executor whose backend can sample next
// to the logits (CUDA) takes per-row sampling parameters and returns token ids for those
// rows instead of logits rows, so only the rows the engine samples on the host (penalties,
// min_p, min_tokens masks, logprobs) cross to the host. The engine decides per row.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

namespace moeserve {

// How the executor samples one row on the device: temperature, then top-k, then top-p over
// the kept mass, then one draw. The seed is this row's draw at this step (the engine takes it
// from the request's RNG), so the token depends only on (logits, params), not on the batch.
// Sampled ids that say a row could not be sampled, as the host sampler's SamplingError: its
// largest logit (NaN counted as -inf) is -inf (everything masked) or +inf.
constexpr int32_t kDeviceNoCandidate = -1;
constexpr int32_t kDeviceInfLogit = -2;

struct DeviceSampling {
  float temperature = 0.f;  // 0: greedy, lowest id on ties
  int top_k = 0;            // <= 0: off
  float top_p = 1.f;        // >= 1: off
  uint64_t seed = 0;
  // Structured outputs: the row's allowed-token bitset (bit i%32 of word i/32 = token i
  // allowed; tokens at or past mask_words * 32 are not), or null. Host memory owned by the
  // sequence's StructuredState; it may still be being written by a worker thread when
  // execute() starts: read it only after StepBatch::await_masks returned. The device applies
  // it before temperature / top-k / top-p (masked tokens are -inf), as the host sampler does.
  const uint32_t* mask = nullptr;
  size_t mask_words = 0;
};

struct SequenceStep {
  int64_t seq_id = 0;
  std::vector<int32_t> tokens;       // query tokens this step: a prefill chunk or one decode token
  int32_t start_pos = 0;             // position of tokens[0] = tokens already in the KV cache
  std::vector<int32_t> block_table;  // physical KV blocks covering [0, start_pos + tokens.size())
  bool need_logits = true;           // false for non-final prefill chunks
  // With need_logits: logits rows for the last num_logits query tokens, in token order
  // (speculative verification: the last sampled token plus k drafts give 1 + k rows, each
  // sampled on the host; device_sample must be unset and need_prompt_logits false when > 1).
  int num_logits = 1;
  // With need_logits, only when the executor reports device_sampling: sample this row on the
  // device; its token id comes back in StepResult::sampled_ids instead of a logits row.
  std::optional<DeviceSampling> device_sample;
  // prompt_logprobs: also return the logits of every query token of this step (a prefill
  // chunk's positions) in StepResult::prompt_logits. Set only for requests that ask, so a
  // normal prefill computes the lm_head for its last token only.
  bool need_prompt_logits = false;
};

struct StepBatch {
  std::vector<SequenceStep> seqs;
  // Set when some device_sample carries a mask that a CPU thread is still computing (the
  // grammar masks of step t are made while the device runs step t's forward): the executor
  // calls it after enqueueing the forward and before it reads any DeviceSampling::mask.
  std::function<void()> await_masks;
};

struct StepResult {
  int vocab_size = 0;
  // Row-major [num rows, vocab_size] f32: num_logits rows per sequence with need_logits and no
  // device_sample, in batch order, then token order: the logits of that sequence's last
  // num_logits query tokens (usually one row: the last query token).
  std::vector<float> logits;
  // One token id per sequence with need_logits and device_sample, in batch order (or
  // kDeviceNoCandidate / kDeviceInfLogit for a row without a finite maximum).
  std::vector<int32_t> sampled_ids;
  // Row-major [sum of tokens.size() over sequences with need_prompt_logits, vocab_size] f32:
  // each such sequence's query tokens' logits, in batch order, then token order.
  std::vector<float> prompt_logits;
};

// Speculative decoding with a draft held by the executor (EAGLE-3 heads, MTP modules;
// runtime/spec_runner.h). After each step the engine hands over, per sequence that ran and
// goes on, the rows of that step now verified (positions first_row .. end_row - 1: their
// target hidden states are final and tokens[r + 1] is known for each) so the draft's own KV
// cache follows the accepted sequence, and asks for k drafts (0: only the cache update, e.g.
// a non-final prefill chunk).
struct DraftSeq {
  int64_t seq_id = 0;
  const std::vector<int32_t>* tokens = nullptr;  // prompt + output after this step's sampling
  int first_row = 0;
  int end_row = 0;
  int k = 0;
  std::vector<int32_t> block_table;  // the sequence's blocks now (cover [0, end_row))
};
struct DraftBatch {
  std::vector<DraftSeq> seqs;
};

struct ExecutorInfo {
  int vocab_size = 0;
  int max_model_len = 0;
  int block_size = 16;
  int num_kv_blocks = 0;  // blocks in the KV pool this executor allocated
  bool device_sampling = false;  // honours SequenceStep::device_sample
  bool draft_model = false;      // propose() runs a draft (EAGLE-3 / MTP)
};

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  virtual ExecutorInfo info() const = 0;
  virtual StepResult execute(const StepBatch& batch) = 0;
  // The engine hands each result back once it has sampled from it, so an executor may reuse
  // the logits buffer (hundreds of MB per step at a 200k vocabulary). Optional.
  virtual void recycle(StepResult&& result) { (void)result; }
  // Drafts per sequence of `batch` (same order; at most k each) from the executor's draft,
  // after updating its cache with the verified rows. Only when info().draft_model.
  virtual std::vector<std::vector<int32_t>> propose(const DraftBatch& batch) {
    (void)batch;
    return {};
  }
  // The sequence finished or was preempted: its draft state (if any) is dropped.
  virtual void release_draft(int64_t seq_id) { (void)seq_id; }
};

}  // namespace moeserve
