// Device sampling in RankExecutor on CudaBackend (label gpu; skips without a device).
// A tiny checkpoint (tools/tiny.h) runs with the CUDA device sampler. Each logical sequence is
// run as twins in one batch (same tokens, own KV blocks): one twin's row comes back as logits
// (host), the other is sampled on the GPU, so both see the very same logits and greedy must
// agree exactly with the host sampler's argmax (lowest id on ties). Plus: seeded sampling is
// reproducible and independent of the row's batch position, top-k 1 is greedy, and the
// kernel's distribution at a 200,064 vocabulary matches the target probabilities.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <mutex>
#include <limits>
#include <random>
#include <set>

#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "runtime/device_sampler.h"
#include "runtime/model_executor.h"
#include "tools/tiny.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

#define SKIP_WITHOUT_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

uint64_t splitmix_for_test(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr int kBlock = 16, kBlocksPerSeq = 4;

std::string tiny_dir(int vocab) {
  const fs::path d = fs::temp_directory_path() / ("moeserve_devsample_tiny_" + std::to_string(vocab));
  if (!fs::exists(d / "config.json")) {
    TinyModelOptions o;
    o.seed = 11;
    o.vocab_size = vocab;
    o.with_tokenizer = false;
    o.bos_token_id = 1, o.eos_token_id = 2;
    write_tiny_checkpoint(d.string(), o);
  }
  return d.string();
}

std::unique_ptr<RankExecutor> make_exec(int vocab, bool device_sampler, int max_seqs) {
  ExecutorOptions eo;
  eo.model_dir = tiny_dir(vocab);
  eo.block_size = kBlock;
  eo.max_model_len = kBlock * kBlocksPerSeq;
  eo.num_kv_blocks = max_seqs * kBlocksPerSeq;
  auto be = make_cuda_backend(0);
  if (device_sampler) eo.device_sampler = backend_device_sampler(*be);
  return std::make_unique<RankExecutor>(std::move(be), eo);
}

// One sequence's host-side state: tokens so far and how many have K/V.
struct Seq {
  std::vector<int32_t> tokens;
  int computed = 0;
};

SequenceStep step_of(const Seq& s, int slot, std::optional<DeviceSampling> d) {
  SequenceStep st;
  st.seq_id = slot + 1;
  st.tokens.assign(s.tokens.begin() + s.computed, s.tokens.end());
  st.start_pos = s.computed;
  for (int b = 0; b < kBlocksPerSeq; ++b) st.block_table.push_back(slot * kBlocksPerSeq + (kBlocksPerSeq - 1 - b));
  st.device_sample = d;
  return st;
}

std::vector<int32_t> prompt_of(int n, int salt, int vocab) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = int32_t((uint64_t(i) * 2654435761u + uint64_t(salt) * 40503u + 7) % vocab);
  return p;
}

struct GreedyCase {
  int vocab;
  int num_seqs;
};
class CudaDeviceSamplingGreedy : public ::testing::TestWithParam<GreedyCase> {};

