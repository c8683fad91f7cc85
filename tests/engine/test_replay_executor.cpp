#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/testing/replay_executor.h"

namespace moeserve {
namespace {

using testing::ReplayExecutor;
using testing::ReplayExecutorConfig;

struct Outputs {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> final;
  Request req(const std::string& id, std::vector<int32_t> prompt, int max_tokens) {
    Request r;
    r.id = id;
    r.prompt_ids = std::move(prompt);
    r.params.max_tokens = max_tokens;  // default temperature 1: the forced token still wins
    r.on_output = [this](RequestOutput&& o) {
      std::lock_guard lk(mu);
      auto& t = tokens[o.request_id];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) {
        final[o.request_id] = o;
        cv.notify_all();
      }
    };
    return r;
  }
  void wait(size_t n) {
    std::unique_lock lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(20), [&] { return final.size() >= n; }));
  }
};

TEST(ReplayExecutor, ScriptsChosenByMarkerThenEndToken) {
  ReplayExecutorConfig cfg = testing::replay_config_from_json(nlohmann::json::parse(R"({
    "vocab_size": 1000, "max_model_len": 256, "block_size": 4, "num_kv_blocks": 256, "end_token": 999,
    "scripts": [{"marker": [7, 8], "tokens": [100, 101, 102]},
                {"tokens": [200, 201]},
                {"marker": [9], "tokens": [300]}]})"));
  EngineConfig ecfg{.max_num_batched_tokens = 8, .eos_token_ids = {999}};
  auto engine = make_engine(ecfg, std::make_unique<ReplayExecutor>(cfg));
  Outputs out;
  std::vector<int32_t> long_prompt(30, 5);
  long_prompt[20] = 7;
  long_prompt[21] = 8;  // marker inside a prompt that is prefilled in chunks
  ASSERT_TRUE(engine->submit(out.req("a", long_prompt, 10)));
  ASSERT_TRUE(engine->submit(out.req("b", {1, 2, 3}, 10)));
  ASSERT_TRUE(engine->submit(out.req("c", {9, 1}, 10)));
  ASSERT_TRUE(engine->submit(out.req("d", {7, 8, 1}, 2)));
  out.wait(4);
  EXPECT_EQ(out.tokens["a"], (std::vector<int32_t>{100, 101, 102, 999}));
  EXPECT_EQ(out.final["a"].finish_reason, FinishReason::Stop);
  EXPECT_EQ(out.tokens["b"], (std::vector<int32_t>{200, 201, 999}));
  EXPECT_EQ(out.tokens["c"], (std::vector<int32_t>{300, 999}));
  EXPECT_EQ(out.tokens["d"], (std::vector<int32_t>{100, 101}));
  EXPECT_EQ(out.final["d"].finish_reason, FinishReason::Length);
  // Same prompt again: served from the prefix cache, same script.
  ASSERT_TRUE(engine->submit(out.req("a2", long_prompt, 10)));
  out.wait(5);
  EXPECT_EQ(out.tokens["a2"], out.tokens["a"]);
  EXPECT_GT(out.final["a2"].num_cached_tokens, 0);
  engine->shutdown(std::chrono::seconds(1));
}

TEST(ReplayExecutor, RejectsBadConfig) {
  EXPECT_THROW(testing::replay_config_from_json(nlohmann::json::parse(R"({"scripts": [{"marker": [1]}]})")), Error);
  EXPECT_THROW(testing::replay_config_from_json(nlohmann::json::parse(R"({"vocab_size": "x"})")), Error);
  ReplayExecutorConfig c;
  c.vocab_size = 10;
  c.scripts = {{{}, {11}}};
  EXPECT_THROW(ReplayExecutor{c}, Error);
}

}  // namespace
}  // namespace moeserve
