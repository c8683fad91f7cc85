// The engine loop with the ToyExecutor: concurrency, abort, stats, determinism, validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/testing/toy_executor.h"

namespace moeserve {
namespace {

using namespace std::chrono_literals;
using testing::ToyExecutor;
using testing::ToyExecutorConfig;

// Collects outputs from the engine thread.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> final;
  std::map<std::string, int> deliveries;

  std::function<void(RequestOutput&&)> sink() {
    return [this](RequestOutput&& o) {
      std::lock_guard lk(mu);
      auto& t = tokens[o.request_id];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      ++deliveries[o.request_id];
      if (o.finished) {
        final[o.request_id] = o;
        cv.notify_all();
      }
    };
  }
  bool wait_finished(size_t n, std::chrono::milliseconds timeout = 20s) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, timeout, [&] { return final.size() >= n; });
  }
  size_t num_tokens(const std::string& id) {
    std::lock_guard lk(mu);
    return tokens[id].size();
  }
};

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 5 + salt * 11 + 3) % 64;
  return p;
}

Request make_request(const std::string& id, std::vector<int32_t> prompt, SamplingParams p, Collector& c) {
  Request r;
  r.id = id;
  r.prompt_ids = std::move(prompt);
  r.params = p;
  r.on_output = c.sink();
  return r;
}

bool wait_idle(const Engine& e, std::chrono::milliseconds timeout = 5s) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    EngineStats s = e.stats();
    if (s.num_running == 0 && s.num_waiting == 0 && s.kv_cache_usage == 0.0) return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

const ToyExecutorConfig kToy{.vocab_size = 64, .max_model_len = 96, .block_size = 4, .num_kv_blocks = 96};

TEST(EngineLoop, ManyConcurrentRequestsMatchReference) {
  EngineConfig cfg{.max_num_seqs = 16, .max_num_batched_tokens = 48};
  auto engine = make_engine(cfg, std::make_unique<ToyExecutor>(kToy));
  Collector c;
  const int kThreads = 4, kPer = 16;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPer; ++i) {
        const int k = t * kPer + i;
        SamplingParams p;
        p.temperature = 0;
        p.max_tokens = 4 + k % 9;
        ASSERT_TRUE(engine->submit(make_request("r" + std::to_string(k), prompt_of(3 + k % 20, k), p, c)));
      }
    });
  for (auto& th : threads) th.join();
  ASSERT_TRUE(c.wait_finished(kThreads * kPer));
  for (int k = 0; k < kThreads * kPer; ++k) {
    const std::string id = "r" + std::to_string(k);
    EXPECT_EQ(c.tokens[id], ToyExecutor::reference_greedy(kToy, prompt_of(3 + k % 20, k), 4 + k % 9)) << id;
    EXPECT_EQ(c.final[id].finish_reason, FinishReason::Length);
    EXPECT_EQ(c.final[id].num_generated_tokens, 4 + k % 9);
    EXPECT_EQ(c.deliveries[id], 4 + k % 9) << "one delivery per token";
  }
  EXPECT_TRUE(wait_idle(*engine));
  EngineStats s = engine->stats();
  uint64_t prompt_tokens = 0;
  for (int k = 0; k < kThreads * kPer; ++k) prompt_tokens += 3 + k % 20;
  if (s.num_preemptions == 0) EXPECT_EQ(s.prefix_cache_queries, prompt_tokens);
  EXPECT_GE(s.prefix_cache_queries, prompt_tokens);
  // Engine-thread time accounting: every token took at least one step; execute is inside step.
  uint64_t tokens = 0;
  for (int k = 0; k < kThreads * kPer; ++k) tokens += 4 + k % 9;
  EXPECT_GE(s.num_steps, tokens / uint64_t(EngineConfig{}.max_num_seqs));
  EXPECT_GT(s.num_steps, 0u);
  EXPECT_GT(s.execute_ns, 0u);
  EXPECT_LE(s.execute_ns, s.step_ns);
  engine->shutdown(1s);
}