TEST_P(CudaDeviceSamplingGreedy, DeviceGreedyEqualsHostArgmaxOverSteps) {
  SKIP_WITHOUT_GPU();
  const auto [V, S] = GetParam();
  auto exec = make_exec(V, true, 2 * S);
  ASSERT_TRUE(exec->info().device_sampling);
  std::vector<Seq> seqs(S);
  for (int i = 0; i < S; ++i) seqs[i].tokens = prompt_of(3 + 5 * i % 17, i, V);
  int agree = 0;
  for (int step = 0; step < 8; ++step) {
    // Twin 2i: host row (logits); twin 2i+1: GPU greedy, or top-k 1 / tiny top-p with a
    // temperature on odd steps (both must also be the argmax). Interleaved so host rows are
    // not contiguous.
    StepBatch b;
    for (int i = 0; i < S; ++i) {
      DeviceSampling d;
      if (step % 2 == 1) d = DeviceSampling{1.0f, i % 2 ? 1 : 0, i % 2 ? 1.f : 1e-6f, 1000u + uint64_t(step * S + i)};
      b.seqs.push_back(step_of(seqs[i], 2 * i, std::nullopt));
      b.seqs.push_back(step_of(seqs[i], 2 * i + 1, d));
    }
    const StepResult r = exec->execute(b);
    ASSERT_EQ(r.logits.size(), size_t(S) * V);
    ASSERT_EQ(r.sampled_ids.size(), size_t(S));
    for (int i = 0; i < S; ++i) {
      std::span<const float> row(r.logits.data() + size_t(i) * V, V);
      const int32_t host = argmax_lowest(row);
      // Greedy (even steps) breaks exact ties by the lowest id, as the host does. Top-k 1 and a
      // tiny top-p (odd steps) keep only maximal tokens, but between exactly tied bf16 logits
      // (frequent at the top of a 4k-50k vocabulary: bf16 has 128 values per octave) either is
      // a correct draw, so there the check is that the sampled token's logit is the maximum.
      const bool ok = step % 2 == 0 ? r.sampled_ids[i] == host : row[r.sampled_ids[i]] == row[host];
      EXPECT_TRUE(ok) << "vocab " << V << " seq " << i << " step " << step << ": sampled " << r.sampled_ids[i]
                      << " (logit " << row[r.sampled_ids[i]] << ") vs host argmax " << host << " (" << row[host]
                      << ")";
      agree += ok;
      seqs[i].computed = int(seqs[i].tokens.size());
      seqs[i].tokens.push_back(host);
    }
  }
  EXPECT_EQ(agree, 8 * S);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaDeviceSamplingGreedy,
                         ::testing::Values(GreedyCase{4096, 1}, GreedyCase{4096, 3}, GreedyCase{4096, 8},
                                           GreedyCase{50000, 5}));

// All rows on the device (no logits come back), against the same model with host rows.
// S = 1 first: a fresh executor's first device step with one row (the ids buffer must be
// allocated for it: `serve` failed its first single-request step before this was tested).
class CudaDeviceSamplingAllDevice : public ::testing::TestWithParam<int> {};

TEST_P(CudaDeviceSamplingAllDevice, MatchesHostGreedyRun) {
  SKIP_WITHOUT_GPU();
  const int V = 4096, S = GetParam();
  auto dev = make_exec(V, true, S);
  auto host = make_exec(V, false, S);
  ASSERT_FALSE(host->info().device_sampling);
  std::vector<Seq> a(S), h(S);
  for (int i = 0; i < S; ++i) a[i].tokens = h[i].tokens = prompt_of(4 + 3 * i, 40 + i, V);
  for (int step = 0; step < 6; ++step) {
    StepBatch bd, bh;
    for (int i = 0; i < S; ++i) {
      bd.seqs.push_back(step_of(a[i], i, DeviceSampling{}));
      bh.seqs.push_back(step_of(h[i], i, std::nullopt));
    }
    const StepResult rd = dev->execute(bd), rh = host->execute(bh);
    ASSERT_TRUE(rd.logits.empty());
    ASSERT_EQ(rd.sampled_ids.size(), size_t(S));
    ASSERT_EQ(rh.logits.size(), size_t(S) * V);
    for (int i = 0; i < S; ++i) {
      const int32_t want = argmax_lowest(std::span<const float>(rh.logits.data() + size_t(i) * V, V));
      EXPECT_EQ(rd.sampled_ids[i], want) << "seq " << i << " step " << step;
      a[i].computed = h[i].computed = int(a[i].tokens.size());
      a[i].tokens.push_back(rd.sampled_ids[i]);
      h[i].tokens.push_back(want);
    }
  }
  // A host-only executor refuses device rows instead of returning garbage.
  StepBatch bad;
  bad.seqs.push_back(step_of(h[0], 0, DeviceSampling{}));
  EXPECT_THROW(host->execute(bad), Error);
}

