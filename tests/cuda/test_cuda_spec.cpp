// Speculative decoding (n-gram) through the engine on the CUDA RankExecutor (label gpu; skips
// without a device): verify steps return 1 + k logits rows per sequence (SequenceStep::num_logits,
// eager path), rejected drafts are rolled back, and greedy output equals speculation off except
// after a near-tie (the verify forward is a multi-token step, the plain decode a graph replay:
// bf16 sums differ in the last bits, so a token whose top-2 logprobs are within kTieMargin may
// flip; the comparison of that sequence stops there).
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "backend/cuda/cuda_backend.h"
#include "engine/engine.h"
#include "engine/spec_config.h"
#include "engine/stop.h"
#include "runtime/device_sampler.h"
#include "runtime/model_executor.h"

namespace moeserve {
namespace {

namespace fs = std::filesystem;

#define SKIP_WITHOUT_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

constexpr float kTieMargin = 0.05f;

fs::path demo_dir() {
  const char* s = std::getenv("MOESERVE_SOURCE_DIR");
  return fs::path(s ? s : ".") / "assets" / "demo-model";
}

struct SpecRun {
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, std::vector<TokenLogprob>> logprobs;
  EngineStats stats;
};

SpecRun run(bool spec, bool enforce_eager, const SpecConfig* draft = nullptr) {
  ExecutorOptions eo;
  eo.model_dir = demo_dir().string();
  eo.block_size = 16;
  eo.num_kv_blocks = 256;
  eo.max_model_len = 1024;
  eo.max_num_seqs = 8;
  eo.enforce_eager = enforce_eager;
  if (draft) eo.speculative = *draft;  // mtp / eagle3: the executor loads the draft
  auto be = make_cuda_backend(0);
  eo.device_sampler = backend_device_sampler(*be);
  EngineConfig cfg;
  cfg.max_num_seqs = 8;
  cfg.max_num_batched_tokens = 64;
  cfg.eos_token_ids = read_eos_token_ids(eo.model_dir);
  if (draft) {
    cfg.speculative = *draft;
  } else if (spec) {
    cfg.speculative.method = SpecMethod::Ngram;
    cfg.speculative.num_speculative_tokens = 4;
    cfg.speculative.prompt_lookup_min = 1;
    cfg.speculative.prompt_lookup_max = 3;
  }
  cfg.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
  auto engine = make_engine(cfg, std::make_unique<RankExecutor>(std::move(be), eo));
  std::mutex mu;
  std::condition_variable cv;
  SpecRun out;
  int done = 0;
  const int N = 6;
  for (int i = 0; i < N; ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    // Self-repeating prompts: the demo model continues the pattern, so drafts are accepted.
    for (int rep = 0; rep < 4; ++rep)
      for (int t = 0; t < 6 + i; ++t) r.prompt_ids.push_back(300 + 37 * t + 11 * i);
    r.params.temperature = 0;
    r.params.max_tokens = 40;
    r.params.logprobs = 2;
    r.on_output = [&, i](RequestOutput&& o) {
      std::lock_guard lk(mu);
      out.tokens[i].insert(out.tokens[i].end(), o.new_token_ids.begin(), o.new_token_ids.end());
      out.logprobs[i].insert(out.logprobs[i].end(), o.logprobs.begin(), o.logprobs.end());
      if (o.finished) ++done, cv.notify_all();
    };
    EXPECT_TRUE(engine->submit(std::move(r)));
  }
  {
    std::unique_lock lk(mu);
    EXPECT_TRUE(cv.wait_for(lk, std::chrono::seconds(120), [&] { return done == N; }));
  }
  for (int i = 0; i < 1000 && engine->stats().kv_cache_usage != 0.0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  out.stats = engine->stats();
  engine->shutdown(std::chrono::seconds(10));
  return out;
}

TEST(CudaSpec, NgramGreedyMatchesPlainDecodingUpToNearTies) {
  SKIP_WITHOUT_GPU();
  for (bool eager : {false, true}) {
    SCOPED_TRACE(eager ? "enforce_eager" : "graphs");
    const SpecRun off = run(false, eager), on = run(true, eager);
    int excused = 0;
    for (const auto& [i, want] : off.tokens) {
      const auto& got = on.tokens.at(i);
      size_t j = 0;
      while (j < want.size() && j < got.size() && want[j] == got[j]) ++j;
      if (j == want.size() && j == got.size()) continue;
      ASSERT_LT(j, off.logprobs.at(i).size()) << "request " << i << " lengths " << want.size() << " vs " << got.size();
      const auto& top = off.logprobs.at(i)[j].top;
      ASSERT_GE(top.size(), 2u);
      EXPECT_LT(top[0].second - top[1].second, kTieMargin) << "request " << i << " diverges at " << j;
      ++excused;
    }
    EXPECT_LE(excused, 2);
    EXPECT_GT(on.stats.spec_num_drafts, 10u);
    EXPECT_GT(on.stats.spec_num_accepted_tokens, 0u);
    EXPECT_EQ(on.stats.kv_cache_usage, 0.0);
    std::printf("%s: drafts %llu, draft tokens %llu, accepted %llu, excused %d\n", eager ? "eager" : "graphs",
                (unsigned long long)on.stats.spec_num_drafts, (unsigned long long)on.stats.spec_num_draft_tokens,
                (unsigned long long)on.stats.spec_num_accepted_tokens, excused);
  }
}

// Draft heads on CUDA (the demo model's MTP modules and EAGLE-3 head): the capture ops, the
// draft forwards and their KV caches on the device; greedy output equals plain decoding up to
// near-ties, as n-gram's.
TEST(CudaSpec, DraftHeadsGreedyMatchPlainDecodingUpToNearTies) {
  SKIP_WITHOUT_GPU();
  const std::string eagle = (demo_dir() / "eagle3").string();
  const SpecConfig heads[] = {
      parse_speculative_config(R"({"method": "mtp", "num_speculative_tokens": 3})"),
      parse_speculative_config(R"({"method": "eagle3", "model": ")" + eagle + R"(", "num_speculative_tokens": 3})")};
  const SpecRun off = run(false, true);
  for (const SpecConfig& h : heads) {
    SCOPED_TRACE(spec_method_name(h.method));
    const SpecRun on = run(true, true, &h);
    int excused = 0;
    for (const auto& [i, want] : off.tokens) {
      const auto& got = on.tokens.at(i);
      size_t j = 0;
      while (j < want.size() && j < got.size() && want[j] == got[j]) ++j;
      if (j == want.size() && j == got.size()) continue;
      ASSERT_LT(j, off.logprobs.at(i).size());
      const auto& top = off.logprobs.at(i)[j].top;
      ASSERT_GE(top.size(), 2u);
      EXPECT_LT(top[0].second - top[1].second, kTieMargin) << "request " << i << " diverges at " << j;
      ++excused;
    }
    EXPECT_LE(excused, 2);
    EXPECT_GT(on.stats.spec_num_accepted_tokens, 10u);
    EXPECT_EQ(on.stats.kv_cache_usage, 0.0);
    std::printf("%s on CUDA: drafts %llu, accepted %llu, accepted per position %llu %llu %llu, excused %d\n",
                spec_method_name(h.method), (unsigned long long)on.stats.spec_num_drafts,
                (unsigned long long)on.stats.spec_num_accepted_tokens,
                (unsigned long long)on.stats.spec_accepted_per_pos[0],
                (unsigned long long)on.stats.spec_accepted_per_pos[1],
                (unsigned long long)on.stats.spec_accepted_per_pos[2], excused);
  }
}

}  // namespace
}  // namespace moeserve