// Runs the same seeded requests at a given concurrency (and submission order); returns each
// request's tokens and the number of preemptions.
std::map<std::string, std::vector<int32_t>> run_batch(int max_num_seqs, int num_blocks, float temperature,
                                                      bool reverse = false, uint64_t* preemptions = nullptr,
                                                      int vocab_size = kToy.vocab_size) {
  ToyExecutorConfig t = kToy;
  t.num_kv_blocks = num_blocks;
  t.vocab_size = vocab_size;
  EngineConfig cfg{.max_num_seqs = max_num_seqs, .max_num_batched_tokens = 32};
  auto engine = make_engine(cfg, std::make_unique<ToyExecutor>(t));
  Collector c;
  for (int j = 0; j < 24; ++j) {
    const int k = reverse ? 23 - j : j;
    SamplingParams p;
    p.temperature = temperature;
    p.top_p = 0.9f;
    p.seed = 1000 + k;
    p.max_tokens = 20;
    EXPECT_TRUE(engine->submit(make_request("q" + std::to_string(k), prompt_of(5 + k % 7, k), p, c)));
  }
  EXPECT_TRUE(c.wait_finished(24));
  EXPECT_TRUE(wait_idle(*engine));
  if (preemptions) *preemptions = engine->stats().num_preemptions;
  engine->shutdown(1s);
  return c.tokens;
}

TEST(EngineLoop, OutputIndependentOfConcurrencyAndPreemption) {
  for (float temp : {0.0f, 1.0f}) {
    auto serial = run_batch(1, 96, temp);
    auto wide = run_batch(24, 96, temp, /*reverse=*/true);
    uint64_t preemptions = 0;
    auto starved = run_batch(24, 24, temp, false, &preemptions);  // 24 blocks x 4 = 96 slots
    EXPECT_GT(preemptions, 0u);
    EXPECT_EQ(serial.size(), 24u);
    EXPECT_EQ(serial, wide) << "temperature " << temp;
    EXPECT_EQ(serial, starved) << "temperature " << temp;
    if (temp == 0.0f) EXPECT_EQ(serial["q3"], ToyExecutor::reference_greedy(kToy, prompt_of(8, 3), 20));
  }
}

TEST(EngineLoop, ParallelSamplingIndependentOfBatch) {
  // 24 rows x 8192 ids crosses the engine's threshold for sampling rows on the thread pool.
  for (float temp : {0.0f, 1.0f}) {
    auto serial = run_batch(1, 96, temp, false, nullptr, 8192);
    auto wide = run_batch(24, 96, temp, true, nullptr, 8192);
    EXPECT_EQ(serial.size(), 24u);
    EXPECT_EQ(serial, wide) << "temperature " << temp;
  }
}

TEST(EngineLoop, TimestampsAndIterationTokens) {
  ToyExecutorConfig t = kToy;
  t.step_sleep = 2ms;
  EngineConfig cfg{.max_num_seqs = 1, .max_num_batched_tokens = 4};  // one at a time: b queues
  auto engine = make_engine(cfg, std::make_unique<ToyExecutor>(t));
  Collector c;
  SamplingParams p;
  p.max_tokens = 5;
  p.ignore_eos = true;
  ASSERT_TRUE(engine->submit(make_request("a", prompt_of(10, 1), p, c)));
  ASSERT_TRUE(engine->submit(make_request("b", prompt_of(6, 2), p, c)));
  ASSERT_TRUE(c.wait_finished(2));
  using TP = std::chrono::steady_clock::time_point;
  for (const char* id : {"a", "b"}) {
    const RequestOutput& o = c.final[id];
    ASSERT_NE(o.queued_time, TP{}) << id;
    EXPECT_LE(o.queued_time, o.scheduled_time) << id;
    EXPECT_LT(o.scheduled_time, o.first_token_time) << id << ": prefill takes >= 1 step";
    EXPECT_LT(o.first_token_time, o.last_token_time) << id << ": 4 decode steps";
    EXPECT_GE(o.last_token_time - o.first_token_time, 4 * 2ms) << id;
  }
  EXPECT_GE(c.final["b"].scheduled_time, c.final["a"].last_token_time) << "b waited for a";
  EXPECT_GE(c.final["b"].scheduled_time - c.final["b"].queued_time, 5 * 2ms);
  engine->shutdown(1s);
  // Steps: a = prefill chunks 4+4+2 (the last samples) + 4 decodes; b = 4+2 + 4 decodes.
  EngineStats s = engine->stats();
  uint64_t steps = 0;
  for (uint64_t n : s.iteration_tokens) steps += n;
  EXPECT_EQ(steps, 3u + 4u + 2u + 4u);
  EXPECT_EQ(s.iteration_tokens_sum, uint64_t(10 + 4 + 6 + 4));
  EXPECT_EQ(s.iteration_tokens[0], 8u) << "decode steps: 1 token";
  EXPECT_EQ(s.iteration_tokens[1], 5u) << "prefill chunks of 2..4 tokens (bucket le=8)";
}