INSTANTIATE_TEST_SUITE_P(Sizes, CudaDeviceSamplingAllDevice, ::testing::Values(1, 4));

TEST(CudaDeviceSampling, SeededSamplingIsReproducibleAndPositionIndependent) {
  SKIP_WITHOUT_GPU();
  const int V = 4096, S = 6;
  auto exec = make_exec(V, true, 2 * S);
  std::vector<Seq> seqs(S);
  for (int i = 0; i < S; ++i) seqs[i].tokens = prompt_of(5 + i, 70 + i, V);
  std::set<int32_t> seen;
  for (int step = 0; step < 6; ++step) {
    // Twins get the same seed at different batch positions (twin B in reverse order).
    StepBatch b;
    auto param = [&](int i) { return DeviceSampling{1.2f, 0, 1.f, 0x5eedull * 31 + uint64_t(step) * 977 + uint64_t(i)}; };
    for (int i = 0; i < S; ++i) b.seqs.push_back(step_of(seqs[i], i, param(i)));
    for (int i = S - 1; i >= 0; --i) b.seqs.push_back(step_of(seqs[i], S + i, param(i)));
    const StepResult r1 = exec->execute(b);
    const StepResult r2 = exec->execute(b);  // same batch again: same KV writes, same draws
    ASSERT_EQ(r1.sampled_ids.size(), size_t(2 * S));
    EXPECT_EQ(r1.sampled_ids, r2.sampled_ids) << "step " << step;
    for (int i = 0; i < S; ++i) {
      EXPECT_EQ(r1.sampled_ids[i], r1.sampled_ids[2 * S - 1 - i]) << "seq " << i << " step " << step;
      seen.insert(r1.sampled_ids[i]);
      seqs[i].computed = int(seqs[i].tokens.size());
      seqs[i].tokens.push_back(r1.sampled_ids[i]);
    }
  }
  EXPECT_GT(seen.size(), 6u) << "temperature 1.2 over 36 draws should not be one token";
}

// The kernel alone at MiniMax-M2's vocabulary: bf16 logits with five likely tokens spread over
// the row and 200,059 unlikely ones.
TEST(CudaDeviceSampling, DistributionAtFullVocab) {
  SKIP_WITHOUT_GPU();
  const int V = 200064, R = 2048;
  const std::vector<int32_t> ids = {7, 65000, 131071, 199999, 200063};
  const std::vector<double> p = {0.35, 0.25, 0.2, 0.12, 0.08};
  Tensor h = Tensor::host(DType::BF16, {R, V});
  uint16_t* hp = h.ptr<uint16_t>();
  const uint16_t low = f32_to_bf16(-40.f);
  for (size_t i = 0; i < size_t(R) * V; ++i) hp[i] = low;
  for (int r = 0; r < R; ++r)
    for (size_t j = 0; j < ids.size(); ++j) hp[size_t(r) * V + ids[j]] = f32_to_bf16(float(std::log(p[j])));
  auto be = make_cuda_backend(0);
  Tensor logits = be->upload(h);
  Tensor out = be->alloc(DType::I32, {R});
  std::vector<double> q(p.size());
  for (size_t j = 0; j < p.size(); ++j) q[j] = std::exp(double(bf16_to_f32(f32_to_bf16(float(std::log(p[j]))))));
  auto freq = [&](DeviceSampling d, bool same_seed) {
    std::vector<DeviceSampling> rows(R, d);
    for (int r = 0; r < R; ++r) rows[r].seed = same_seed ? 99 : splitmix_for_test(r);
    backend_device_sampler(*be)(logits, rows, out);
    std::vector<double> f(p.size(), 0);
    std::set<int32_t> distinct;
    for (float v : be->download_f32(out)) {
      const int32_t t = int32_t(v);
      distinct.insert(t);
      const auto it = std::find(ids.begin(), ids.end(), t);
      EXPECT_NE(it, ids.end()) << "sampled an unlikely token " << t;
      if (it != ids.end()) f[it - ids.begin()] += 1.0 / R;
    }
    return std::make_pair(f, distinct.size());
  };
  double qs = 0;
  for (double x : q) qs += x;
  auto [f, n] = freq(DeviceSampling{1.f, 0, 1.f, 0}, false);
  for (size_t j = 0; j < p.size(); ++j) EXPECT_NEAR(f[j], q[j] / qs, 0.035) << "token " << ids[j];
  std::tie(f, n) = freq(DeviceSampling{1.f, 2, 1.f, 0}, false);  // top-2
  EXPECT_NEAR(f[0], q[0] / (q[0] + q[1]), 0.035);
  EXPECT_NEAR(f[0] + f[1], 1.0, 1e-9);
  std::tie(f, n) = freq(DeviceSampling{1.f, 0, 0.7f, 0}, false);  // top-p 0.7: the first three
  EXPECT_NEAR(f[0] + f[1] + f[2], 1.0, 1e-9);
  EXPECT_NEAR(f[2], q[2] / (q[0] + q[1] + q[2]), 0.035);
  std::tie(f, n) = freq(DeviceSampling{0.f, 0, 1.f, 0}, false);  // greedy
  EXPECT_EQ(f[0], 1.0);
  std::tie(f, n) = freq(DeviceSampling{1.f, 0, 1.f, 0}, true);  // one seed on every row: one draw
  EXPECT_EQ(n, 1u);
}

