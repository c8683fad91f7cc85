// Decode graphs of large batches (label gpu; skipped without a device): buckets of >= 128 rows
// capture the FP8-activation paths (per-token FP8 quantisation, FP8 grouped expert GEMM over
// the device-built tile table, cuBLASLt block-scaled linears, router f32 GEMM) that eager
// steps of that size use. Model: a tiny FP8 checkpoint written here with hidden 512 (so the
// linears meet cuBLASLt's K / 128 % 4 == 0), 16 experts, top-4. 256 sequences decode in
// batches of 256, 200, 130, 190, 128, 100, 64, 7, 256, 129 (buckets 256, 192, 128, 64, 8):
//  - graphs vs the same padded steps run eagerly: same kernels, bound 1e-3 (observed printed);
//  - the captures recorded FP8-path launches and no fallback, and no workspace grew after the
//    first capture (graphs_captured == 5 distinct buckets, replays = steps - 5);
//  - graphs with prefill_paths_in_graphs off (the old bf16 kernels in graphs) differ from
//    padded eager at buckets >= 128 by the FP8 activation rounding (printed, not asserted);
//  - graphs vs unpadded eager: greedy ids equal where the eager top-2 margin exceeds 0.1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <set>

#include "../model/executor_scenario.h"
#include "backend/cuda/cuda_backend.h"
#include "runtime/model_executor.h"
#include "tools/tiny.h"