TEST(EngineLoop, AbortMidwayFreesBlocksAndReportsAbort) {
  ToyExecutorConfig t = kToy;
  t.step_sleep = 2ms;
  auto engine = make_engine({}, std::make_unique<ToyExecutor>(t));
  Collector c;
  SamplingParams p;
  p.max_tokens = 80;
  p.ignore_eos = true;
  ASSERT_TRUE(engine->submit(make_request("long", prompt_of(10, 1), p, c)));
  ASSERT_TRUE(engine->submit(make_request("other", prompt_of(10, 2), p, c)));
  while (c.num_tokens("long") < 5) std::this_thread::sleep_for(1ms);
  EXPECT_GT(engine->stats().kv_cache_usage, 0.0);
  engine->abort("long");
  engine->abort("no-such-request");  // ignored
  ASSERT_TRUE(c.wait_finished(1));
  {
    std::lock_guard lk(c.mu);
    EXPECT_EQ(c.final["long"].finish_reason, FinishReason::Abort);
    EXPECT_LT(c.tokens["long"].size(), 80u);
  }
  ASSERT_TRUE(c.wait_finished(2));
  EXPECT_EQ(c.final["other"].finish_reason, FinishReason::Length);
  EXPECT_TRUE(wait_idle(*engine));
  // The id is free again after it finished.
  EXPECT_TRUE(engine->submit(make_request("long", prompt_of(4, 1), SamplingParams{.max_tokens = 2}, c)));
  ASSERT_TRUE(c.wait_finished(2));
  engine->shutdown(1s);
}

TEST(EngineLoop, StopOnEosAndStopTokens) {
  // The greedy continuation's 3rd token, used as an EOS id, ends the request there.
  auto ref = ToyExecutor::reference_greedy(kToy, prompt_of(6, 4), 10);
  EngineConfig cfg;
  cfg.eos_token_ids = {ref[2]};
  auto engine = make_engine(cfg, std::make_unique<ToyExecutor>(kToy));
  Collector c;
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 10;
  ASSERT_TRUE(engine->submit(make_request("eos", prompt_of(6, 4), p, c)));
  SamplingParams q = p;
  q.ignore_eos = true;
  q.stop_token_ids = {ref[4]};
  ASSERT_TRUE(engine->submit(make_request("stop", prompt_of(6, 4), q, c)));
  ASSERT_TRUE(c.wait_finished(2));
  const size_t first_eos = std::find(ref.begin(), ref.end(), ref[2]) - ref.begin();
  EXPECT_EQ(c.tokens["eos"], std::vector<int32_t>(ref.begin(), ref.begin() + first_eos + 1));
  EXPECT_EQ(c.final["eos"].finish_reason, FinishReason::Stop);
  EXPECT_EQ(c.final["eos"].stop_token_id, ref[2]);
  const size_t first_stop = std::find(ref.begin(), ref.end(), ref[4]) - ref.begin();
  EXPECT_EQ(c.tokens["stop"], std::vector<int32_t>(ref.begin(), ref.begin() + first_stop + 1));
  EXPECT_EQ(c.final["stop"].stop_token_id, ref[4]);
  engine->shutdown(1s);
}

TEST(EngineLoop, PrefixCacheStatsAndCachedTokens) {
  auto engine = make_engine({}, std::make_unique<ToyExecutor>(kToy));
  Collector c;
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 3;
  ASSERT_TRUE(engine->submit(make_request("a", prompt_of(17, 9), p, c)));
  ASSERT_TRUE(c.wait_finished(1));
  ASSERT_TRUE(engine->submit(make_request("b", prompt_of(17, 9), p, c)));
  ASSERT_TRUE(c.wait_finished(2));
  EXPECT_EQ(c.final["a"].num_cached_tokens, 0);
  EXPECT_EQ(c.final["b"].num_cached_tokens, 16);
  EXPECT_EQ(c.tokens["a"], c.tokens["b"]);
  EXPECT_TRUE(wait_idle(*engine));
  EngineStats s = engine->stats();
  EXPECT_EQ(s.prefix_cache_queries, 34u);
  EXPECT_EQ(s.prefix_cache_hits, 16u);
  engine->shutdown(1s);
}

