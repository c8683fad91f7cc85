// The per-row logits stages (allowed_token_ids, bad_words, logit_bias, min_tokens, penalties)
// with vLLM's semantics and order, and the sampler's totality: whatever the logits (NaN,
// +/-inf, everything masked, extreme finite values, extreme parameters) it returns a token of
// the row or throws SamplingError, never indexes an empty candidate set.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>

#include "engine/sampler.h"

namespace moeserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kMax = std::numeric_limits<float>::max();

std::unique_ptr<Sequence> make_seq(SamplingParams p, std::vector<int32_t> prompt = {0},
                                   std::vector<int32_t> output = {}) {
  auto req = std::make_shared<Request>();
  req->id = "r";
  req->prompt_ids = prompt;
  req->params = std::move(p);
  auto s = std::make_unique<Sequence>();
  s->request = req;
  s->tokens = prompt;
  s->num_prompt_tokens = static_cast<int>(prompt.size());
  for (int32_t t : output) {
    s->tokens.push_back(t);
    note_generated(*s, t);
  }
  s->sampler.rng.seed(7);
  return s;
}

// The row after every active stage, as sample_next builds it.
std::vector<float> processed(Sequence& s, std::vector<float> row, const std::vector<int32_t>* eos = nullptr) {
  SampleInput in{.logits = row, .eos_token_ids = eos};
  std::vector<float> work = row;
  for (const LogitsStage& st : logits_stages())
    if (st.active(s)) st.apply(work, s, in);
  return work;
}

TEST(LogitsStages, OrderIsVllms) {
  std::vector<std::string> names;
  for (const LogitsStage& st : logits_stages()) names.push_back(st.name);
  EXPECT_EQ(names, (std::vector<std::string>{"allowed_token_ids", "bad_words", "logit_bias", "min_tokens", "penalties",
                                      "thinking_budget"}));
}

TEST(LogitsStages, LogitBiasTurnsGreedy) {
  SamplingParams p{.temperature = 0};
  p.logit_bias = {{0, 100.f}, {2, -100.f}};
  auto s = make_seq(p);
  const std::vector<float> row = {1.f, 2.f, 3.f, 2.5f};
  EXPECT_EQ(processed(*s, row), (std::vector<float>{101.f, 2.f, -97.f, 2.5f}));
  EXPECT_EQ(sample_next(*s, {.logits = row}).token, 0);
  s->request = std::make_shared<Request>(Request{.id = "r", .prompt_ids = {0}, .params = SamplingParams{.temperature = 0}});
  EXPECT_EQ(sample_next(*s, {.logits = row}).token, 2);  // without the bias
  // Ids outside the row are ignored by the stage (the server rejects them first).
  apply_logit_bias(std::span<float>(), std::vector<std::pair<int32_t, float>>{{5, 1.f}});
}

// vLLM applies logit_bias before the penalties: a biased positive logit is then divided.
TEST(LogitsStages, BiasBeforeRepetitionPenalty) {
  SamplingParams p{.repetition_penalty = 2.f};
  p.logit_bias = {{1, 1.f}};
  auto s = make_seq(p, /*prompt=*/{1});
  EXPECT_EQ(processed(*s, {0.f, 1.f, 4.f}), (std::vector<float>{0.f, 1.f, 4.f}));  // (1 + 1) / 2
  p.logit_bias = {{1, -3.f}};
  s = make_seq(p, {1});
  EXPECT_EQ(processed(*s, {0.f, 1.f, 4.f}), (std::vector<float>{0.f, -4.f, 4.f}));  // (1 - 3) * 2
}

TEST(LogitsStages, AllowedTokenIdsRestrictEveryDraw) {
  SamplingParams p{.temperature = 1.5f};
  p.allowed_token_ids = {1, 3, 99};  // 99 is outside the row: ignored
  auto s = make_seq(p);
  const std::vector<float> row = {5.f, 0.f, 6.f, 0.5f, 4.f};
  const auto w = processed(*s, row);
  EXPECT_EQ(w[1], 0.f);
  EXPECT_EQ(w[3], 0.5f);
  EXPECT_EQ(w[0], -kInf);
  EXPECT_EQ(w[2], -kInf);
  std::set<int32_t> seen;
  for (int i = 0; i < 200; ++i) seen.insert(sample_next(*s, {.logits = row}).token);
  EXPECT_EQ(seen, (std::set<int32_t>{1, 3}));
}

