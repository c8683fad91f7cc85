// A scripted multi-sequence run of a ModelExecutor, for comparing two executors step by step
// (eager vs padded decode vs graph replay): sequences prefill (alone, together, or mixed with
// decodes), decode in batches of changing size (1, 3, 9, 7, 4, ... so buckets pad), leave and
// come back. Tokens are greedy from the reference run and forced on the run under test
// (teacher forcing), so a near-tie flip cannot make the two runs diverge.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/executor.h"
#include "runtime/graph_runner.h"
#include "runtime/model_executor.h"
#include "tools/generate.h"

namespace moeserve::test {

struct ScenarioTrace {
  std::vector<std::vector<float>> logits;      // per step: [sequences of the step, V]
  std::vector<std::vector<int32_t>> next;      // per step: the token each sequence continues with
  std::vector<std::vector<int64_t>> seq_ids;   // per step
  int vocab = 0;
};

// Executor options the scenario is written for: 12 blocks of 4 tokens per sequence, up to 16
// sequences and 64 tokens per step.
inline ExecutorOptions scenario_options(const std::string& model_dir) {
  ExecutorOptions eo;
  eo.model_dir = model_dir;
  eo.block_size = 4;
  eo.num_kv_blocks = 128;
  eo.max_num_seqs = 16;
  eo.max_num_batched_tokens = 64;
  return eo;
}

// Replays the captured closure: the same contract as a CUDA graph (fixed buffers, new
// metadata written into them before each replay).
class RecordingRunner : public GraphRunner {
 public:
  bool has(int key) const override { return bodies_.count(key) > 0; }
  void capture(int key, const std::function<void()>& body) override { bodies_[key] = body; }
  void replay(int key) override { bodies_.at(key)(); }
  void clear() override { bodies_.clear(); }
  int size() const override { return int(bodies_.size()); }

 private:
  std::map<int, std::function<void()>> bodies_;
};

// (top1 - top2) / max|x| of one logits row: how close its greedy pick is to a tie.
inline double top2_margin(const float* x, int V) {
  float a = -INFINITY, b = -INFINITY, m = 0;
  for (int i = 0; i < V; ++i) {
    m = std::max(m, std::fabs(x[i]));
    if (x[i] > a) {
      b = a;
      a = x[i];
    } else if (x[i] > b) {
      b = x[i];
    }
  }
  return (a - b) / std::max(m, 1e-30f);
}

// Steps: each is a list of (sequence, prefill?) — a prefill step feeds the sequence's prompt.
inline ScenarioTrace run_scenario(ModelExecutor& ex, const ScenarioTrace* forced = nullptr) {
  const ExecutorInfo info = ex.info();
  const int bs = info.block_size, per_seq = 12;  // blocks per sequence (48 tokens at block 4)
  constexpr int kSeqs = 10;
  struct Seq {
    std::vector<int32_t> tokens;  // prompt + generated so far
    int in_cache = 0;
    std::vector<int32_t> blocks;
  };
  std::vector<Seq> seqs(kSeqs);
  for (int i = 0; i < kSeqs; ++i) {
    const int plen = 2 + (i * 5) % 9;
    for (int t = 0; t < plen; ++t) seqs[i].tokens.push_back(int32_t((i * 131 + t * 17 + 3) % info.vocab_size));
    // Blocks scattered over the pool (a permutation: 37 is coprime with the pool size used by
    // the tests); sequence 0 owns block 0, the slot a stray padded write would hit.
    for (int b = 0; b < per_seq; ++b)
      seqs[i].blocks.push_back(int32_t((int64_t(b * kSeqs + i) * 37) % info.num_kv_blocks));
  }
  // The plan: P = prefill (whole prompt), D = decode one token.
  struct Item {
    int seq;
    bool prefill;
  };
  std::vector<std::vector<Item>> plan;
  auto decode = [&](std::vector<int> ids) {
    std::vector<Item> st;
    for (int i : ids) st.push_back({i, false});
    plan.push_back(st);
  };
  plan.push_back({{0, true}});
  decode({0});
  decode({0});
  plan.push_back({{1, true}, {2, true}});
  decode({0, 1, 2});  // 3 -> bucket 4
  decode({2, 0, 1});
  plan.push_back({{3, true}, {4, true}, {5, true}, {6, true}, {7, true}, {8, true}, {0, false}});  // mixed
  decode({0, 1, 2, 3, 4, 5, 6, 7, 8});  // 9 -> 16
  decode({0, 2, 3, 5, 6, 7, 8});        // 1 and 4 pause: 7 -> 8
  decode({0, 2, 3});                    // 3 -> 4 again, other sequences
  decode({5, 6, 7, 8});                 // 4 -> 4
  plan.push_back({{9, true}, {1, false}, {4, false}});
  decode({1, 4, 9});
  decode({9});
  for (int r = 0; r < 3; ++r) decode({0, 1, 2, 3, 4, 5, 6, 7, 8, 9});  // 10 -> 16
  decode({8, 9});

  ScenarioTrace tr;
  tr.vocab = info.vocab_size;
  for (size_t k = 0; k < plan.size(); ++k) {
    StepBatch batch;
    for (const Item& it : plan[k]) {
      Seq& s = seqs[it.seq];
      SequenceStep st;
      st.seq_id = it.seq;
      st.start_pos = s.in_cache;
      st.tokens.assign(s.tokens.begin() + s.in_cache, s.tokens.end());
      if (!it.prefill) st.tokens = {s.tokens.back()};
      const int ctx = st.start_pos + int(st.tokens.size());
      st.block_table.assign(s.blocks.begin(), s.blocks.begin() + (ctx + bs - 1) / bs);
      batch.seqs.push_back(st);
    }
    StepResult r = ex.execute(batch);
    std::vector<int32_t> next;
    std::vector<int64_t> ids;
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      const int si = int(batch.seqs[i].seq_id);
      const int32_t tok = forced ? forced->next[k][i] : argmax_lowest(r.logits.data() + i * r.vocab_size, r.vocab_size);
      seqs[si].in_cache += int(batch.seqs[i].tokens.size());
      seqs[si].tokens.push_back(tok);
      next.push_back(tok);
      ids.push_back(si);
    }
    tr.logits.push_back(std::move(r.logits));
    tr.next.push_back(next);
    tr.seq_ids.push_back(ids);
  }
  return tr;
}

// Per step: max |a - b| / max |a| over the step's rows.
inline std::vector<double> step_errors(const ScenarioTrace& a, const ScenarioTrace& b) {
  std::vector<double> e;
  for (size_t k = 0; k < a.logits.size(); ++k) {
    double num = 0, den = 1e-30;
    for (size_t i = 0; i < a.logits[k].size() && i < b.logits[k].size(); ++i) {
      num = std::max(num, double(std::fabs(a.logits[k][i] - b.logits[k][i])));
      den = std::max(den, double(std::fabs(a.logits[k][i])));
    }
    if (a.logits[k].size() != b.logits[k].size()) num = INFINITY;
    e.push_back(num / den);
  }
  return e;
}

}  // namespace moeserve::test
