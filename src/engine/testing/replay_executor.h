// TEST ONLY (built with MOESERVE_TEST_BACKENDS, library moeserve_engine_testing; never in a
// production build). A fake model that makes the engine generate scripted token
// sequences, for server end-to-end tests (tool calls, reasoning) and the server benchmark.
//
// Script choice: when a sequence first asks for logits, its context is its prompt; the
// first script whose `marker` (a token-id subsequence) occurs in the prompt is chosen,
// else the first script with an empty marker (the global script), else none. The k-th
// generated token is then script.tokens[k]; after the script, `end_token` (set it to an
// EOS id). The forced token gets `forced_logit`, every other id 0, so greedy and ordinary
// sampling settings all pick it. Contexts are read back through a FakeKvCache, so
// preemption, chunked prefill and prefix caching behave as with a real model.
#pragma once
#include <chrono>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <unordered_map>
#include <vector>

#include "engine/executor.h"
#include "engine/testing/fake_kv.h"

namespace moeserve::testing {

struct ReplayScript {
  std::vector<int32_t> marker;  // empty: matches every prompt
  std::vector<int32_t> tokens;
};

struct ReplayExecutorConfig {
  int vocab_size = 32000;
  int max_model_len = 4096;
  int block_size = 16;
  int num_kv_blocks = 4096;
  std::vector<ReplayScript> scripts;
  int32_t end_token = 0;
  float forced_logit = 30.0f;
  std::chrono::microseconds step_sleep{0};       // per execute() call
  std::chrono::microseconds per_token_sleep{0};  // per query token in the batch (prefill cost)
};

// {"vocab_size", "max_model_len", "block_size", "num_kv_blocks", "end_token", "forced_logit",
//  "step_sleep_us", "per_token_sleep_us", "scripts": [{"marker": [ids], "tokens": [ids]}]},
// every key optional. Throws moeserve::Error on a wrong type.
ReplayExecutorConfig replay_config_from_json(const nlohmann::json& j);

class ReplayExecutor final : public ModelExecutor {
 public:
  explicit ReplayExecutor(ReplayExecutorConfig config);
  ExecutorInfo info() const override;
  StepResult execute(const StepBatch& batch) override;
  // Keeps the buffer: it stays all zeros except the forced entries, which the next step
  // resets, so a step costs O(rows), not O(rows x vocab) (the bench uses a 200k vocab).
  void recycle(StepResult&& result) override;

 private:
  struct SeqState {
    int script = -1;  // index into scripts, -1: none
    int prompt_len = 0;
  };
  int choose_script(const std::vector<int32_t>& prompt) const;

  ReplayExecutorConfig config_;
  FakeKvCache kv_;
  std::vector<float> spare_;    // a recycled logits buffer
  std::vector<size_t> dirty_;   // its non-zero entries
  std::unordered_map<int64_t, SeqState> seqs_;  // engine seq ids are never reused
};

}  // namespace moeserve::testing