TEST(LogitsStages, BadWordsMaskLastTokenAfterTheirPrefix) {
  SamplingParams p{.temperature = 0};
  p.bad_words_token_ids = {{4}, {2, 3}};
  const std::vector<float> row = {0.f, 1.f, 2.f, 9.f, 8.f};
  // No output yet: the one-token word is masked, the two-token word's prefix is absent.
  auto s = make_seq(p, {2});  // the prompt does not count: vLLM matches output tokens only
  EXPECT_EQ(processed(*s, row), (std::vector<float>{0.f, 1.f, 2.f, 9.f, -kInf}));
  EXPECT_EQ(sample_next(*s, {.logits = row}).token, 3);
  s = make_seq(p, {0}, {1, 2});  // output ends with 2: token 3 may not follow
  EXPECT_EQ(processed(*s, row), (std::vector<float>{0.f, 1.f, 2.f, -kInf, -kInf}));
  EXPECT_EQ(sample_next(*s, {.logits = row}).token, 2);
  s = make_seq(p, {0}, {2, 1});
  EXPECT_EQ(sample_next(*s, {.logits = row}).token, 3);
}

TEST(LogitsStages, MinTokensMasksEosAndStopIdsUntilReached) {
  SamplingParams p{.temperature = 0, .min_tokens = 2, .stop_token_ids = {1}};
  const std::vector<int32_t> eos = {3};
  const std::vector<float> row = {0.f, 5.f, 1.f, 9.f};
  auto s = make_seq(p, {0}, {2});
  EXPECT_EQ(sample_next(*s, {.logits = row, .eos_token_ids = &eos}).token, 2);
  s = make_seq(p, {0}, {2, 2});
  EXPECT_EQ(sample_next(*s, {.logits = row, .eos_token_ids = &eos}).token, 3);
}

// thinking_token_budget: with <think> = 5 and </think> = 6, a prompt that ends inside the
// section counts from the first generated token; once `max_tokens` tokens are inside, the
// end token is the only choice (whatever the other stages did), then sampling is free again.
TEST(LogitsStages, ThinkingBudgetForcesTheEndOfTheReasoningSection) {
  SamplingParams p{.temperature = 0};
  p.thinking = {.max_tokens = 2, .start_token = 5, .end_token = 6};
  p.logit_bias = {{6, -100.f}};  // even a strongly disfavoured end token is forced
  const std::vector<float> row = {1.f, 9.f, 3.f, 2.f, 0.f, 0.f, -5.f};
  auto s = make_seq(p, /*prompt=*/{0, 5});  // the template opened the section
  EXPECT_EQ(sample_next(*s, {.logits = row}).token, 1);
  EXPECT_FALSE(device_sampling_params(*s).has_value());  // logit_bias: a host row anyway
  for (int32_t t : {1, 1}) {
    s->tokens.push_back(t);
    note_generated(*s, t);
  }
  EXPECT_EQ(s->sampler.thinking.count, 2);
  EXPECT_EQ(sample_next(*s, {.logits = row}).token, 6);
  s->tokens.push_back(6);
  note_generated(*s, 6);
  EXPECT_FALSE(s->sampler.thinking.inside);
  EXPECT_EQ(sample_next(*s, {.logits = row}).token, 1);  // after the section: free

  // Budget 0 closes a section the prompt opened at once; a prompt whose section is already
  // closed (enable_thinking false templates) is never forced; a section the model opens
  // itself is counted from its start token.
  SamplingParams z{.temperature = 0};
  z.thinking = {.max_tokens = 0, .start_token = 5, .end_token = 6};
  EXPECT_EQ(sample_next(*make_seq(z, {0, 5}), {.logits = row}).token, 6);
  EXPECT_EQ(sample_next(*make_seq(z, {0, 5, 6}), {.logits = row}).token, 1);
  auto own = make_seq(z, {0}, /*output=*/{2});
  EXPECT_EQ(sample_next(*own, {.logits = row}).token, 1);
  own->tokens.push_back(5);
  note_generated(*own, 5);
  EXPECT_EQ(sample_next(*own, {.logits = row}).token, 6);
  // Without a budget the stage is never active, and a device row stays on the device.
  SamplingParams none{.temperature = 0};
  none.thinking = {.max_tokens = -1, .start_token = 5, .end_token = 6};
  auto free_seq = make_seq(none, {0, 5});
  EXPECT_FALSE(needs_logits_processing(*free_seq));
  EXPECT_TRUE(device_sampling_params(*free_seq).has_value());
  // A spent budget sends the row to the host sampler (the device kernel has no forcing).
  z.logit_bias.clear();
  EXPECT_FALSE(device_sampling_params(*make_seq(z, {0, 5})).has_value());
}

TEST(LogitsStages, EveryFeatureKeepsTheRowOffTheDevice) {
  auto on_device = [](SamplingParams p) { return device_sampling_params(*make_seq(std::move(p))).has_value(); };
  EXPECT_TRUE(on_device(SamplingParams{}));
  SamplingParams a, b, c;
  a.logit_bias = {{1, 0.5f}};
  b.allowed_token_ids = {1};
  c.bad_words_token_ids = {{1, 2}};
  EXPECT_FALSE(on_device(a));
  EXPECT_FALSE(on_device(b));
  EXPECT_FALSE(on_device(c));
  EXPECT_FALSE(on_device(SamplingParams{.presence_penalty = 1.f}));
  EXPECT_FALSE(on_device(SamplingParams{.repetition_penalty = 1.2f}));
}

