// The seam between the engine (scheduling, KV block accounting, sampling) and a model
// running on a backend. The engine plans which tokens of which sequences run this step
// and where their K/V live; the executor turns that into AttentionMeta, runs the forward
// pass and returns logits for the sequences that sample this step.
#pragma once
#include <cstdint>
#include <vector>

namespace moeserve {

struct SequenceStep {
  int64_t seq_id = 0;
  std::vector<int32_t> tokens;       // query tokens this step: a prefill chunk or one decode token
  int32_t start_pos = 0;             // position of tokens[0] = tokens already in the KV cache
  std::vector<int32_t> block_table;  // physical KV blocks covering [0, start_pos + tokens.size())
  bool need_logits = true;           // false for non-final prefill chunks
};

struct StepBatch {
  std::vector<SequenceStep> seqs;
};

struct StepResult {
  int vocab_size = 0;
  // Row-major [num rows, vocab_size] f32: one row per sequence with need_logits, in batch
  // order. Row r holds the logits of that sequence's last query token.
  std::vector<float> logits;
};

struct ExecutorInfo {
  int vocab_size = 0;
  int max_model_len = 0;
  int block_size = 16;
  int num_kv_blocks = 0;  // blocks in the KV pool this executor allocated
};

class ModelExecutor {
 public:
  virtual ~ModelExecutor() = default;
  virtual ExecutorInfo info() const = 0;
  virtual StepResult execute(const StepBatch& batch) = 0;
  // The engine hands each result back once it has sampled from it, so an executor may reuse
  // the logits buffer (hundreds of MB per step at a 200k vocabulary). Optional.
  virtual void recycle(StepResult&& result) { (void)result; }
};

}  // namespace moeserve
