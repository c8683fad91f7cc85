// Multi-GPU tests (labels multigpu, gpu): skip when fewer than 2 CUDA devices are visible.
//  - every NCCL collective on 2 and 4 GPUs (one thread per GPU) against host-computed values;
//  - the golden fixtures at TP=2, TP=2+EP (and TP=4 with >= 4 GPUs) through the
//    ParallelExecutor on CudaBackend + NCCL, teacher-forced, against TP=1 on CUDA and the
//    transformers reference, within the bf16 bound of test_cuda_golden (2e-2 of max|ref|);
//  - decode CUDA graphs per rank under TP=2 (NCCL all-reduces captured inside) over the
//    multi-sequence scenario (buckets 1..16): vs TP=2 padded eager (same kernels, same
//    all-reduce sizes: bound 1e-3), adding nothing to TP=2's own difference from TP=1 eager
//    (printed: routing near-ties of the random fixtures), graph counts on both ranks;
//    GPU sampling on rank 0 (greedy rows) against the host argmax of the same TP=2 layout.
#include <gtest/gtest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <chrono>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "dist/collective_check.h"
#include "dist/in_process.h"
#include "dist/nccl_communicator.h"
#include "dist/p2p_allreduce.h"
#include "model/arch/minimax_m2.h"
#include "tools/generate.h"
#include "runtime/device_sampler.h"
#include "runtime/parallel_executor.h"
#include "../model/executor_scenario.h"
#include "../model/golden_fixture.h"

using namespace moeserve;
namespace fs = std::filesystem;