// Batch independence and the filters' definitions at MiniMax-M2's vocabulary: rows of random
// logits with greedy, temperature, top-k, top-p and top-k + top-p (MiniMax-M2's
// generation_config) are sampled alone (many blocks per row, a cooperative launch), eight at
// a time, and all 300 at once (two launches of one block per row): every row gets the same
// token each way, and the token lies in the top-k set and inside the top-p nucleus (the mass
// of strictly more likely kept tokens is below top_p of the kept mass).
TEST(CudaDeviceSampling, BatchIndependentFiltersAtFullVocab) {
  SKIP_WITHOUT_GPU();
  const int V = 200064, R = 300;
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 3.f);
  Tensor h = Tensor::host(DType::BF16, {R, V});
  uint16_t* hp = h.ptr<uint16_t>();
  for (size_t i = 0; i < size_t(R) * V; ++i) hp[i] = f32_to_bf16(nd(rng));
  const std::vector<DeviceSampling> modes = {
      {0.f, 0, 1.f, 0}, {1.f, 0, 1.f, 0}, {0.8f, 40, 1.f, 0}, {1.f, 0, 0.95f, 0}, {1.f, 40, 0.95f, 0}, {0.6f, 5, 0.5f, 0}};
  std::vector<DeviceSampling> rows(R);
  for (int r = 0; r < R; ++r) rows[r] = modes[r % modes.size()], rows[r].seed = splitmix_for_test(1000 + r);
  auto be = make_cuda_backend(0);
  Tensor logits = be->upload(h);
  auto sample_rows = [&](int r0, int n) {
    Tensor part = logits.slice_rows(r0, r0 + n);
    Tensor out = be->alloc(DType::I32, {n});
    std::vector<DeviceSampling> p(rows.begin() + r0, rows.begin() + r0 + n);
    backend_device_sampler(*be)(part, p, out);
    std::vector<int32_t> ids;
    for (float v : be->download_f32(out)) ids.push_back(int32_t(v));
    return ids;
  };
  const std::vector<int32_t> all = sample_rows(0, R);
  std::vector<int32_t> alone, by8;
  for (int r = 0; r < 24; ++r) alone.push_back(sample_rows(r, 1)[0]);
  for (int r = 0; r < 48; r += 8)
    for (int32_t t : sample_rows(r, 8)) by8.push_back(t);
  EXPECT_EQ(alone, std::vector<int32_t>(all.begin(), all.begin() + 24));
  EXPECT_EQ(by8, std::vector<int32_t>(all.begin(), all.begin() + 48));
  for (int r = 0; r < R; ++r) {
    const DeviceSampling& d = rows[r];
    std::vector<float> z(V);
    float mx = -INFINITY;
    int arg = 0;
    for (int i = 0; i < V; ++i) {
      z[i] = bf16_to_f32(hp[size_t(r) * V + i]);
      if (z[i] > mx) mx = z[i], arg = i;
    }
    const int32_t t = all[r];
    ASSERT_GE(t, 0) << "row " << r;
    ASSERT_LT(t, V) << "row " << r;
    if (d.temperature <= 0.f) {
      EXPECT_EQ(t, arg) << "row " << r;
      continue;
    }
    for (float& x : z) x = (x - mx) / d.temperature;
    float kth = -INFINITY;
    if (d.top_k > 0) {
      std::vector<float> sorted = z;
      std::nth_element(sorted.begin(), sorted.begin() + (d.top_k - 1), sorted.end(), std::greater<float>());
      kth = sorted[d.top_k - 1];
      EXPECT_GE(z[t], kth) << "row " << r << ": outside the top-" << d.top_k;
    }
    if (d.top_p < 1.f) {
      double kept = 0, above = 0;
      for (int i = 0; i < V; ++i)
        if (z[i] >= kth) {
          kept += std::exp(double(z[i]));
          if (z[i] > z[t]) above += std::exp(double(z[i]));
        }
      EXPECT_LT(above, d.top_p * kept * (1 + 1e-4)) << "row " << r << ": outside the top-p nucleus";
    }
  }
}