// Every sampling mode on a row: greedy, plain temperature, top-k, top-p, min-p, all at once.
std::vector<SamplingParams> modes() {
  return {SamplingParams{.temperature = 0},
          SamplingParams{.temperature = 1.f},
          SamplingParams{.temperature = 0.7f, .top_k = 2},
          SamplingParams{.temperature = 0.7f, .top_p = 0.5f},
          SamplingParams{.temperature = 0.7f, .min_p = 0.9f},
          SamplingParams{.temperature = 1e30f, .top_p = 0.3f, .top_k = 3, .min_p = 1.f},
          SamplingParams{.temperature = 0.01f, .top_p = 1e-30f, .top_k = 1 << 30}};
}

TEST(SamplerTotality, NonFiniteMaximumThrowsInEveryMode) {
  const float nan = std::nanf("");
  const std::vector<std::vector<float>> rows = {
      {},  // an empty row
      {-kInf, -kInf, -kInf},
      {nan, nan, nan},
      {nan, -kInf, nan},
      {1.f, kInf, 2.f},
      {kInf, kInf, -kInf},
      {nan, kInf, 0.f},
  };
  for (const SamplingParams& p : modes())
    for (const auto& row : rows) {
      std::mt19937_64 rng(1);
      EXPECT_THROW(sample_token(row, p, rng), SamplingError) << "T " << p.temperature << " row size " << row.size();
      EXPECT_THROW(filter_candidates(row, p), SamplingError);
      auto s = make_seq(p);
      EXPECT_THROW(sample_next(*s, {.logits = row}), SamplingError);
    }
  EXPECT_THROW(draw(Candidates{}, 0.5), SamplingError);
}

TEST(SamplerTotality, MaskedOrNanEntriesNeverSampled) {
  const float nan = std::nanf("");
  const std::vector<float> row = {nan, -kInf, 0.5f, nan, -kInf, 0.25f, nan};
  for (const SamplingParams& p : modes()) {
    std::mt19937_64 rng(3);
    for (int i = 0; i < 50; ++i) {
      const int32_t t = sample_token(row, p, rng);
      EXPECT_TRUE(t == 2 || t == 5) << t << " at T " << p.temperature;
    }
  }
}

TEST(SamplerTotality, ExtremeFiniteLogitsAndParameters) {
  const std::vector<float> row = {-kMax, kMax, kMax * 0.5f, -1e-38f, kMax};
  for (const SamplingParams& p : modes()) {
    std::mt19937_64 rng(5);
    for (int i = 0; i < 20; ++i) {
      const int32_t t = sample_token(row, p, rng);
      EXPECT_TRUE(t >= 0 && t < int32_t(row.size())) << t;
      if (p.temperature < 1e3f) EXPECT_TRUE(t == 1 || t == 4) << t << " at T " << p.temperature;
    }
  }
  // Logprobs of a row with +inf entries are the limit (all mass on them), never NaN.
  const auto lp = log_softmax(std::vector<float>{kInf, 0.f, kInf});
  EXPECT_FLOAT_EQ(lp[0], -std::log(2.f));
  EXPECT_EQ(lp[1], -kInf);
}

// The crash of issue 25: a tiny repetition penalty divides a positive logit into +inf. The
// server bounds the penalty now; the sampler fails such a row cleanly even without it.
TEST(SamplerTotality, PenaltyOverflowFailsTheRowNotTheProcess) {
  auto s = make_seq(SamplingParams{.temperature = 1.f, .repetition_penalty = 1e-38f}, {1});
  const std::vector<float> row = {0.5f, 30.f, -2.f};  // 30 / 1e-38 = +inf
  EXPECT_THROW(sample_next(*s, {.logits = row}), SamplingError);
  s = make_seq(SamplingParams{.temperature = 0, .repetition_penalty = 1e-38f}, {1});
  EXPECT_THROW(sample_next(*s, {.logits = row}), SamplingError);
  // In the server's range the same row samples.
  s = make_seq(SamplingParams{.temperature = 1.f, .repetition_penalty = 1e-3f}, {1});
  EXPECT_EQ(sample_next(*s, {.logits = row}).token, 1);
}

TEST(SamplerTotality, AllMaskedByProcessorsThrows) {
  SamplingParams p{.temperature = 0.9f};
  p.allowed_token_ids = {1};
  p.bad_words_token_ids = {{1}};
  auto s = make_seq(p);
  try {
    sample_next(*s, {.logits = std::vector<float>{1.f, 2.f, 3.f}});
    FAIL() << "no throw";
  } catch (const SamplingError& e) {
    EXPECT_NE(std::string(e.what()).find("no token can be sampled"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moeserve