namespace {

constexpr double kBound = 2e-2;

TEST(Nccl, CollectivesOnEveryGpuCount) {
  const int n = cuda_device_count();
  if (n < 2) GTEST_SKIP() << n << " CUDA device(s); need 2";
  for (int world : {2, 4, 8}) {
    if (world > n) break;
    const NcclUniqueId id = nccl_unique_id();
    std::vector<CollectiveCheckResult> res(static_cast<size_t>(world));
    std::vector<std::exception_ptr> err(static_cast<size_t>(world));
    std::vector<std::thread> th;
    for (int r = 0; r < world; ++r)
      th.emplace_back([&, r] {
        try {
          MS_CHECK(cudaSetDevice(r) == cudaSuccess, "cudaSetDevice");
          cudaStream_t s;
          MS_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
          {
            NcclCommunicator c(id, world, r, r, s);
            res[size_t(r)] = check_collectives(c, s, size_t(64) << 20);
          }
          cudaStreamDestroy(s);
        } catch (...) {
          err[size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : th) t.join();
    if (auto e = first_root_cause(err)) std::rethrow_exception(e);
    for (int r = 0; r < world; ++r) {
      for (const auto& f : res[size_t(r)].failures) ADD_FAILURE() << "world " << world << ": " << f;
      EXPECT_GE(res[size_t(r)].checks, 8);
    }
    std::printf("[nccl] world %d: %d checks per rank; bf16 all-reduce 6 KiB %.1f us, 64 MiB %.1f us (%.1f GB/s busbw)\n",
                world, res[0].checks, res[0].small_all_reduce_us, res[0].all_reduce_us,
                2.0 * (world - 1) / world * double(64 << 20) / (res[0].all_reduce_us * 1e3));
    EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");  // set by the communicator unless the user chose
  }
}

TEST(Nccl, LocalArgumentErrorsThrow) {
  if (cuda_device_count() < 1) GTEST_SKIP() << "no CUDA device";
  const NcclUniqueId id = nccl_unique_id();
  cudaSetDevice(0);
  cudaStream_t s;
  cudaStreamCreate(&s);
  {
    NcclCommunicator c(id, 1, 0, 0, s);  // a group of one
    Tensor host = Tensor::host(DType::F32, {4});
    EXPECT_THROW(c.all_reduce_sum(host), Error);  // host memory
    void* p = nullptr;
    cudaMalloc(&p, 64);
    Tensor i32 = Tensor::view(p, DType::I32, {4}, Device::CUDA), f = Tensor::view(p, DType::F32, {4}, Device::CUDA);
    EXPECT_THROW(c.all_reduce_sum(i32), Error);       // integer sum
    EXPECT_THROW(c.all_to_allv(f, {2}, f, {2}), Error);  // in and out overlap
    EXPECT_THROW(c.broadcast(f, 1), Error);
    c.all_reduce_sum(f);  // world 1: a no-op sum
    c.barrier();
    cudaFree(p);
  }
  cudaStreamDestroy(s);
}

// The one-shot p2p all-reduce against exact sums (small integers): eager calls of changing
// sizes (both parities, back to back), then the same inside a CUDA graph replayed several
// times (the epoch lives in device memory), and its latency next to NCCL's.
TEST(Nccl, P2pAllReduceMatchesAndReplaysInGraphs) {
  const int n = cuda_device_count();
  if (n < 2) GTEST_SKIP() << n << " CUDA device(s); need 2";
  for (int world : {2, 4, 8}) {
    if (world > n) break;
    std::vector<int> devs;
    for (int i = 0; i < world; ++i) devs.push_back(i);
    auto p2p = P2pAllReduce::create(devs);
    if (!p2p) GTEST_SKIP() << "no peer access between the GPUs";
    const NcclUniqueId id = nccl_unique_id();
    std::vector<std::string> fails(static_cast<size_t>(world));
    std::vector<double> us_p2p(static_cast<size_t>(world)), us_nccl(static_cast<size_t>(world));
    std::vector<std::exception_ptr> err(static_cast<size_t>(world));
    std::vector<std::thread> th;
    for (int r = 0; r < world; ++r)
      th.emplace_back([&, r] {
        try {
          MS_CHECK(cudaSetDevice(r) == cudaSuccess, "cudaSetDevice");
          cudaStream_t s;
          MS_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
          NcclCommunicator plain(id, world, r, r, s);
          const int64_t max_n = 8192;  // 32 KiB of f32
          void* d = nullptr;
          cudaMalloc(&d, max_n * 4);
          auto val = [](int rank, int64_t i, int round) { return float((rank * 5 + i * 3 + round) % 11) - 5.f; };
          auto run = [&](int64_t cnt, DType dt, int round) {
            std::vector<float> h(static_cast<size_t>(cnt));
            std::vector<uint16_t> hb(static_cast<size_t>(cnt));
            for (int64_t i = 0; i < cnt; ++i) h[size_t(i)] = val(r, i, round), hb[size_t(i)] = f32_to_bf16(h[size_t(i)]);
            cudaMemcpyAsync(d, dt == DType::F32 ? static_cast<void*>(h.data()) : hb.data(), cnt * dtype_size(dt),
                            cudaMemcpyHostToDevice, s);
            Tensor t = Tensor::view(d, dt, {cnt}, Device::CUDA);
            p2p->all_reduce(r, t, s);
          };
          auto verify = [&](int64_t cnt, DType dt, int round, const char* what) {
            std::vector<float> got(static_cast<size_t>(cnt));
            std::vector<uint16_t> gb(static_cast<size_t>(cnt));
            cudaMemcpyAsync(dt == DType::F32 ? static_cast<void*>(got.data()) : gb.data(), d, cnt * dtype_size(dt),
                            cudaMemcpyDeviceToHost, s);
            cudaStreamSynchronize(s);
            for (int64_t i = 0; i < cnt; ++i) {
              float e = 0;
              for (int q = 0; q < world; ++q) e += val(q, i, round);
              const float g = dt == DType::F32 ? got[size_t(i)] : bf16_to_f32(gb[size_t(i)]);
              if (g != e) {
                fails[size_t(r)] = std::string(what) + " n=" + std::to_string(cnt) + " i=" + std::to_string(i);
                return;
              }
            }
          };
          for (int round = 0; round < 200; ++round) {
            const int64_t cnt = 1 + (round * 997) % max_n;
            const DType dt = round % 2 ? DType::BF16 : DType::F32;
            run(cnt, dt, round);
            if (round % 7 == 0) verify(cnt, dt, round, "eager");
            else cudaStreamSynchronize(s);  // the next upload reuses the buffer
          }
          // Graph: upload + all-reduce captured once, replayed with the same data 5 times
          // (the input is re-uploaded inside the graph, so every replay must give the sum).
          cudaGraph_t g;
          cudaGraphExec_t ge;
          std::vector<uint16_t> hb(3072);
          for (int64_t i = 0; i < 3072; ++i) hb[size_t(i)] = f32_to_bf16(val(r, i, 999));
          void* src = nullptr;
          cudaMalloc(&src, 3072 * 2);
          cudaMemcpy(src, hb.data(), 3072 * 2, cudaMemcpyHostToDevice);
          cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
          cudaMemcpyAsync(d, src, 3072 * 2, cudaMemcpyDeviceToDevice, s);
          Tensor t = Tensor::view(d, DType::BF16, {3072}, Device::CUDA);
          p2p->all_reduce(r, t, s);
          MS_CHECK(cudaStreamEndCapture(s, &g) == cudaSuccess, "capture");
          MS_CHECK(cudaGraphInstantiate(&ge, g, 0) == cudaSuccess, "instantiate");
          for (int rep = 0; rep < 5; ++rep) {
            cudaGraphLaunch(ge, s);
            verify(3072, DType::BF16, 999, "graph replay");
          }
          // Latency of a decode-sized (6 KiB) BF16 all-reduce: p2p vs NCCL.
          auto time = [&](auto&& f) {
            for (int i = 0; i < 10; ++i) f();
            cudaStreamSynchronize(s);
            plain.barrier();
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < 200; ++i) f();
            cudaStreamSynchronize(s);
            return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200;
          };
          us_p2p[size_t(r)] = time([&] { p2p->all_reduce(r, t, s); });
          us_nccl[size_t(r)] = time([&] { plain.all_reduce_sum(t); });
          cudaGraphExecDestroy(ge);
          cudaGraphDestroy(g);
          cudaFree(d);
          cudaFree(src);
          plain.barrier();
        } catch (...) {
          err[size_t(r)] = std::current_exception();
        }
      });
    for (auto& t : th) t.join();
    if (auto e = first_root_cause(err)) std::rethrow_exception(e);
    for (int r = 0; r < world; ++r) EXPECT_EQ(fails[size_t(r)], "") << "world " << world << " rank " << r;
    std::printf("[p2p] world %d: 6 KiB bf16 all-reduce %.1f us (NCCL %.1f us)\n", world, us_p2p[0], us_nccl[0]);
  }
}

double rel(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num = std::max(num, double(std::fabs(a[i] - b[i])));
    den = std::max(den, double(std::fabs(b[i])));
  }
  return den > 0 ? num / den : num;
}

// Step 0 prefills the prompt, step k decodes reference token k-1: [steps, V] logits.
std::vector<float> teacher_forced(ModelExecutor& exec, const std::vector<int32_t>& prompt,
                                  const std::vector<int32_t>& gen) {
  std::vector<float> out;
  const int bs = exec.info().block_size;
  std::vector<int32_t> table;
  for (int b = 0; b < exec.info().num_kv_blocks; ++b) table.push_back(b);
  int pos = 0;
  for (size_t k = 0; k < gen.size(); ++k) {
    SequenceStep s;
    s.seq_id = 1;
    s.tokens = k == 0 ? prompt : std::vector<int32_t>{gen[k - 1]};
    s.start_pos = pos;
    const int ctx = pos + int(s.tokens.size());
    s.block_table.assign(table.begin(), table.begin() + (ctx + bs - 1) / bs);
    StepResult r = exec.execute(StepBatch{{s}});
    out.insert(out.end(), r.logits.begin(), r.logits.end());
    pos = ctx;
  }
  return out;
}

struct Layout {
  int tp;
  bool ep;
};

class NcclGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(NcclGolden, ParallelMatchesTp1OnCuda) {
  const int n = cuda_device_count();
  if (n < 2) GTEST_SKIP() << n << " CUDA device(s); need 2";
  const fs::path d = test::golden_fixture(GetParam());
  const test::GoldenRef g = test::load_golden(GetParam());
  const auto &prompt = g.prompt, &gen = g.generated;
  const auto& ref = g.logits;
  const int64_t V = g.vocab;
  ExecutorOptions eo;
  eo.model_dir = d.string();
  eo.num_kv_blocks = 64;
  std::vector<float> tp1;
  {
    RankExecutor one(make_cuda_backend(0), eo);
    tp1 = teacher_forced(one, prompt, gen);
  }
  const auto cfg = MiniMaxM2Config::from_file((d / "config.json").string());
  for (Layout lay : {Layout{2, false}, Layout{2, true}, Layout{4, false}, Layout{4, true}}) {
    if (lay.tp > n) continue;
    if (lay.ep && cfg.num_local_experts % lay.tp) continue;
    // Expert TP that cuts FP8 blocks (128 rows over 2 = 64): users get a refusal (see
    // check_parallel_layout); the CUDA MoE kernel wants one block shape for all expert
    // matrices, so only EP runs these fixtures' experts.
    if (!lay.ep && cfg.quantization.enabled() && (cfg.intermediate_size / lay.tp) % cfg.quantization.block_out != 0) {
      std::printf("[nccl-golden] %s TP=%d expert-TP skipped (cuts FP8 blocks)\n", GetParam().c_str(), lay.tp);
      continue;
    }
    ParallelExecutorOptions o;
    o.exec = eo;
    o.layout.tensor_parallel = lay.tp;
    o.layout.expert_parallel = lay.ep;
    o.layout.allow_fp8_block_split = true;  // tiny fixtures: 16-wide heads in 128-blocks
    const NcclUniqueId id = nccl_unique_id();
    o.make_backend = [](int r) -> std::unique_ptr<Backend> { return make_cuda_backend(r); };
    o.make_comm = [id, w = lay.tp](int r, Backend& b) -> std::unique_ptr<Communicator> {
      auto& cb = static_cast<CudaBackend&>(b);
      return std::make_unique<NcclCommunicator>(id, w, r, cb.device_index(), cb.stream());
    };
    ParallelExecutor par(std::move(o));
    const auto got = teacher_forced(par, prompt, gen);
    ASSERT_EQ(got.size(), tp1.size());
    double worst_tp1 = 0, worst_ref = 0;
    for (size_t k = 0; k < gen.size(); ++k) {
      worst_tp1 = std::max(worst_tp1, rel(got.data() + k * V, tp1.data() + k * V, V));
      worst_ref = std::max(worst_ref, rel(got.data() + k * V, ref.data() + k * V, V));
    }
    std::printf("[nccl-golden] %s TP=%d%s: vs CUDA TP=1 %.3g, vs HF %.3g\n", GetParam().c_str(), lay.tp,
                lay.ep ? "+EP" : "", worst_tp1, worst_ref);
    EXPECT_LE(worst_tp1, kBound) << "tp " << lay.tp << " ep " << lay.ep;
    EXPECT_LE(worst_ref, kBound) << "tp " << lay.tp << " ep " << lay.ep;
  }
}

// The fixtures the CUDA backend runs (test_cuda_golden's; the others hold F16 tensors).
INSTANTIATE_TEST_SUITE_P(Fixtures, NcclGolden, ::testing::Values("tiny_bf16", "tiny_fp8_b128", "tiny_fp8_partial"));

// ---- decode graphs and device sampling under TP=2 ----

std::unique_ptr<ParallelExecutor> make_tp(const ExecutorOptions& eo, int tp, bool ep, bool device_sampling) {
  ParallelExecutorOptions o;
  o.exec = eo;
  o.layout.tensor_parallel = tp;
  o.layout.expert_parallel = ep;
  o.layout.allow_fp8_block_split = true;
  const NcclUniqueId id = nccl_unique_id();
  o.make_backend = [](int r) -> std::unique_ptr<Backend> { return make_cuda_backend(r); };
  o.make_comm = [id, tp](int r, Backend& b) -> std::unique_ptr<Communicator> {
    auto& cb = static_cast<CudaBackend&>(b);
    return std::make_unique<NcclCommunicator>(id, tp, r, cb.device_index(), cb.stream());
  };
  if (device_sampling)
    o.make_device_sampler = [](Backend& b) { return backend_device_sampler(b); };
  return std::make_unique<ParallelExecutor>(std::move(o));
}

class NcclGraphs : public ::testing::TestWithParam<std::string> {};

TEST_P(NcclGraphs, Tp2GraphsMatchEager) {
  const int n = cuda_device_count();
  if (n < 2) GTEST_SKIP() << n << " CUDA device(s); need 2";
  const fs::path d = test::golden_fixture(GetParam());
  const auto cfg = MiniMaxM2Config::from_file((d / "config.json").string());
  const bool ep = cfg.quantization.enabled();  // FP8 fixtures: EP (expert TP would cut 128-row blocks)
  ExecutorOptions eo;
  eo.model_dir = d.string();
  eo.block_size = 4;
  eo.num_kv_blocks = 128;
  eo.max_num_seqs = 16;
  eo.max_num_batched_tokens = 64;
  moeserve::test::ScenarioTrace ref, plain, padded, graphed;
  {
    eo.enforce_eager = true;
    RankExecutor one(make_cuda_backend(0), eo);
    ref = moeserve::test::run_scenario(one);
  }
  {
    auto par = make_tp(eo, 2, ep, false);  // TP=2 eager, unpadded: the layout alone
    plain = moeserve::test::run_scenario(*par, &ref);
  }
  {
    eo.pad_decode = true;  // TP=2, padded decode steps run eagerly
    auto par = make_tp(eo, 2, ep, false);
    padded = moeserve::test::run_scenario(*par, &ref);
    EXPECT_EQ(par->graphs_captured(0), 0);
  }
  {
    eo.enforce_eager = false;
    eo.pad_decode = false;
    auto par = make_tp(eo, 2, ep, false);
    graphed = moeserve::test::run_scenario(*par, &ref);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(par->graphs_captured(r), 5) << "rank " << r;
      EXPECT_EQ(par->graph_replays(r), 9) << "rank " << r;
    }
  }
  const auto e_pad = moeserve::test::step_errors(padded, graphed), e_tp1 = moeserve::test::step_errors(ref, graphed),
             e_plain = moeserve::test::step_errors(ref, plain);
  double w_pad = 0, w_tp1 = 0, w_plain = 0;
  std::string steps;
  for (size_t k = 0; k < e_pad.size(); ++k) {
    w_pad = std::max(w_pad, e_pad[k]);
    w_tp1 = std::max(w_tp1, e_tp1[k]);
    w_plain = std::max(w_plain, e_plain[k]);
    steps += fmt::format(" {}:{:.2g}/{:.2g}", k, e_plain[k], e_tp1[k]);
    EXPECT_LE(e_pad[k], 1e-3) << "step " << k << ": TP=2 graph replay vs TP=2 padded eager";
    // Graphs add nothing to what the TP=2 layout itself does against TP=1.
    EXPECT_LE(e_tp1[k], e_plain[k] + 1e-3) << "step " << k << ": TP=2 graphs vs TP=1 eager";
    // The layout itself against TP=1 (e_plain) is printed, not bounded here: on these random
    // fixtures a few scenario tokens have last-layer routing near-ties (the k-th and (k+1)-th
    // expert scores within 2e-4..7e-4 on the CPU reference), which bf16 rounding decides
    // differently from layout to layout; such a step then differs by ~0.2 (seen on 2 x H200:
    // tiny_fp8_b128 TP=2+EP step 10, whose last-layer gap is 4.1e-4, and CUDA TP=1 against the
    // CPU backend on the same steps). The layout is checked where routing has no near-tie
    // (NcclGolden, vs HF and TP=1) and exactly on the CPU backend
    // (ParallelExecutor.ScenarioTp2EpMatchesTp1OnFp8Fixture).
  }
  std::printf("[nccl-graphs] %s TP=2%s: graphs vs TP=2 padded eager %.3g, vs TP=1 eager %.3g; TP=2 eager vs TP=1 "
              "eager %.3g\n[nccl-graphs] per step (TP=2 eager / graphs vs TP=1):%s\n",
              GetParam().c_str(), ep ? "+EP" : "", w_pad, w_tp1, w_plain, steps.c_str());
}

// Expert-TP (experts sliced, no EP) of tiny_bf16, TP=2 eager vs TP=1 eager over the scenario
// (the graphs_big branch saw 0.27-0.33 here; merged main on 2 x H200 passes).
TEST(NcclLayout, Tp2ExpertTpEagerMatchesTp1) {
  if (cuda_device_count() < 2) GTEST_SKIP() << "need 2 GPUs";
  ExecutorOptions eo;
  eo.model_dir = test::golden_fixture("tiny_bf16").string();
  eo.block_size = 4;
  eo.num_kv_blocks = 128;
  eo.max_num_seqs = 16;
  eo.max_num_batched_tokens = 64;
  eo.enforce_eager = true;
  moeserve::test::ScenarioTrace ref, got;
  {
    RankExecutor one(make_cuda_backend(0), eo);
    ref = moeserve::test::run_scenario(one);
  }
  auto par = make_tp(eo, 2, false, false);
  got = moeserve::test::run_scenario(*par, &ref);
  const auto e = moeserve::test::step_errors(ref, got);
  for (size_t k = 0; k < e.size(); ++k) EXPECT_LE(e[k], kBound) << "step " << k;
}

// Three sequences decode 6 steps; rows 0 and 2 are sampled greedily on rank 0's GPU, row 1 on
// the host. Tokens are forced from the TP=1 run; every row's id is checked against the host
// argmax of the same TP=2 layout run without device sampling.
TEST_P(NcclGraphs, Tp2DeviceSamplingOnRank0) {
  const int n = cuda_device_count();
  if (n < 2) GTEST_SKIP() << n << " CUDA device(s); need 2";
  const fs::path d = test::golden_fixture(GetParam());
  const auto cfg = MiniMaxM2Config::from_file((d / "config.json").string());
  const bool ep = cfg.quantization.enabled();
  ExecutorOptions eo;
  eo.model_dir = d.string();
  eo.block_size = 4;
  eo.num_kv_blocks = 64;
  eo.max_num_seqs = 4;
  const int kSteps = 6;
  auto run = [&](ModelExecutor& ex, bool device, const std::vector<std::vector<int32_t>>* forced,
                 std::vector<std::vector<float>>* logits) {
    const int V = ex.info().vocab_size;
    std::vector<std::vector<int32_t>> out;
    std::vector<std::vector<int32_t>> toks{{5, 9, 13}, {7, 2}, {11, 3, 8, 1}};
    std::vector<int> cached(3, 0);
    for (int k = 0; k < kSteps; ++k) {
      StepBatch b;
      for (int i = 0; i < 3; ++i) {
        SequenceStep s;
        s.seq_id = i;
        s.start_pos = cached[size_t(i)];
        s.tokens.assign(toks[size_t(i)].begin() + cached[size_t(i)], toks[size_t(i)].end());
        const int ctx = s.start_pos + int(s.tokens.size());
        for (int j = 0; j < (ctx + 3) / 4; ++j) s.block_table.push_back(i * 16 + j);
        if (device && i != 1) s.device_sample = DeviceSampling{};  // greedy
        b.seqs.push_back(s);
      }
      StepResult r = ex.execute(b);
      std::vector<int32_t> ids;
      size_t di = 0, hi = 0;
      for (int i = 0; i < 3; ++i) {
        int32_t id;
        if (b.seqs[size_t(i)].device_sample) {
          EXPECT_LT(di, r.sampled_ids.size());
          id = di < r.sampled_ids.size() ? r.sampled_ids[di++] : -1;
        } else {
          id = argmax_lowest(r.logits.data() + hi * size_t(V), V);
          if (logits) logits->emplace_back(r.logits.begin() + long(hi * V), r.logits.begin() + long((hi + 1) * V));
          ++hi;
        }
        ids.push_back(id);
        cached[size_t(i)] += int(b.seqs[size_t(i)].tokens.size());
        toks[size_t(i)].push_back(forced ? (*forced)[size_t(k)][size_t(i)] : id);
      }
      out.push_back(ids);
    }
    return out;
  };
  std::vector<std::vector<int32_t>> ref_ids;  // the forced tokens
  {
    RankExecutor one(make_cuda_backend(0), eo);
    ref_ids = run(one, false, nullptr, nullptr);
  }
  // The same TP=2 layout with host argmax: device sampling must pick what the host would from
  // that layout's own logits (TP=1 only supplies the forced tokens; a routing near-tie can make
  // TP=1's logits differ from TP=2's, see Tp2GraphsMatchEager).
  std::vector<std::vector<float>> tp2_logits;
  std::vector<std::vector<int32_t>> tp2_ids;
  {
    auto host = make_tp(eo, 2, ep, false);
    tp2_ids = run(*host, false, &ref_ids, &tp2_logits);
  }
  auto par = make_tp(eo, 2, ep, true);
  ASSERT_TRUE(par->info().device_sampling);
  const auto got = run(*par, true, &ref_ids, nullptr);
  const int V = cfg.vocab_size;
  int checked = 0;
  for (int k = 0; k < kSteps; ++k)
    for (int i = 0; i < 3; ++i) {
      const float* l = tp2_logits[size_t(k * 3 + i)].data();
      float a = -INFINITY, b = -INFINITY, m = 0;
      for (int v = 0; v < V; ++v) {
        m = std::max(m, std::fabs(l[v]));
        if (l[v] > a) b = a, a = l[v];
        else if (l[v] > b) b = l[v];
      }
      if ((a - b) / std::max(m, 1e-30f) < 1e-3) continue;  // bf16-close top-2: either pick is right
      ++checked;
      EXPECT_EQ(got[size_t(k)][size_t(i)], tp2_ids[size_t(k)][size_t(i)]) << "step " << k << " row " << i;
    }
  EXPECT_GT(par->graph_replays(0), 0);  // steps 1.. are pure decode: graphs, then sampling
  std::printf("[nccl-sampling] %s: %d of %d rows compared, graph replays %d\n", GetParam().c_str(), checked,
              kSteps * 3, par->graph_replays(0));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NcclGraphs, ::testing::Values("tiny_bf16", "tiny_fp8_b128"));

}  // namespace
