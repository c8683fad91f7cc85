// Structured-output masks in the CUDA sampling kernel (label gpu; skips without a device).
// The kernel with a row's allowed-token bitset must sample exactly as the same kernel on the
// row with its disallowed logits written as -inf on the host (the host sampler's masked row):
// greedy, seeded temperature / top-k / top-p, masked and unmasked rows in one batch, an
// all-but-one mask, F32 and BF16 logits at a 200,064 vocabulary; greedy equals the host's
// argmax of the masked row. The kernel captured in a CUDA graph with fixed-address parameter
// and mask buffers gives the eager result on replays with new masks written into the buffer.
// Through the engine (tiny model on the CUDA executor, grammar over a synthetic vocabulary),
// constrained rows sampled on the device give the host-sampling engine's greedy tokens.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <filesystem>
#include <limits>
#include <map>
#include <mutex>
#include <random>

#include "backend/cuda/common/kernels.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/structured_sampling.h"
#include "runtime/device_sampler.h"
#include "runtime/model_executor.h"
#include "structured/constraint.h"
#include "structured/regex.h"
#include "test_util.h"
#include "tools/tiny.h"

namespace moeserve {
namespace {

using test::gpu;
using test::to_device;

uint64_t splitmix64_for_test(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

struct Batch {
  int V = 0, R = 0;
  std::vector<float> logits;             // [R, V]
  std::vector<std::vector<uint32_t>> masks;  // per row; empty: unmasked
  std::vector<GpuSamplingParams> params;
};

// Rows: greedy / T=0.8 / top-k 20 / top-p 0.9 / top-k 50 + top-p 0.8 / T=1.5, each with a
// random ~2% mask, plus an unmasked twin of each, an all-but-one mask and a 1-bit-per-word mask.
Batch make_batch(int V, uint64_t seed, bool bf16) {
  std::mt19937 rng{uint32_t(seed)};
  std::normal_distribution<float> nd(0.f, 3.f);
  Batch b;
  b.V = V;
  const GpuSamplingParams kinds[] = {{0.f, 0, 1.f, 0}, {0.8f, 0, 1.f, 0}, {1.f, 20, 1.f, 0},
                                     {1.f, 0, 0.9f, 0}, {0.7f, 50, 0.8f, 0}, {1.5f, 0, 1.f, 0}};
  const int W = (V + 31) / 32;
  auto add = [&](GpuSamplingParams p, std::vector<uint32_t> m) {
    p.seed = splitmix64_for_test(seed * 131 + uint64_t(b.R));
    b.params.push_back(p);
    b.masks.push_back(std::move(m));
    ++b.R;
  };
  for (const auto& k : kinds) {
    std::vector<uint32_t> m(size_t(W), 0);
    for (int t = 0; t < V; ++t)
      if (rng() % 50 == 0) m[size_t(t) / 32] |= 1u << (t % 32);
    add(k, m);
    add(k, {});
  }
  std::vector<uint32_t> one(size_t(W), 0);
  const int only = int(rng() % uint32_t(V));
  one[size_t(only) / 32] = 1u << (only % 32);
  add(kinds[1], one);  // all but one token masked: always that token
  std::vector<uint32_t> sparse(size_t(W), 0);
  for (int w = 0; w < W; ++w) sparse[size_t(w)] = 1u << (w % 32);
  add(kinds[3], sparse);
  b.logits.resize(size_t(b.R) * size_t(V));
  for (auto& x : b.logits) x = nd(rng);
  if (bf16)
    for (auto& x : b.logits) x = bf16_to_f32(f32_to_bf16(x));
  return b;
}

bool allowed(const std::vector<uint32_t>& m, int t) { return m.empty() || ((m[size_t(t) / 32] >> (t % 32)) & 1u); }

std::vector<int32_t> ids_of(const Tensor& out) {
  std::vector<int32_t> r;
  for (float f : gpu().download_f32(out)) r.push_back(int32_t(f));
  return r;
}

// The kernel with masks (packed as the executor packs them).
std::vector<int32_t> sample_masked(const Batch& b, DType dt) {
  std::vector<DeviceSampling> rows(size_t(b.R));
  for (int r = 0; r < b.R; ++r)
    if (!b.masks[size_t(r)].empty()) rows[size_t(r)].mask = b.masks[size_t(r)].data(), rows[size_t(r)].mask_words = b.masks[size_t(r)].size();
  PackedDeviceMasks packed;
  pack_device_masks(rows, b.V, packed);
  std::vector<GpuSamplingParams> p = b.params;
  for (int r = 0; r < b.R; ++r) p[size_t(r)].mask_row = packed.mask_row[size_t(r)];
  Tensor dl = to_device(b.logits, dt, {b.R, b.V});
  Tensor out = gpu().alloc(DType::I32, {b.R});
  gpu().sample(dl, p, out, DeviceMasks{packed.words.data(), packed.num_rows, packed.words_per_row});
  return ids_of(out);
}

// The kernel without masks on the host-masked logits.
std::vector<int32_t> sample_premasked(const Batch& b, DType dt) {
  std::vector<float> l = b.logits;
  for (int r = 0; r < b.R; ++r)
    for (int t = 0; t < b.V; ++t)
      if (!allowed(b.masks[size_t(r)], t)) l[size_t(r) * size_t(b.V) + size_t(t)] = -std::numeric_limits<float>::infinity();
  Tensor dl = to_device(l, dt, {b.R, b.V});
  Tensor out = gpu().alloc(DType::I32, {b.R});
  gpu().sample(dl, b.params, out);
  return ids_of(out);
}

class CudaDeviceMasks : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(CudaDeviceMasks, KernelMaskEqualsHostMaskedRow) {
  SKIP_WITHOUT_GPU();
  const auto [V, bf16] = GetParam();
  const DType dt = bf16 ? DType::BF16 : DType::F32;
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const Batch b = make_batch(V, seed, bf16);
    const std::vector<int32_t> got = sample_masked(b, dt), want = sample_premasked(b, dt);
    EXPECT_EQ(got, want) << "seed " << seed;
    for (int r = 0; r < b.R; ++r) {
      const auto& m = b.masks[size_t(r)];
      ASSERT_GE(got[size_t(r)], 0) << r;
      EXPECT_TRUE(allowed(m, got[size_t(r)])) << "row " << r << " sampled a masked token";
      std::vector<float> row(b.logits.begin() + ptrdiff_t(r) * V, b.logits.begin() + ptrdiff_t(r + 1) * V);
      for (int t = 0; t < V; ++t)
        if (!allowed(m, t)) row[size_t(t)] = -std::numeric_limits<float>::infinity();
      if (b.params[size_t(r)].temperature <= 0.f) {
        EXPECT_EQ(got[size_t(r)], argmax_lowest(row)) << r;
      }
      if (const int k = b.params[size_t(r)].top_k; k > 0) {  // within the k largest allowed logits
        std::vector<float> s = row;
        std::nth_element(s.begin(), s.begin() + (k - 1), s.end(), std::greater<float>());
        EXPECT_GE(row[size_t(got[size_t(r)])], s[size_t(k - 1)]) << r;
      }
      int n_allowed = 0, last = -1;
      for (int t = 0; t < V; ++t)
        if (!m.empty() && allowed(m, t)) ++n_allowed, last = t;
      if (n_allowed == 1) {
        EXPECT_EQ(got[size_t(r)], last);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Vocab, CudaDeviceMasks,
                         ::testing::Values(std::tuple{200064, false}, std::tuple{200064, true},
                                           std::tuple{151669, false}, std::tuple{4099, true}));

// A row whose mask allows nothing gives kDeviceNoCandidate (the engine reports the grammar's
// reason), the other rows are unaffected.
TEST(CudaDeviceMasksEdge, EmptyMaskRowHasNoCandidate) {
  SKIP_WITHOUT_GPU();
  Batch b = make_batch(4099, 9, false);
  std::fill(b.masks[0].begin(), b.masks[0].end(), 0u);
  const std::vector<int32_t> got = sample_masked(b, DType::F32);
  EXPECT_EQ(got[0], kDeviceNoCandidate);
  const std::vector<int32_t> want = sample_premasked(b, DType::F32);
  EXPECT_EQ(got, want);
}

// launch_sample captured in a graph reads its parameters and masks from fixed addresses: replays
// after writing new masks (and seeds) there equal eager sampling with those masks.
TEST(CudaDeviceMasksEdge, ReplaysInACapturedGraphWithNewMasks) {
  SKIP_WITHOUT_GPU();
  const int V = 200064, W = (V + 31) / 32;
  Batch b0 = make_batch(V, 21, true);
  const int R = b0.R;
  Tensor dl = to_device(b0.logits, DType::BF16, {R, V});
  Tensor params = gpu().alloc(DType::I32, {int64_t(R) * int64_t(sizeof(cuda::SampleRowParams) / 4)});
  Tensor masks = gpu().alloc(DType::I32, {int64_t(R) * W});
  Tensor scratch = gpu().alloc(DType::I32, {int64_t(cuda::sample_scratch_bytes(R, V) / 4 + 1)});
  Tensor out = gpu().alloc(DType::I32, {R});
  gpu().synchronize();
  cuda::SampleLaunch l;
  l.logits = dl.data, l.logits_bf16 = true, l.rows = R, l.vocab = V;
  l.params = static_cast<const cuda::SampleRowParams*>(params.data), l.out_ids = out.ptr<int32_t>();
  l.scratch = scratch.data;
  l.masks = static_cast<const uint32_t*>(masks.data), l.mask_words = W;
  gpu().begin_capture();
  cuda::launch_sample(l, gpu().stream());
  CudaGraph graph = gpu().end_capture();
  for (uint64_t rep = 0; rep < 3; ++rep) {
    Batch b = make_batch(V, 100 + rep, true);
    b.logits = b0.logits;  // the captured logits buffer
    std::vector<cuda::SampleRowParams> hp(static_cast<size_t>(R));
    std::vector<uint32_t> hm(size_t(R) * size_t(W), 0);
    for (int r = 0; r < R; ++r) {
      const auto& p = b.params[size_t(r)];
      const bool m = !b.masks[size_t(r)].empty();
      hp[size_t(r)] = {p.temperature, p.top_k, p.top_p, p.seed, m ? r : -1};
      if (m) std::copy(b.masks[size_t(r)].begin(), b.masks[size_t(r)].end(), hm.begin() + ptrdiff_t(r) * W);
    }
    gpu().copy_from_host(params, hp.data(), hp.size() * sizeof(hp[0]));
    gpu().copy_from_host(masks, hm.data(), hm.size() * 4);
    graph.replay(gpu().stream());
    gpu().synchronize();
    EXPECT_EQ(ids_of(out), sample_masked(b, DType::BF16)) << "replay " << rep;
  }
}

// Through the engine: grammar-constrained requests (with an unconstrained one in the batch)
// sampled on the device equal the host-sampling engine (greedy), and seeded ones follow the
// grammar. Vocabulary: the tiny model's 4096 ids as short letter strings, id 2 the EOS.
std::shared_ptr<structured::TokenVocab> letters_vocab(int V) {
  auto v = std::make_shared<structured::TokenVocab>();
  const char* pieces[] = {"a", "b", "c", "d", "x", "ab", "cd", "xx", "ba", "dc", "y", "z", "abc", "-", "--", "q"};
  for (int i = 0; i < V; ++i) v->token_bytes.push_back(i < 3 ? "<s" + std::to_string(i) + ">" : pieces[i % 16] + std::string(size_t(i / 16 % 3), 'a'));
  v->special.assign(size_t(V), false);
  v->special[0] = v->special[1] = v->special[2] = true;
  v->stop_ids = {2};
  v->mask_size = V;
  v->build();
  return v;
}

std::string tiny_dir(int vocab) {
  const auto d = std::filesystem::temp_directory_path() / ("moeserve_devmask_tiny_" + std::to_string(vocab));
  if (!std::filesystem::exists(d / "config.json")) {
    TinyModelOptions o;
    o.seed = 13;
    o.vocab_size = vocab;
    o.with_tokenizer = false;
    o.bos_token_id = 1, o.eos_token_id = 2;
    write_tiny_checkpoint(d.string(), o);
  }
  return d.string();
}

TEST(CudaDeviceMasksEngine, ConstrainedRowsOnTheDeviceEqualHostSampling) {
  SKIP_WITHOUT_GPU();
  const int V = 4096, N = 8;
  auto con = std::make_shared<structured::StructuredConstraint>();
  con->grammar = std::make_shared<structured::CompiledGrammar>(structured::grammar_from_regex("(ab|cd)+-x{2,3}"),
                                                               letters_vocab(V));
  auto run = [&](bool device, bool greedy) {
    EngineConfig cfg{.max_num_seqs = N};
    cfg.device_sampling = device;
    cfg.eos_token_ids = {2};
    ExecutorOptions eo;
    eo.model_dir = tiny_dir(V);
    eo.block_size = 16;
    eo.max_model_len = 128;
    eo.num_kv_blocks = N * 8;
    auto be = make_cuda_backend(0);
    eo.device_sampler = backend_device_sampler(*be);
    auto engine = make_engine(cfg, std::make_unique<RankExecutor>(std::move(be), eo));
    std::mutex mu;
    std::map<int, std::vector<int32_t>> out;
    for (int i = 0; i < N; ++i) {
      Request r;
      r.id = "r" + std::to_string(i);
      for (int k = 0; k < 5 + i; ++k) r.prompt_ids.push_back(int32_t((k * 977 + i * 131 + 3) % V));
      r.params.temperature = greedy ? 0.f : 0.9f;
      r.params.top_k = i % 2 ? 8 : 0;
      r.params.seed = 40 + i;
      r.params.max_tokens = 40;
      if (i != N - 1) r.params.structured = con;
      r.on_output = [&, i](RequestOutput&& o) {
        std::lock_guard lk(mu);
        out[i].insert(out[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
        EXPECT_NE(o.finish_reason, FinishReason::Error) << o.error;
      };
      EXPECT_TRUE(engine->submit(std::move(r)));
    }
    engine->shutdown(std::chrono::seconds(60));
    return out;
  };
  const auto dev = run(true, true), host = run(false, true);
  EXPECT_EQ(dev, host);
  const auto seeded = run(true, false);
  auto v = letters_vocab(V);
  for (int i = 0; i < N - 1; ++i) {
    std::string text;
    for (int32_t t : seeded.at(i))
      if (t != 2) text += v->token_bytes[size_t(t)];
    EXPECT_GE(con->grammar->step_bytes(con->grammar->initial_state(), text), 0) << i << ": " << text;
  }
}

}  // namespace
}  // namespace moeserve