// The kernel is total as the host sampler: a row without a finite maximum gets -1 (every
// entry -inf or NaN) or -2 (+inf) in every mode, never a made-up token; NaN entries among
// finite ones are never drawn; extreme finite logits and parameters give the host's argmax
// (greedy) or a token of the finite maximum's set.
TEST(CudaDeviceSampling, NonFiniteAndExtremeRows) {
  SKIP_WITHOUT_GPU();
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf(""), big = std::numeric_limits<float>::max();
  const int V = 4099;  // not a multiple of the block size
  struct Case {
    std::vector<std::pair<int, float>> set;  // entries over a base value
    float base;
    int32_t want;  // -1 / -2, or the only acceptable tokens' count below
    std::set<int32_t> ok;
  };
  const std::vector<Case> cases = {
      {{}, -inf, kDeviceNoCandidate, {}},
      {{}, nan, kDeviceNoCandidate, {}},
      {{{7, -inf}, {9, nan}}, nan, kDeviceNoCandidate, {}},
      {{{100, inf}}, 0.f, kDeviceInfLogit, {}},
      {{{5, inf}, {6, nan}}, -inf, kDeviceInfLogit, {}},
      {{{11, 0.5f}, {4000, 0.25f}}, nan, 0, {11, 4000}},   // NaN everywhere else
      {{{3, big}, {4098, big}}, -big, 0, {3, 4098}},       // extreme finite values
  };
  const std::vector<DeviceSampling> modes = {{0.f, 0, 1.f, 1}, {1.f, 0, 1.f, 2},   {0.7f, 2, 1.f, 3},
                                             {0.7f, 0, 0.5f, 4}, {1e30f, 3, 0.3f, 5}, {0.01f, 1 << 30, 1e-30f, 6}};
  auto be = make_cuda_backend(0);
  for (size_t c = 0; c < cases.size(); ++c) {
    Tensor h = Tensor::host(DType::F32, {int64_t(modes.size()), V});
    float* hp = h.ptr<float>();
    for (size_t r = 0; r < modes.size(); ++r) {
      std::fill(hp + r * V, hp + (r + 1) * V, cases[c].base);
      for (auto [i, v] : cases[c].set) hp[r * V + i] = v;
    }
    Tensor logits = be->upload(h);
    Tensor out = be->alloc(DType::I32, {int64_t(modes.size())});
    backend_device_sampler(*be)(logits, modes, out);
    const std::vector<float> got = be->download_f32(out);
    for (size_t r = 0; r < modes.size(); ++r) {
      const int32_t t = int32_t(got[r]);
      if (cases[c].ok.empty()) {
        EXPECT_EQ(t, cases[c].want) << "case " << c << " mode " << r;
      } else {
        EXPECT_TRUE(cases[c].ok.count(t)) << "case " << c << " mode " << r << " sampled " << t;
        if (modes[r].temperature == 0.f) EXPECT_EQ(t, *cases[c].ok.begin()) << "greedy: lowest id of the maximum";
      }
    }
  }
}

