// Padded decode steps and graph replay (model_executor.cpp, decode_plan.cpp) on the CPU:
// bucket planning, the padded metadata, and executors that pad decode steps (with and without
// a recording "graph" runner that replays the captured step closure, as a CUDA graph replays
// its kernels on the same fixed buffers) against the plain eager executor.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <map>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "executor_scenario.h"
#include "runtime/decode_plan.h"
#include "runtime/model_executor.h"
#include "golden_fixture.h"

using namespace moeserve;
namespace fs = std::filesystem;

namespace {

TEST(DecodePlan, BucketsFollowCaptureSizes) {
  EXPECT_EQ(graph_buckets(256), (std::vector<int>{1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256}));
  EXPECT_EQ(graph_buckets(1), (std::vector<int>{1}));
  EXPECT_EQ(graph_buckets(5), (std::vector<int>{1, 2, 4, 5}));
  EXPECT_EQ(graph_buckets(100), (std::vector<int>{1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 100}));
  EXPECT_TRUE(graph_buckets(0).empty());
  const auto b = graph_buckets(64);
  EXPECT_EQ(pick_bucket(b, 1), 1);
  EXPECT_EQ(pick_bucket(b, 3), 4);
  EXPECT_EQ(pick_bucket(b, 9), 16);
  EXPECT_EQ(pick_bucket(b, 33), 48);
  EXPECT_EQ(pick_bucket(b, 64), 64);
  EXPECT_EQ(pick_bucket(b, 65), 0);
  EXPECT_EQ(pick_bucket(b, 0), 0);
}

TEST(DecodePlan, PureDecodeDetection) {
  StepBatch b;
  EXPECT_FALSE(is_pure_decode(b));
  b.seqs.push_back({1, {5}, 3, {0}, true});
  b.seqs.push_back({2, {6}, 0, {1}, true});
  EXPECT_TRUE(is_pure_decode(b));
  b.seqs.push_back({3, {7, 8}, 0, {2}, true});
  EXPECT_FALSE(is_pure_decode(b));
}

TEST(DecodePlan, PaddedLayoutAndRows) {
  const int B = 4, stride = 8, bs = 4;
  const DecodeLayout L = DecodeLayout::make(B, stride);
  EXPECT_EQ(L.total, 4 * B + (B + 1) + B + B * stride);
  DecodePadding pad{bs, /*num_kv_blocks=*/20, /*dummy_block=*/20, /*vocab=*/100, /*max_model_len=*/32};
  StepBatch b;
  b.seqs.push_back({7, {42}, 5, {9, 3, 11}, true});  // position 5: block 1 (=3), offset 1; ctx 6
  b.seqs.push_back({8, {0}, 0, {4}, true});          // first token
  std::vector<int32_t> h(size_t(L.total), -77);
  EXPECT_EQ(plan_padded_decode(b, L, pad, h.data()), 2) << "widest used table prefix: ctx 6 / block 4";
  EXPECT_EQ(h[L.ids + 0], 42);
  EXPECT_EQ(h[L.ids + 1], 0);
  EXPECT_EQ(h[L.positions + 0], 5);
  EXPECT_EQ(h[L.slots + 0], 3 * bs + 1);
  EXPECT_EQ(h[L.slots + 1], 4 * bs + 0);
  EXPECT_EQ(h[L.context_lens + 0], 6);
  EXPECT_EQ(h[L.context_lens + 1], 1);
  EXPECT_EQ(h[L.tables + 0], 9);
  EXPECT_EQ(h[L.tables + 1], 3);
  EXPECT_EQ(h[L.tables + stride], 4);
  for (int r = 0; r <= B; ++r) EXPECT_EQ(h[L.query_start + r], r);
  for (int r = 0; r < B; ++r) EXPECT_EQ(h[L.rows + r], r);
  for (int r = 2; r < B; ++r) {  // padding rows
    EXPECT_EQ(h[L.ids + r], 0);
    EXPECT_EQ(h[L.positions + r], 0);
    EXPECT_EQ(h[L.slots + r], -1) << "a padded row must not write the KV cache";
    EXPECT_EQ(h[L.context_lens + r], 1);
    EXPECT_EQ(h[L.tables + r * stride], 20) << "padded rows read the dummy block";
  }
}

TEST(DecodePlan, RejectsBadSteps) {
  const DecodeLayout L = DecodeLayout::make(2, 4);
  DecodePadding pad{4, 10, 10, 100, 16};
  std::vector<int32_t> h(size_t(L.total));
  auto one = [](SequenceStep s) {
    StepBatch b;
    b.seqs.push_back(std::move(s));
    return b;
  };
  EXPECT_THROW(plan_padded_decode(one({1, {5}, 4, {0}, true}), L, pad, h.data()), Error);        // table too short
  EXPECT_THROW(plan_padded_decode(one({1, {5}, 0, {10}, true}), L, pad, h.data()), Error);       // dummy block
  EXPECT_THROW(plan_padded_decode(one({1, {100}, 0, {1}, true}), L, pad, h.data()), Error);      // token id
  EXPECT_THROW(plan_padded_decode(one({1, {5}, 16, {0, 1, 2, 3, 4}, true}), L, pad, h.data()), Error);  // length
  StepBatch three;
  for (int i = 0; i < 3; ++i) three.seqs.push_back({i, {1}, 0, {i}, true});
  EXPECT_THROW(plan_padded_decode(three, L, pad, h.data()), Error);
}

ExecutorOptions opts() { return test::scenario_options(test::golden_fixture("tiny_fp8_partial").string()); }

TEST(DecodeGraphsCpu, PaddedAndReplayedStepsMatchEager) {
  ExecutorOptions eo = opts();
  auto eager = make_cpu_executor(eo);
  EXPECT_TRUE(eager->graph_buckets().empty());
  const test::ScenarioTrace ref = test::run_scenario(*eager);

  eo.pad_decode = true;
  auto padded = make_cpu_executor(eo);
  ASSERT_EQ(padded->graph_buckets(), (std::vector<int>{1, 2, 4, 8, 16}));
  EXPECT_EQ(padded->info().num_kv_blocks, 128);  // the dummy block is not the engine's
  const test::ScenarioTrace pt = test::run_scenario(*padded, &ref);

  eo.graph_runner_factory = [](Backend&) { return std::make_unique<test::RecordingRunner>(); };
  auto graphed = make_cpu_executor(eo);
  const test::ScenarioTrace gt = test::run_scenario(*graphed, &ref);
  // Decode batches 1,1,3,3,9,7,3,4,3,1,10,10,10,2: buckets 1, 2, 4, 8, 16 captured on first
  // use (after an eager warm-up), every later decode step of a bucket replayed.
  EXPECT_EQ(graphed->graphs_captured(), 5);
  EXPECT_EQ(graphed->graph_replays(), 9);

  const auto ep = test::step_errors(ref, pt), eg = test::step_errors(ref, gt);
  for (size_t k = 0; k < ep.size(); ++k) {
    EXPECT_LE(ep[k], 1e-5) << "padded step " << k;
    EXPECT_LE(eg[k], 1e-5) << "replayed step " << k;
    for (size_t i = 0; i < ref.next[k].size(); ++i) {
      const int V = ref.vocab;
      EXPECT_EQ(argmax_lowest(pt.logits[k].data() + i * V, V), ref.next[k][i]) << "step " << k << " row " << i;
      EXPECT_EQ(argmax_lowest(gt.logits[k].data() + i * V, V), ref.next[k][i]) << "step " << k << " row " << i;
    }
  }
}

}  // namespace