TEST(EngineLoop, ValidationAndQueueLimit) {
  ToyExecutorConfig t = kToy;
  t.step_sleep = 20ms;
  EngineConfig cfg{.max_num_seqs = 1, .max_waiting_requests = 2};
  auto engine = make_engine(cfg, std::make_unique<ToyExecutor>(t));
  EXPECT_EQ(engine->config().max_model_len, 96);
  Collector c;
  SamplingParams p;
  p.max_tokens = 50;
  EXPECT_THROW(engine->submit(make_request("x", prompt_of(96, 1), p, c)), Error) << "too long";
  EXPECT_THROW(engine->submit(make_request("x", {}, p, c)), Error) << "empty";
  EXPECT_THROW(engine->submit(make_request("x", {1, 64}, p, c)), Error) << "out of vocab";
  EXPECT_THROW(engine->submit(make_request("x", {1}, SamplingParams{.top_p = 0}, c)), Error);
  EXPECT_THROW(engine->submit(make_request("x", {1}, SamplingParams{.max_tokens = 0}, c)), Error);
  ASSERT_TRUE(engine->submit(make_request("a", {1}, p, c)));
  EXPECT_THROW(engine->submit(make_request("a", {1}, p, c)), Error) << "duplicate id";
  // "a" is admitted within a step; then two may wait; a third is refused.
  while (engine->stats().num_running == 0) std::this_thread::sleep_for(1ms);
  EXPECT_TRUE(engine->submit(make_request("b", {1}, p, c)));
  EXPECT_TRUE(engine->submit(make_request("c", {1}, p, c)));
  EXPECT_FALSE(engine->submit(make_request("d", {1}, p, c)));
  engine->shutdown(0ms);  // no grace: everything is aborted
  EXPECT_EQ(c.final.size(), 3u);
  for (auto& [id, o] : c.final) EXPECT_EQ(o.finish_reason, FinishReason::Abort) << id;
  EXPECT_FALSE(engine->submit(make_request("e", {1}, p, c))) << "stopped";
}

TEST(EngineLoop, ShutdownWithGraceFinishesWork) {
  auto engine = make_engine({}, std::make_unique<ToyExecutor>(kToy));
  Collector c;
  for (int i = 0; i < 8; ++i)
    ASSERT_TRUE(engine->submit(make_request("s" + std::to_string(i), prompt_of(8, i), SamplingParams{.max_tokens = 10}, c)));
  engine->shutdown(10s);
  ASSERT_EQ(c.final.size(), 8u);
  for (auto& [id, o] : c.final) EXPECT_EQ(o.finish_reason, FinishReason::Length) << id;
}

class ThrowingExecutor final : public ModelExecutor {
 public:
  ExecutorInfo info() const override { return {.vocab_size = 8, .max_model_len = 32, .block_size = 4, .num_kv_blocks = 8}; }
  StepResult execute(const StepBatch&) override { throw Error("device lost"); }
};

TEST(EngineLoop, ExecutorErrorFinishesRequestsWithError) {
  auto engine = make_engine({}, std::make_unique<ThrowingExecutor>());
  Collector c;
  ASSERT_TRUE(engine->submit(make_request("e", {1, 2}, SamplingParams{}, c)));
  ASSERT_TRUE(c.wait_finished(1));
  EXPECT_EQ(c.final["e"].finish_reason, FinishReason::Error);
  EXPECT_NE(c.final["e"].error.find("device lost"), std::string::npos);
  EXPECT_TRUE(wait_idle(*engine));
}