// vLLM's logits processors through the engine on the real CUDA executor with its device
// sampler: rows of requests that use them are sampled on the host whichever sampler the
// engine prefers, so a device-sampling engine gives exactly the host-sampling engine's tokens,
// and each feature has its effect.
TEST(CudaDeviceSampling, LogitsProcessorsThroughTheEngineMatchHostSampling) {
  SKIP_WITHOUT_GPU();
  const int V = 4096, N = 6, kMaxTokens = 10;
  std::vector<SamplingParams> params(N);
  params[0] = SamplingParams{.temperature = 0};
  params[0].logit_bias = {{1234, 100.f}};
  params[1] = SamplingParams{.temperature = 0.8f, .seed = 5};
  params[1].allowed_token_ids = {3, 17, 99, 1000};
  params[2] = SamplingParams{.temperature = 0.9f, .seed = 6};
  for (int32_t t = 0; t < V / 2; ++t) params[2].bad_words_token_ids.push_back({t});
  params[3] = SamplingParams{.temperature = 0.7f, .presence_penalty = 0.5f, .frequency_penalty = 0.5f,
                             .repetition_penalty = 1.3f, .seed = 7};
  params[4] = SamplingParams{.temperature = 0, .min_tokens = 5};
  params[5] = SamplingParams{.temperature = 1.f, .seed = 9};
  for (int32_t t = 0; t < 100; ++t) params[5].logit_bias.emplace_back(t, -100.f);
  auto run = [&](bool device) {
    EngineConfig cfg{.max_num_seqs = N, .device_sampling = device};
    auto engine = make_engine(cfg, make_exec(V, true, N));
    std::mutex mu;
    std::map<int, std::vector<int32_t>> out;
    std::map<int, FinishReason> reason;
    for (int i = 0; i < N; ++i) {
      Request r;
      r.id = "r" + std::to_string(i);
      r.prompt_ids = prompt_of(4 + i, 90 + i, V);
      r.params = params[i];
      r.params.max_tokens = kMaxTokens;
      r.on_output = [&, i](RequestOutput&& o) {
        std::lock_guard lk(mu);
        out[i].insert(out[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
        if (o.finished) reason[i] = o.finish_reason;
      };
      EXPECT_TRUE(engine->submit(std::move(r)));
    }
    engine->shutdown(std::chrono::seconds(60));
    for (int i = 0; i < N; ++i) EXPECT_EQ(reason[i], FinishReason::Length) << "request " << i;
    return out;
  };
  const auto dev = run(true), host = run(false);
  EXPECT_EQ(dev, host);
  ASSERT_EQ(dev.size(), size_t(N));
  EXPECT_EQ(dev.at(0), std::vector<int32_t>(kMaxTokens, 1234));
  for (int32_t t : dev.at(1)) EXPECT_TRUE(t == 3 || t == 17 || t == 99 || t == 1000) << t;
  for (int32_t t : dev.at(2)) EXPECT_GE(t, V / 2);
  for (int32_t t : dev.at(5)) EXPECT_GE(t, 100);
}

}  // namespace
}  // namespace moeserve
