// Structured outputs through the engine loop (ToyExecutor, 64-token vocabulary): every output
// follows the grammar and ends with EOS, for greedy and seeded sampling, n > 1 style
// concurrency, logprobs (after masking), a constraint that starts after a reasoning-end token,
// and preemption (few KV blocks).
#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <regex>

#include "engine/engine.h"
#include "engine/structured_sampling.h"
#include "engine/testing/toy_executor.h"
#include "structured/constraint.h"
#include "structured/regex.h"

namespace moeserve {
namespace {

using namespace std::chrono_literals;
using testing::ToyExecutor;
using testing::ToyExecutorConfig;

constexpr int32_t kEos = 0;
constexpr int32_t kThinkEnd = 1;

// id 0: EOS (special), 1: "</think>" (special), 2..: short letter strings.
std::shared_ptr<structured::TokenVocab> toy_vocab() {
  auto v = std::make_shared<structured::TokenVocab>();
  v->token_bytes = {"<eos>", "</think>"};
  const char* pieces[] = {"a", "b", "c", "d", "x", "ab", "cd", "xx", "ba", "dc", "y", "z", "abc", "-", "--", "q"};
  for (int i = 2; i < 64; ++i) v->token_bytes.push_back(pieces[(i - 2) % 16] + std::string((i - 2) / 16, 'a'));
  v->special.assign(64, false);
  v->special[0] = v->special[1] = true;
  v->stop_ids = {kEos};
  v->mask_size = 64;
  v->build();
  return v;
}

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> final;
  std::map<std::string, std::vector<TokenLogprob>> logprobs;
  std::function<void(RequestOutput&&)> sink() {
    return [this](RequestOutput&& o) {
      std::lock_guard lk(mu);
      auto& t = tokens[o.request_id];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      auto& l = logprobs[o.request_id];
      l.insert(l.end(), o.logprobs.begin(), o.logprobs.end());
      if (o.finished) {
        final[o.request_id] = o;
        cv.notify_all();
      }
    };
  }
  bool wait(size_t n) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, 20s, [&] { return final.size() >= n; });
  }
};

std::string text_of(const structured::TokenVocab& v, const std::vector<int32_t>& ids, bool skip_reasoning) {
  std::string s;
  bool in_answer = !skip_reasoning;
  for (int32_t id : ids) {
    if (id == kThinkEnd) { in_answer = true; continue; }
    if (id == kEos) break;
    if (in_answer) s += v.token_bytes[id];
  }
  return s;
}

std::shared_ptr<structured::StructuredConstraint> constraint(const std::string& regex,
                                                             std::vector<int32_t> start_after = {}) {
  static auto vocab = toy_vocab();
  auto c = std::make_shared<structured::StructuredConstraint>();
  c->grammar = std::make_shared<structured::CompiledGrammar>(structured::grammar_from_regex(regex), vocab);
  c->start_after_tokens = std::move(start_after);
  return c;
}

// Returns (requests finished by EOS, total preemptions).
int exited = 0;  // requests that generated the reasoning-end token (reasoning runs)
std::pair<int, int> run_case(const ToyExecutorConfig& toy, int num_requests, bool reasoning,
                             const std::string& re = "(ab|cd)+-x{2,3}") {
  EngineConfig cfg{.max_num_seqs = 8, .max_num_batched_tokens = 64};
  cfg.eos_token_ids = {kEos};
  auto engine = make_engine(cfg, std::make_unique<ToyExecutor>(toy));
  Collector c;
  auto con = constraint(re, reasoning ? std::vector<int32_t>{kThinkEnd} : std::vector<int32_t>{});
  for (int i = 0; i < num_requests; ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    for (int k = 0; k < 12; ++k) r.prompt_ids.push_back((k * 7 + i * 3) % 64);
    r.params.temperature = i % 3 == 0 ? 0.0f : 1.0f;
    r.params.seed = 1000 + i;
    r.params.max_tokens = reasoning ? 120 : 40;
    r.params.logprobs = i % 2 ? 2 : -1;
    r.params.structured = con;
    r.on_output = c.sink();
    EXPECT_TRUE(engine->submit(std::move(r)));
  }
  EXPECT_TRUE(c.wait(num_requests));
  engine->shutdown(1s);
  auto vocab = toy_vocab();
  int stopped = 0, preemptions = 0;
  exited = 0;
  for (int i = 0; i < num_requests; ++i) {
    const std::string id = "r" + std::to_string(i);
    const auto& toks = c.tokens[id];
    const auto& fin = c.final[id];
    preemptions += fin.num_preemptions;
    std::string text = text_of(*vocab, toks, reasoning);
    if (reasoning && std::find(toks.begin(), toks.end(), kThinkEnd) == toks.end()) continue;  // never left reasoning
    if (reasoning) ++exited;
    if (fin.finish_reason == FinishReason::Stop) {
      ++stopped;
      EXPECT_EQ(toks.back(), kEos) << id;
      EXPECT_TRUE(std::regex_match(text, std::regex(re))) << id << ": " << text;
    } else {
      // Length: a valid prefix (the grammar accepted every token).
      auto cg = con->grammar;
      EXPECT_GE(cg->step_bytes(cg->initial_state(), text), 0) << id << ": " << text;
    }
    if (i % 2) {  // logprobs after masking: only allowed tokens in the top list while constrained
      EXPECT_EQ(c.logprobs[id].size(), toks.size());
    }
  }
  return {stopped, preemptions};
}

