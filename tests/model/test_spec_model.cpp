// Speculative decoding (n-gram) with the real CPU model: the engine's output with speculation on
// equals the output with it off, token for token, on the trained demo model (real acceptance)
// and on the tiny fixtures (MiniMax-M2 and Qwen3-MoE), for a batch of several sequences with
// chunked prefills next to verify steps, greedy and seeded sampling, EOS stops.
#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/stop.h"
#include "golden_fixture.h"
#include "runtime/model_executor.h"

using namespace moeserve;
namespace fs = std::filesystem;

namespace {

fs::path source_dir() {
  const char* s = std::getenv("MOESERVE_SOURCE_DIR");
  return fs::path(s ? s : ".");
}

struct Outcome {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, FinishReason> reasons;
  EngineStats stats;
};

Outcome run(const std::string& model_dir, EngineConfig ec, const std::vector<std::vector<int32_t>>& prompts,
            SamplingParams p) {
  ExecutorOptions eo;
  eo.model_dir = model_dir;
  eo.block_size = 4;
  eo.num_kv_blocks = 400;
  eo.max_model_len = 1024;
  auto engine = make_engine(ec, make_cpu_executor(eo));
  std::mutex mu;
  std::condition_variable cv;
  Outcome out;
  size_t done = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    r.prompt_ids = prompts[i];
    r.params = p;
    if (p.seed) r.params.seed = *p.seed + i;
    r.on_output = [&, id = r.id](RequestOutput&& o) {
      std::lock_guard lk(mu);
      auto& v = out.tokens[id];
      v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) {
        out.reasons[id] = o.finish_reason;
        ++done;
        cv.notify_all();
      }
    };
    EXPECT_TRUE(engine->submit(std::move(r)));
  }
  {
    std::unique_lock lk(mu);
    EXPECT_TRUE(cv.wait_for(lk, std::chrono::seconds(300), [&] { return done == prompts.size(); }));
  }
  for (int i = 0; i < 1000 && engine->stats().kv_cache_usage != 0.0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  out.stats = engine->stats();
  engine->shutdown(std::chrono::milliseconds(1000));
  return out;
}

SpecConfig ngram(int k, int min_n, int max_n) {
  SpecConfig s;
  s.method = SpecMethod::Ngram;
  s.num_speculative_tokens = k;
  s.prompt_lookup_min = min_n;
  s.prompt_lookup_max = max_n;
  return s;
}

void expect_same(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (const auto& [id, t] : a.tokens) {
    EXPECT_EQ(t, b.tokens.at(id)) << id;
    EXPECT_EQ(a.reasons.at(id), b.reasons.at(id)) << id;
  }
}

// The demo golden prompts plus prompts that repeat themselves (a trained model continues the
// pattern, so n-gram drafts get accepted).
std::vector<std::vector<int32_t>> demo_prompts() {
  std::ifstream f(source_dir() / "tests" / "fixtures" / "golden" / "demo_bf16" / "golden.json");
  const auto j = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : j["cases"]) prompts.push_back(c["prompt_ids"].get<std::vector<int32_t>>());
  std::vector<int32_t> rep;
  for (int r = 0; r < 4; ++r) rep.insert(rep.end(), prompts[0].begin(), prompts[0].begin() + 20);
  prompts.push_back(rep);
  std::vector<int32_t> rep2;
  for (int r = 0; r < 6; ++r) rep2.insert(rep2.end(), prompts[2].begin(), prompts[2].begin() + 12);
  prompts.push_back(rep2);
  return prompts;
}

