// SpecRunner: the draft side of speculative decoding inside a RankExecutor (EAGLE-3 heads and
// MTP modules; n-gram needs no executor). It asks the target to capture hidden states in its
// forward (Model::set_capture: backend-op copies at layer boundaries / after the final norm),
// keeps the draft's own paged KV cache (indexed by the target's block tables: slot p holds
// the draft's K/V of position p), and on propose() runs, per sequence:
//
// EAGLE-3 (model/eagle3.h; the chain of scripts/demo_heads.py Eagle3.unrolled, feed_drafts):
//   step 0 over the newly verified rows r: token tokens[r + 1], position r, g = fc(taps_r);
//          writes draft K/V at slot r (the teacher rows every later step attends to);
//          the last row t gives d_1 and prenorm_0.
//   step j (1 <= j < k): token d_j, position t + j, g = prenorm_{j-1}; attends slots 0..t+j
//          (step-0 rows plus this chain's own rows t+1..t+j-1) and gives d_{j+1}.
//   Chain slots past the sequence's blocks go to scratch blocks after the pool (a rejected
//   chain's K/V is never read again: the next step 0 overwrites slots from t + 1 on).
// MTP (model.h MtpStepArgs; scripts/demo_heads.py MTPHeads: module 1 takes the final hidden
// state after the norm, module k > 1 the previous module's output, every module at row s uses
// RoPE position s): module k's row s reads X[s + k] of the sequence extended by this chain's
// drafts (X = tokens, then d_1, d_2, ...) and h^{k-1}_s. Each pass recomputes every module on
// rows [first_row - (M - 1), end_row) (the last M - 1 rows of the previous pass used drafts or
// placeholders; the target's h^0 of those rows is kept per sequence on the host), so a
// module's cache rows always match the accepted sequence up to what is known, and drafts are
// exactly the training script's teacher chain whenever the earlier drafts were right.
//   num_speculative_tokens > M modules is refused (vLLM reuses modules cyclically when k is a
//   multiple of M; moeserve does not).
// Drafts are greedy (argmax; the lowest id on ties): verification treats them as tokens
// without probabilities (engine/spec_decode.h), which is exact for every temperature.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/executor.h"
#include "engine/spec_config.h"
#include "model/eagle3.h"
#include "model/model.h"

namespace moeserve {

struct SpecRunnerOptions {
  SpecConfig config;
  std::string target_dir;  // the target's checkpoint (MTP modules are read from it)
  int num_kv_blocks = 0;   // the engine's pool (set by allocate_kv; the draft cache adds its scratch after it)
  int block_size = 16;
  int max_num_seqs = 256;
};

class SpecRunner {
 public:
  // Loads the draft and sets the target's capture; throws naming what is missing or wrong.
  SpecRunner(const SpecRunnerOptions& opts, Backend& backend, Model& target);
  // Device bytes the draft's KV cache takes per block of the engine's pool (the executor sizes
  // the pool for target + draft from the memory left), and the allocation once it is sized.
  int64_t kv_bytes_per_block() const;
  void allocate_kv(int num_kv_blocks);
  // After each target forward: where each sequence's rows are in the captured tensors.
  void note_step(const StepBatch& batch);
  std::vector<std::vector<int32_t>> propose(const DraftBatch& batch);
  void release(int64_t seq_id) { mtp_state_.erase(seq_id); }

 private:
  struct StepRows {
    int offset = 0;     // first captured row of the sequence's query tokens
    int start_pos = 0;  // position of that row
    int count = 0;
  };
  struct MtpState {
    int next_row = -1;         // the first_row the next pass expects
    int win_lo = 0;            // h0 window rows [win_lo, next_row)
    std::vector<float> h0;     // [(next_row - win_lo), H]
  };
  KvLayout kv_layout_;  // the draft's (EAGLE-3 midlayer or the MTP modules)
  std::vector<std::vector<int32_t>> propose_eagle(const DraftBatch& batch);
  std::vector<std::vector<int32_t>> propose_mtp(const DraftBatch& batch);
  const StepRows& rows_of(const DraftSeq& s) const;
  // Argmax per row of logits [R, W] (lowest id on ties).
  std::vector<int32_t> argmax_rows(const Tensor& logits);
  Tensor upload_i32(const std::vector<int32_t>& v, int slot);

  SpecRunnerOptions opts_;
  Backend& be_;
  Model& target_;
  int H_ = 0;
  std::unique_ptr<Eagle3Head> eagle_;
  int num_mtp_ = 0;
  std::vector<KVCacheLayer> kv_;  // the draft's cache (EAGLE-3: 1 layer; MTP: one per module)
  int scratch_per_seq_ = 0;       // EAGLE-3 chain blocks per sequence after the pool
  std::map<int64_t, StepRows> last_step_;
  std::map<int64_t, MtpState> mtp_state_;
  std::vector<Tensor> i32_bufs_;  // grow-only device I32 buffers, one per use slot
  std::vector<Tensor> act_bufs_;  // grow-only device activation buffers
};

}  // namespace moeserve