TEST(StructuredEngine, OutputsFollowTheGrammar) { EXPECT_GT(run_case(ToyExecutorConfig{.vocab_size = 64}, 12, false).first, 0); }

TEST(StructuredEngine, UnderPreemption) {
  // Outputs of at least 22 tokens (12-token prompts): ~9 blocks each of 20, so running
  // sequences must be preempted as they grow.
  auto [stopped, preempted] =
      run_case(ToyExecutorConfig{.vocab_size = 64, .max_model_len = 96, .block_size = 4, .num_kv_blocks = 20}, 10, false,
               "(ab|cd|a|b|c|d){20,30}-xx");
  EXPECT_GT(stopped, 0);
  EXPECT_GT(preempted, 0);
}

TEST(StructuredEngine, StartsAfterReasoningEnds) {
  run_case(ToyExecutorConfig{.vocab_size = 64, .peak = 0.5f}, 24, true);
  EXPECT_GT(exited, 0);  // and each of them followed the grammar after it (checked in run_case)
}

TEST(StructuredEngine, LogprobsAreAfterMasking) {
  EngineConfig cfg{.max_num_seqs = 4, .max_num_batched_tokens = 64};
  cfg.eos_token_ids = {kEos};
  auto engine = make_engine(cfg, std::make_unique<ToyExecutor>(ToyExecutorConfig{.vocab_size = 64}));
  Collector c;
  Request r;
  r.id = "lp";
  r.prompt_ids = {3, 4, 5, 6};
  r.params.temperature = 0.0f;
  r.params.max_tokens = 1;
  r.params.logprobs = 5;
  r.params.structured = constraint("x");  // only token "x" (id 6) can come first
  r.on_output = c.sink();
  ASSERT_TRUE(engine->submit(std::move(r)));
  ASSERT_TRUE(c.wait(1));
  engine->shutdown(1s);
  ASSERT_EQ(c.tokens["lp"], std::vector<int32_t>{6});
  ASSERT_EQ(c.logprobs["lp"].size(), 1u);
  EXPECT_NEAR(c.logprobs["lp"][0].logprob, 0.0f, 1e-6);  // the only allowed token has probability 1
}

// One constrained greedy request on the toy model; returns its collected outputs.
struct OneRun {
  std::vector<int32_t> tokens;
  RequestOutput final;
};
OneRun run_one(std::shared_ptr<structured::StructuredConstraint> con, int min_tokens, int max_tokens) {
  EngineConfig cfg{.max_num_seqs = 4, .max_num_batched_tokens = 64};
  cfg.eos_token_ids = {kEos};
  auto engine = make_engine(cfg, std::make_unique<ToyExecutor>(ToyExecutorConfig{.vocab_size = 64}));
  Collector c;
  Request r;
  r.id = "one";
  r.prompt_ids = {3, 4, 5, 6};
  r.params.temperature = 0.0f;
  r.params.min_tokens = min_tokens;
  r.params.max_tokens = max_tokens;
  r.params.structured = std::move(con);
  r.on_output = c.sink();
  EXPECT_TRUE(engine->submit(std::move(r)));
  EXPECT_TRUE(c.wait(1));
  engine->shutdown(1s);
  return {c.tokens["one"], c.final["one"]};
}

// A grammar that allows no token (complete, and the vocabulary knows no EOS) ends the request
// with finish_reason error and a message, deterministically, instead of going on unconstrained.
TEST(StructuredEngine, EmptyMaskFinishesWithError) {
  auto vocab = std::make_shared<structured::TokenVocab>(*toy_vocab());
  vocab->stop_ids.clear();
  vocab->build();
  auto con = std::make_shared<structured::StructuredConstraint>();
  con->grammar = std::make_shared<structured::CompiledGrammar>(structured::grammar_from_regex("x"), vocab);
  for (int rep = 0; rep < 2; ++rep) {
    OneRun o = run_one(con, 0, 10);
    EXPECT_EQ(o.tokens, std::vector<int32_t>{6});  // "x", then nothing is allowed
    EXPECT_EQ(o.final.finish_reason, FinishReason::Error);
    EXPECT_NE(o.final.error.find("grammar allows no next token"), std::string::npos) << o.final.error;
  }
}

// min_tokens beyond a complete grammar: the stop token is let through (vLLM), the request stops.
TEST(StructuredEngine, MinTokensGivesWayToACompleteGrammar) {
  OneRun o = run_one(constraint("x"), 5, 10);
  EXPECT_EQ(o.tokens, (std::vector<int32_t>{6, kEos}));
  EXPECT_EQ(o.final.finish_reason, FinishReason::Stop);
  // Below a grammar that can go on, min_tokens still holds EOS back.
  OneRun more = run_one(constraint("x+"), 4, 10);
  ASSERT_GE(more.tokens.size(), 4u);
  EXPECT_EQ(std::count(more.tokens.begin(), more.tokens.begin() + 4, kEos), 0);
}