TEST(SpecModel, DemoGreedyIdenticalWithRealAcceptance) {
  const std::string model = (source_dir() / "assets" / "demo-model").string();
  const auto prompts = demo_prompts();
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 48;
  EngineConfig off;
  off.max_num_batched_tokens = 24;  // chunked prefills next to decodes and verifies
  off.max_num_seqs = 8;
  off.eos_token_ids = read_eos_token_ids(model);
  EngineConfig on = off;
  on.speculative = ngram(4, 1, 4);
  on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
  const Outcome a = run(model, off, prompts, p);
  const Outcome b = run(model, on, prompts, p);
  expect_same(a, b);
  EXPECT_GT(b.stats.spec_num_drafts, 20u);
  EXPECT_GT(b.stats.spec_num_accepted_tokens, 10u);
  EXPECT_EQ(b.stats.kv_cache_usage, 0.0);
  std::printf("demo greedy: drafts %llu, draft tokens %llu, accepted %llu (mean acceptance length %.2f)\n",
              (unsigned long long)b.stats.spec_num_drafts, (unsigned long long)b.stats.spec_num_draft_tokens,
              (unsigned long long)b.stats.spec_num_accepted_tokens,
              1.0 + double(b.stats.spec_num_accepted_tokens) / double(std::max<uint64_t>(1, b.stats.spec_num_drafts)));
}

// Adaptive k with a fake clock (engine/spec_policy.h): plain steps while 4 or more sequences
// decode (verifying costs 1 + 3k there), k = 4 below; greedy output as speculation off.
TEST(SpecModel, DemoAdaptiveKGreedyIdentical) {
  const std::string model = (source_dir() / "assets" / "demo-model").string();
  const auto prompts = demo_prompts();
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 48;
  EngineConfig off;
  off.max_num_batched_tokens = 24;
  off.max_num_seqs = 8;
  off.eos_token_ids = read_eos_token_ids(model);
  EngineConfig on = off;
  on.speculative = ngram(4, 1, 4);
  on.spec_policy.clock = [](SpecPhase ph, const SpecStepShape& shape, int k, double) {
    if (ph == SpecPhase::Draft) return 0.0;
    return shape.num_seqs >= 4 ? 0.001 * (1 + 3 * k) : 0.001;
  };
  const Outcome a = run(model, off, prompts, p);
  const Outcome b = run(model, on, prompts, p);
  expect_same(a, b);
  EXPECT_EQ(b.stats.kv_cache_usage, 0.0);
  ASSERT_EQ(b.stats.spec_chosen_k.size(), 5u);
  EXPECT_GT(b.stats.spec_chosen_k[0], 5u);
  EXPECT_GT(b.stats.spec_chosen_k[4], 5u);
  EXPECT_GT(b.stats.spec_num_accepted_tokens, 0u);
  std::printf("demo adaptive: chosen k0 %llu k4 %llu, explorations %llu, verify rows %llu, accepted %llu\n",
              (unsigned long long)b.stats.spec_chosen_k[0], (unsigned long long)b.stats.spec_chosen_k[4],
              (unsigned long long)b.stats.spec_k_explorations, (unsigned long long)b.stats.spec_num_drafts,
              (unsigned long long)b.stats.spec_num_accepted_tokens);
}

TEST(SpecModel, DemoSeededSamplingIdentical) {
  const std::string model = (source_dir() / "assets" / "demo-model").string();
  const auto prompts = demo_prompts();
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.9f;
  p.seed = 7;
  p.max_tokens = 32;
  p.logprobs = 1;
  EngineConfig off;
  off.max_num_batched_tokens = 32;
  off.eos_token_ids = read_eos_token_ids(model);
  EngineConfig on = off;
  on.speculative = ngram(3, 2, 3);
  on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
  expect_same(run(model, off, prompts, p), run(model, on, prompts, p));
}

TEST(SpecModel, TinyFixturesGreedyIdentical) {
  for (const char* name : {"tiny_fp8_partial", "qwen3_tiny_bf16"}) {
    const std::string dir = test::golden_fixture(name).string();
    std::vector<std::vector<int32_t>> prompts = {{3, 4, 5, 3, 4, 5, 3, 4}, {1, 2, 1, 2, 1, 2}, {7, 8, 9, 10, 11}};
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 24;
    p.ignore_eos = true;
    EngineConfig off;
    off.max_num_batched_tokens = 8;
    EngineConfig on = off;
    on.speculative = ngram(3, 1, 2);
    on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
    const Outcome a = run(dir, off, prompts, p);
    const Outcome b = run(dir, on, prompts, p);
    SCOPED_TRACE(name);
    expect_same(a, b);
    EXPECT_GT(b.stats.spec_num_drafts, 0u);  // random weights repeat little: few drafts
  }
}

}  // namespace