TEST(EngineLoop, LogprobsDelivered) {
  auto engine = make_engine({}, std::make_unique<ToyExecutor>(kToy));
  Collector c;
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 3;
  p.logprobs = 2;
  std::vector<RequestOutput> outs;
  std::mutex mu;
  Request r = make_request("lp", prompt_of(5, 1), p, c);
  r.on_output = [&](RequestOutput&& o) {
    std::lock_guard lk(mu);
    outs.push_back(std::move(o));
  };
  ASSERT_TRUE(engine->submit(std::move(r)));
  engine->shutdown(10s);
  ASSERT_EQ(outs.size(), 3u);
  for (auto& o : outs) {
    ASSERT_EQ(o.logprobs.size(), 1u);
    EXPECT_EQ(o.logprobs[0].token_id, o.new_token_ids[0]);
    ASSERT_EQ(o.logprobs[0].top.size(), 2u);
    EXPECT_EQ(o.logprobs[0].top[0].first, o.new_token_ids[0]) << "greedy token is the most likely";
    EXPECT_FLOAT_EQ(o.logprobs[0].top[0].second, o.logprobs[0].logprob);
  }
}


// prompt_logprobs under chunked prefill: a 70-token prompt through a step budget of 8 (nine
// chunks, next to other requests' decodes) gives the same prompt logprobs, bit for bit, as
// one unchunked prefill, and both match log_softmax of the toy model's logits at each position.
TEST(EngineLoop, PromptLogprobsUnderChunkedPrefillEqualUnchunked) {
  const ToyExecutorConfig toy{.vocab_size = 64, .max_model_len = 128, .block_size = 4, .num_kv_blocks = 128};
  const auto prompt = prompt_of(70, 9);
  auto run = [&](int budget, bool with_others) {
    auto engine = make_engine({.max_num_seqs = 8, .max_num_batched_tokens = budget}, std::make_unique<ToyExecutor>(toy));
    Collector c;
    std::vector<PromptTokenLogprob> got;
    std::mutex mu;
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = 2;
    if (with_others) {  // running decodes share every step with the chunks
      SamplingParams q = p;
      q.max_tokens = 30;
      for (int i = 0; i < 3; ++i) EXPECT_TRUE(engine->submit(make_request("o" + std::to_string(i), prompt_of(2, i), q, c)));
    }
    p.prompt_logprobs = 3;
    Request r = make_request("pl", prompt, p, c);
    r.on_output = [&](RequestOutput&& o) {
      std::lock_guard lk(mu);
      if (!o.prompt_logprobs.empty()) got = std::move(o.prompt_logprobs);
    };
    EXPECT_TRUE(engine->submit(std::move(r)));
    engine->shutdown(20s);
    return got;
  };
  const auto whole = run(128, false);
  const auto chunked = run(8, true);
  ASSERT_EQ(whole.size(), prompt.size() - 1);
  ASSERT_EQ(chunked.size(), whole.size());
  std::vector<float> logits(toy.vocab_size);
  for (size_t i = 0; i < whole.size(); ++i) {
    EXPECT_EQ(chunked[i].token_id, whole[i].token_id) << i;
    EXPECT_EQ(chunked[i].logprob, whole[i].logprob) << i;
    EXPECT_EQ(chunked[i].rank, whole[i].rank) << i;
    EXPECT_EQ(chunked[i].top, whole[i].top) << i;
    // Independent check: position i predicts prompt token i + 1.
    ToyExecutor::reference_logits(toy, std::span<const int32_t>(prompt.data(), i + 1), logits.data());
    double mx = *std::max_element(logits.begin(), logits.end()), sum = 0;
    for (float x : logits) sum += std::exp(double(x) - mx);
    EXPECT_EQ(whole[i].token_id, prompt[i + 1]);
    EXPECT_NEAR(whole[i].logprob, double(logits[size_t(prompt[i + 1])]) - mx - std::log(sum), 1e-5) << i;
    ASSERT_EQ(whole[i].top.size(), 3u);
  }
}

// vLLM's rule: max_num_partial_prefills > 1 without a threshold sets the threshold to 4% of
// max_model_len; a threshold above max_model_len is refused.
TEST(EngineLoop, PartialPrefillsDeriveTheThreshold) {
  auto engine = make_engine({.max_num_batched_tokens = 64, .max_num_partial_prefills = 2},
                            std::make_unique<ToyExecutor>(kToy));
  EXPECT_EQ(engine->config().long_prefill_token_threshold, int(kToy.max_model_len * 0.04));
  EXPECT_EQ(engine->config().max_num_partial_prefills, 2);
  EXPECT_THROW(make_engine({.max_num_batched_tokens = 64, .long_prefill_token_threshold = 1000,
                            .max_num_partial_prefills = 2},
                           std::make_unique<ToyExecutor>(kToy)),
               Error);
}

}  // namespace
}  // namespace moeserve