// Masks made on a worker thread during the model step give the same outputs as masks made at
// sampling (greedy and seeded rows, a constraint after reasoning), and are really used.
TEST(StructuredEngine, MasksAheadOfTheStepGiveTheSameOutputs) {
  auto run = [](bool overlap) {
    EngineConfig cfg{.max_num_seqs = 8, .max_num_batched_tokens = 64};
    cfg.eos_token_ids = {kEos};
    cfg.overlap_structured_masks = overlap;
    auto engine = make_engine(cfg, std::make_unique<ToyExecutor>(ToyExecutorConfig{.vocab_size = 64, .peak = 0.5f}));
    Collector c;
    auto con = constraint("(ab|cd)+-x{2,3}");
    auto con_r = constraint("(ab|cd)+-x{2,3}", {kThinkEnd});
    for (int i = 0; i < 10; ++i) {
      Request r;
      r.id = "r" + std::to_string(i);
      for (int k = 0; k < 9; ++k) r.prompt_ids.push_back((k * 5 + i * 7) % 64);
      r.params.temperature = i % 2 ? 0.0f : 0.8f;
      r.params.seed = 77 + i;
      r.params.max_tokens = 60;
      r.params.structured = i % 3 == 2 ? con_r : con;
      r.on_output = c.sink();
      EXPECT_TRUE(engine->submit(std::move(r)));
    }
    EXPECT_TRUE(c.wait(10));
    engine->shutdown(1s);
    return c.tokens;
  };
  const uint64_t before = structured_masks_taken_ahead();
  auto off = run(false);
  EXPECT_EQ(structured_masks_taken_ahead(), before);
  auto on = run(true);
  EXPECT_GT(structured_masks_taken_ahead(), before);
  EXPECT_EQ(on, off);
  size_t total = 0;
  for (auto& [id, t] : on) total += t.size();
  EXPECT_GT(total, 50u);
}

}  // namespace
}  // namespace moeserve

namespace moeserve {
namespace {

// Speculative decoding (n-gram drafts) with grammars: each verified position is masked with the
// matcher advanced over the drafts accepted before it, so outputs equal speculation off token
// for token (greedy and seeded sampling, with and without a reasoning start).
TEST(StructuredEngine, SpeculativeDecodingGivesTheSameOutputs) {
  auto run = [](bool spec, uint64_t* drafts, bool adaptive = false) {
    EngineConfig cfg;
    cfg.max_num_seqs = 8;
    cfg.max_num_batched_tokens = 64;
    cfg.eos_token_ids = {kEos};
    if (spec) {
      cfg.speculative.method = SpecMethod::Ngram;
      cfg.speculative.num_speculative_tokens = 4;
      cfg.speculative.prompt_lookup_min = 1;
      cfg.speculative.prompt_lookup_max = 3;
      cfg.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
      if (adaptive) {  // k per step (fake clock: verifying is dear at 4+ sequences, free below)
        cfg.spec_policy = SpecPolicyOptions{};
        cfg.spec_policy.clock = [](SpecPhase ph, const SpecStepShape& shape, int k, double) {
          return ph == SpecPhase::Draft ? 0.0 : shape.num_seqs >= 4 ? 0.001 * (1 + 3 * k) : 0.001;
        };
      }
    }
    auto engine = make_engine(cfg, std::make_unique<ToyExecutor>(ToyExecutorConfig{.vocab_size = 64, .peak = 0.5f}));
    Collector c;
    auto con = constraint("(ab|cd)+-x{2,3}");
    auto con_r = constraint("(ab|cd)+-x{2,3}", {kThinkEnd});
    for (int i = 0; i < 10; ++i) {
      Request r;
      r.id = "r" + std::to_string(i);
      for (int k = 0; k < 9; ++k) r.prompt_ids.push_back((k * 5 + i * 7) % 64);
      r.params.temperature = i % 2 ? 0.0f : 0.8f;
      r.params.seed = 77 + i;
      r.params.max_tokens = 60;
      r.params.logprobs = i % 4 == 1 ? 2 : -1;
      r.params.structured = i % 3 == 2 ? con_r : con;
      r.on_output = c.sink();
      EXPECT_TRUE(engine->submit(std::move(r)));
    }
    EXPECT_TRUE(c.wait(10));
    *drafts = engine->stats().spec_num_draft_tokens;
    engine->shutdown(1s);
    return std::make_pair(c.tokens, c.logprobs.size());
  };
  uint64_t d_off = 0, d_on = 0, d_adaptive = 0;
  const auto off = run(false, &d_off), on = run(true, &d_on), adaptive = run(true, &d_adaptive, true);
  EXPECT_EQ(on, off);
  EXPECT_EQ(adaptive, off);
  EXPECT_EQ(d_off, 0u);
  EXPECT_GT(d_on, 20u);
  EXPECT_GT(d_adaptive, 0u);
}

}  // namespace
}  // namespace moeserve
