// Continuous batching with chunked prefill, in vLLM v1's shape: each step spends a token
// budget (max_num_batched_tokens) first on running sequences (decode tokens and the rest
// of chunked prefills, in admission order), then admits waiting sequences FCFS while
// budget, max_num_seqs and KV blocks allow. A prompt longer than the remaining budget is
// split into chunks over several steps; only the chunk that reaches the end of the known
// tokens asks for logits.
//
// Decodes first: before any prefill chunk is sized, one budget token is reserved for every
// running sequence in decode (one uncomputed token), so a prefill chunk of an older running
// sequence or of a new one only takes what the decodes leave (budget - decodes). A step's
// tokens never exceed the budget and a decode is never left out for a prefill. Two caps
// bound the prefill work of one step (they trade TTFT for inter-token latency):
//   - long_prefill_token_threshold (vLLM's): no sequence gets more than this many tokens in
//     one step (0: no cap);
//   - max_num_partial_prefills: at most this many sequences get a prefill chunk in one step
//     (vLLM V0's meaning; V1 only derives the threshold from it); 0: no limit. A running
//     prefill over the limit waits a step (older ones first); a waiting one is not admitted.
//
// Preemption by recompute: when a running sequence cannot get the blocks it needs, the
// most recently admitted running sequence is preempted (all its blocks released, computed
// count reset) and put at the front of the waiting queue; it is readmitted before any new
// request and recomputes prompt + generated tokens, mostly from the prefix cache. No new
// request is admitted in a step that preempted. Its sampler state (RNG, counts) is kept,
// so it continues exactly.
//
// Speculative decoding: a decoding sequence with drafts (Sequence::spec_tokens) is scheduled
// with 1 + k query tokens: its lookahead slots are planned in the same KvPlan (grow to
// num_computed + 1 + k), k is cut so the other decodes keep their reserved token, the step
// stays inside max_model_len and long_prefill_token_threshold, and when the blocks for the
// drafts are not there the drafts are dropped (k = 0) before anyone is preempted.
//
// Transactions: schedule() plans every KV change into a KvPlan and commits (apply + queue
// moves) only at the end, so a plan never leaves half-applied state.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/executor.h"
#include "engine/sequence.h"

namespace moeserve {

struct SchedulerConfig {
  int max_num_seqs = 256;
  int max_num_batched_tokens = 2048;
  int max_model_len = 0;  // > 0
  int long_prefill_token_threshold = 0;  // per-sequence tokens per step; 0: no cap
  int max_num_partial_prefills = 0;      // sequences with a prefill chunk per step; 0: no limit
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int start_pos = 0;   // num_computed_tokens when scheduled
  int num_tokens = 0;  // query tokens this step
  bool sample = false;  // the chunk ends at the last known token: sample after the step
  int num_spec = 0;     // of num_tokens, drafts (seq->spec_tokens[0, num_spec)) after the last token
};

struct SchedulerOutput {
  StepBatch batch;                     // what the executor runs
  std::vector<ScheduledSeq> scheduled;  // parallel to batch.seqs
  std::vector<Sequence*> preempted;     // preempted in this step (now waiting)
  int num_batched_tokens = 0;
  int num_prefills = 0;  // scheduled sequences that had more than one token to compute
  bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, BlockManager& blocks);

  // Queues a new sequence at the back of the waiting queue (FCFS).
  Sequence* add(std::unique_ptr<Sequence> seq);
  // Plans and commits one step. Empty when nothing can run.
  SchedulerOutput schedule();
  // After the executor ran `out`: the scheduled tokens now have K/V; full blocks enter
  // the prefix cache. Call before appending sampled tokens.
  void on_step_executed(const SchedulerOutput& out);
  // Speculative rejection, after on_step_executed: only positions [0, num_valid) hold K/V of
  // the sequence's tokens (the rest held rejected drafts). Sets num_computed_tokens back and
  // frees the blocks past num_valid (their lookahead slots); nothing is copied.
  void rollback_rejected(Sequence* seq, int num_valid);
  // Removes a sequence (finished or aborted), releasing its blocks.
  std::unique_ptr<Sequence> remove(Sequence* seq, FinishReason reason);
  Sequence* find(int64_t seq_id) const;

  int num_running() const { return static_cast<int>(running_.size()); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  bool has_work() const { return !running_.empty() || !waiting_.empty(); }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  uint64_t prefix_cache_queries() const { return prefix_queries_; }
  uint64_t prefix_cache_hits() const { return prefix_hits_; }
  uint64_t num_preemptions() const { return num_preemptions_; }
  const SchedulerConfig& config() const { return config_; }
  BlockManager& block_manager() { return blocks_; }

 private:
  SchedulerConfig config_;
  BlockManager& blocks_;
  std::unordered_map<int64_t, std::unique_ptr<Sequence>> seqs_;
  std::vector<Sequence*> running_;  // admission order: the back is the preemption victim
  std::deque<Sequence*> waiting_;
  uint64_t prefix_queries_ = 0, prefix_hits_ = 0, num_preemptions_ = 0;
};

}  // namespace moeserve
