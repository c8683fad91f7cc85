// TEST ONLY (built with MOESERVE_TEST_BACKENDS, library moeserve_engine_testing).
// A deterministic fake model for engine unit tests. The next-token logits are a fixed
// function of (last token, position, hash of the whole context), where the context is read
// back from a FakeKvCache through the block table, so results are checkable against
// ToyExecutor::reference_logits(tokens) and any KV bookkeeping bug changes the output.
#pragma once
#include <chrono>
#include <mutex>
#include <span>
#include <vector>

#include "engine/executor.h"
#include "engine/testing/fake_kv.h"

namespace moeserve::testing {

struct ToyExecutorConfig {
  int vocab_size = 64;
  int max_model_len = 256;
  int block_size = 4;
  int num_kv_blocks = 128;
  float peak = 3.0f;  // extra logit of the preferred token (higher: more peaked)
  std::chrono::microseconds step_sleep{0};
};

struct ToyStepRecord {
  int num_seqs = 0;
  int num_tokens = 0;
  int num_logit_rows = 0;
};

class ToyExecutor final : public ModelExecutor {
 public:
  explicit ToyExecutor(ToyExecutorConfig config);
  ExecutorInfo info() const override;
  StepResult execute(const StepBatch& batch) override;

  // The logits the toy model gives after `context` (vocab_size floats into out).
  static void reference_logits(const ToyExecutorConfig& config, std::span<const int32_t> context, float* out);
  // Greedy continuation of `prompt` by `n` tokens (stops early at a token in `eos`).
  static std::vector<int32_t> reference_greedy(const ToyExecutorConfig& config, std::vector<int32_t> prompt, int n,
                                               const std::vector<int32_t>& eos = {});
  std::vector<ToyStepRecord> records() const;

 private:
  ToyExecutorConfig config_;
  FakeKvCache kv_;
  mutable std::mutex mu_;
  std::vector<ToyStepRecord> records_;
};

}  // namespace moeserve::testing