// The executor uploads only the used columns of the block table: a strided copy that leaves
// the other columns of the device rows as they were.
TEST(DecodePlan, StridedTableUploadLeavesOtherColumns) {
  auto be = make_cpu_backend();
  const int rows = 3, stride = 6, used = 2;
  Tensor dst = be->alloc(DType::I32, {rows, stride});
  std::vector<int32_t> before(size_t(rows * stride)), src(size_t(rows * stride));
  for (int i = 0; i < rows * stride; ++i) before[size_t(i)] = -i - 1, src[size_t(i)] = 100 + i;
  be->copy_from_host(dst, before.data(), before.size() * 4);
  be->copy_from_host_2d(dst, stride * 4, src.data(), stride * 4, used * 4, rows);
  const std::vector<float> got = be->download_f32(dst);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < stride; ++c)
      EXPECT_EQ(got[size_t(r * stride + c)], c < used ? 100 + r * stride + c : -(r * stride + c) - 1) << r << "," << c;
  // A copy that would run past the tensor, or rows wider than the pitch, is refused.
  EXPECT_THROW(be->copy_from_host_2d(dst, stride * 4, src.data(), stride * 4, used * 4, rows + 1), Error);
  EXPECT_THROW(be->copy_from_host_2d(dst, 4, src.data(), stride * 4, 8, 1), Error);
}