namespace moeserve::test {
namespace {

namespace fs = std::filesystem;

constexpr int kSeqs = 256, kPrompt = 3;

const std::vector<int>& decode_sizes() {
  static const std::vector<int> v{256, 200, 130, 190, 128, 100, 64, 7, 256, 129};
  return v;
}

std::string big_fixture() {
  static const std::string dir = [] {
    const fs::path d = fs::temp_directory_path() / ("moeserve_graphs_big_" + std::to_string(::getpid()));
    TinyModelOptions o;
    o.seed = 11;
    o.hidden_size = 512;
    o.num_layers = 2;
    o.num_heads = 8;
    o.num_kv_heads = 2;
    o.head_dim = 64;
    o.rotary_dim = 32;
    o.intermediate_size = 256;
    o.num_experts = 16;
    o.top_k = 4;
    o.vocab_size = 4096;
    o.fp8 = true;
    o.block_size = 128;
    o.with_tokenizer = false;
    write_tiny_checkpoint(d.string(), o);
    return d.string();
  }();
  return dir;
}

// Step k < prefill steps: 64 sequences' prompts; then the decode batches (the first S
// sequences, rotated by the step so different sequences pad). Tokens forced from `forced`.
ScenarioTrace run_big(ModelExecutor& ex, const ScenarioTrace* forced) {
  const int bs = ex.info().block_size, V = ex.info().vocab_size;
  std::vector<std::vector<int32_t>> toks(kSeqs);
  std::vector<int> in_cache(kSeqs, 0);
  for (int i = 0; i < kSeqs; ++i)
    for (int t = 0; t < kPrompt; ++t) toks[i].push_back(int32_t((i * 131 + t * 17 + 3) % V));
  std::vector<std::vector<int>> plan;
  for (int c = 0; c < kSeqs; c += 64) {
    std::vector<int> ids;
    for (int i = c; i < c + 64; ++i) ids.push_back(i);
    plan.push_back(ids);
  }
  const size_t prefill_steps = plan.size();
  for (size_t k = 0; k < decode_sizes().size(); ++k) {
    std::vector<int> ids;
    for (int j = 0; j < decode_sizes()[k]; ++j) ids.push_back(int((j + 37 * k) % kSeqs));
    plan.push_back(ids);
  }
  ScenarioTrace tr;
  tr.vocab = V;
  for (size_t k = 0; k < plan.size(); ++k) {
    StepBatch batch;
    for (int i : plan[k]) {
      SequenceStep st;
      st.seq_id = i;
      st.start_pos = in_cache[i];
      if (k < prefill_steps)
        st.tokens.assign(toks[i].begin(), toks[i].end());
      else
        st.tokens = {toks[i].back()};
      const int ctx = st.start_pos + int(st.tokens.size());
      // Two blocks per sequence, spread over the pool (block 2i and 2i+1 of a 512+ pool).
      for (int b = 0; b < (ctx + bs - 1) / bs; ++b) st.block_table.push_back(int32_t(2 * i + b));
      batch.seqs.push_back(st);
    }
    StepResult r = ex.execute(batch);
    std::vector<int32_t> next;
    for (size_t j = 0; j < batch.seqs.size(); ++j) {
      const int i = int(batch.seqs[j].seq_id);
      const int32_t tok = forced ? forced->next[k][j] : argmax_lowest(r.logits.data() + j * V, V);
      in_cache[i] += int(batch.seqs[j].tokens.size());
      toks[i].push_back(tok);
      next.push_back(tok);
    }
    tr.logits.push_back(std::move(r.logits));
    tr.next.push_back(next);
  }
  return tr;
}

ExecutorOptions big_opts() {
  ExecutorOptions eo;
  eo.model_dir = big_fixture();
  eo.block_size = 16;
  eo.num_kv_blocks = 2 * kSeqs + 8;
  eo.max_num_seqs = 256;
  eo.max_num_batched_tokens = 256;
  return eo;
}

TEST(CudaDecodeGraphsBig, Fp8PathsInsideGraphsMatchPaddedEager) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  ExecutorOptions eo = big_opts();
  const size_t pre = kSeqs / 64, steps = pre + decode_sizes().size();
  ScenarioTrace ref, padded, graphed, old_graphs;
  {
    eo.enforce_eager = true;
    RankExecutor ex(make_cuda_backend(0), eo);
    ref = run_big(ex, nullptr);
  }
  {
    eo.pad_decode = true;
    RankExecutor ex(make_cuda_backend(0), eo);
    padded = run_big(ex, &ref);
  }
  eo.enforce_eager = false;
  eo.pad_decode = false;
  {
    auto be = make_cuda_backend(0);
    CudaBackend* cb = be.get();
    RankExecutor ex(std::move(be), eo);
    graphed = run_big(ex, &ref);
    EXPECT_EQ(ex.graphs_captured(), 5) << "a workspace grew after a capture (graphs were dropped)";
    EXPECT_EQ(ex.graph_replays(), int(decode_sizes().size()) - 5);
    EXPECT_GT(cb->graph_fp8_ops(), 0u) << "no FP8-activation launch was captured";
    EXPECT_EQ(cb->graph_fallbacks(), 0u);
    std::printf("[graphs-big] FP8-path launches captured: %llu\n", (unsigned long long)cb->graph_fp8_ops());
  }
  {
    auto be = make_cuda_backend(0);
    be->tuning.prefill_paths_in_graphs = false;
    CudaBackend* cb = be.get();
    RankExecutor ex(std::move(be), eo);
    old_graphs = run_big(ex, &ref);
    EXPECT_EQ(cb->graph_fp8_ops(), 0u);
  }
  ASSERT_EQ(graphed.logits.size(), steps);
  const auto e_pad = step_errors(padded, graphed), e_old = step_errors(padded, old_graphs),
             e_eager = step_errors(ref, graphed);
  const int V = ref.vocab;
  for (size_t k = pre; k < steps; ++k) {
    const int S = decode_sizes()[k - pre];
    EXPECT_LE(e_pad[k], 1e-3) << "decode batch " << S << ": graph replay vs the same padded step run eagerly";
    int checked = 0, equal = 0;
    for (size_t i = 0; i < ref.next[k].size(); ++i) {
      const float* r = ref.logits[k].data() + i * V;
      if (top2_margin(r, V) < 0.1) continue;
      ++checked;
      equal += argmax_lowest(graphed.logits[k].data() + i * V, V) == ref.next[k][i];
    }
    EXPECT_EQ(equal, checked) << "decode batch " << S << ": greedy ids, graphs vs eager";
    std::printf("[graphs-big] batch %3d: graphs vs padded eager %.3g (old graph kernels %.3g), vs eager %.3g, "
                "ids %d/%d\n",
                S, e_pad[k], e_old[k], e_eager[k], equal, checked);
  }
  std::error_code ec;
  fs::remove_all(big_fixture(), ec);
}

}  // namespace
}  // namespace moeserve::test
