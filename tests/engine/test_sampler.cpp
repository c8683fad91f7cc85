#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "engine/sampler.h"

namespace moeserve {
namespace {

std::unique_ptr<Sequence> make_seq(SamplingParams p, std::vector<int32_t> prompt = {0}, uint64_t seed = 1) {
  auto req = std::make_shared<Request>();
  req->id = "r";
  req->prompt_ids = prompt;
  req->params = p;
  auto s = std::make_unique<Sequence>();
  s->request = req;
  s->tokens = prompt;
  s->num_prompt_tokens = static_cast<int>(prompt.size());
  s->sampler.rng.seed(p.seed.value_or(seed));
  return s;
}

std::vector<float> log_probs(std::vector<double> p) {
  std::vector<float> l;
  for (double x : p) l.push_back(float(std::log(x)));
  return l;
}

std::set<int32_t> ids_of(const Candidates& c) { return {c.ids.begin(), c.ids.end()}; }

TEST(Sampler, GreedyTiesBreakToLowestId) {
  std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 2.0f};
  EXPECT_EQ(argmax_lowest(l), 1);
  l[0] = std::nanf("");
  EXPECT_EQ(argmax_lowest(l), 1);
  SamplingParams p;
  p.temperature = 0;
  auto s = make_seq(p);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(sample_next(*s, {.logits = l}).token, 1);
}

TEST(Sampler, TopKKeepsKLargestAndBoundaryTies) {
  SamplingParams p;
  p.top_k = 2;
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 0.0f};
  EXPECT_EQ(ids_of(filter_candidates(l, p)), (std::set<int32_t>{1, 2}));
  l = {2.0f, 3.0f, 2.0f, 0.0f};  // tie at the k-th value
  EXPECT_EQ(ids_of(filter_candidates(l, p)), (std::set<int32_t>{0, 1, 2}));
  p.top_k = -1;
  EXPECT_EQ(filter_candidates(l, p).ids.size(), 4u);
}

TEST(Sampler, TopPKeepsSmallestHeadReachingP) {
  SamplingParams p;
  auto l = log_probs({0.15, 0.5, 0.05, 0.3});
  p.top_p = 0.4f;
  EXPECT_EQ(ids_of(filter_candidates(l, p)), (std::set<int32_t>{1}));
  p.top_p = 0.75f;
  EXPECT_EQ(ids_of(filter_candidates(l, p)), (std::set<int32_t>{1, 3}));
  p.top_p = 0.81f;
  Candidates c = filter_candidates(l, p);
  EXPECT_EQ(ids_of(c), (std::set<int32_t>{0, 1, 3}));
  double sum = 0;
  for (double q : c.probs) sum += q;
  EXPECT_NEAR(sum, 1.0, 1e-9);
  EXPECT_NEAR(c.probs[1], 0.5 / 0.95, 1e-6);  // ids sorted: 0, 1, 3
}

TEST(Sampler, TopPOnLargeVocabularyMatchesFullSort) {
  // More candidates than the first partial-sort window (256).
  std::vector<float> l(5000);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float((i * 7919) % 1000) / 1000.0f;
  SamplingParams p;
  p.top_p = 0.9f;
  Candidates c = filter_candidates(l, p);
  std::vector<double> probs(l.size());
  double z = 0;
  for (size_t i = 0; i < l.size(); ++i) z += probs[i] = std::exp(double(l[i]));
  std::vector<int32_t> order(l.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b] || (probs[a] == probs[b] && a < b); });
  double above = 0;
  size_t keep = 0;
  while (keep < order.size() && above < 0.9) above += probs[order[keep++]] / z;
  EXPECT_GT(keep, 256u);
  EXPECT_EQ(c.ids.size(), keep);
}

TEST(Sampler, MinPDropsBelowFractionOfMax) {
  SamplingParams p;
  p.min_p = 0.2f;  // threshold 0.2 * 0.5 = 0.1
  EXPECT_EQ(ids_of(filter_candidates(log_probs({0.15, 0.5, 0.05, 0.3}), p)), (std::set<int32_t>{0, 1, 3}));
}

TEST(Sampler, PenaltiesFollowVllmDefinitions) {
  SamplingParams p;
  p.repetition_penalty = 2.0f;
  p.presence_penalty = 0.5f;
  p.frequency_penalty = 0.25f;
  std::vector<float> l = {4.0f, -4.0f, 4.0f, 4.0f, 4.0f};
  std::vector<int32_t> prompt_set = {0, 1};
  std::unordered_map<int32_t, int> counts = {{0, 1}, {2, 3}};
  apply_penalties(l, p, prompt_set, counts);
  EXPECT_FLOAT_EQ(l[0], 4.0f / 2 - 0.5f - 0.25f);  // prompt and output: repetition once
  EXPECT_FLOAT_EQ(l[1], -8.0f);                    // prompt only: negative logit multiplied
  EXPECT_FLOAT_EQ(l[2], 2.0f - 0.5f - 0.75f);      // output x3
  EXPECT_FLOAT_EQ(l[3], 4.0f);                     // never seen
}

TEST(Sampler, EmpiricalDistributionMatchesWithFixedSeed) {
  struct Case {
    float temperature;
    int top_k;
    std::vector<double> expect;
  };
  const std::vector<double> base = {0.1, 0.2, 0.3, 0.4};
  std::vector<Case> cases = {
      {1.0f, 0, base},
      {0.5f, 0, {1 / 30.0, 4 / 30.0, 9 / 30.0, 16 / 30.0}},  // p^2 renormalised
      {1.0f, 2, {0, 0, 3 / 7.0, 4 / 7.0}},
  };
  for (const auto& cs : cases) {
    SamplingParams p;
    p.temperature = cs.temperature;
    p.top_k = cs.top_k;
    p.seed = 1234;
    auto s = make_seq(p);
    auto l = log_probs(base);
    const int n = 40000;
    std::vector<int> hist(4);
    for (int i = 0; i < n; ++i) ++hist[sample_next(*s, {.logits = l}).token];
    for (int v = 0; v < 4; ++v) EXPECT_NEAR(hist[v] / double(n), cs.expect[v], 0.01) << "T=" << cs.temperature << " v=" << v;
  }
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDiffers) {
  auto run = [](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    p.top_p = 0.95f;
    auto s = make_seq(p);
    std::vector<int32_t> out;
    std::vector<float> l(50);
    for (int i = 0; i < 64; ++i) {
      for (int v = 0; v < 50; ++v) l[v] = float(((v + 3) * (i + 11)) % 17) / 4.0f;
      out.push_back(sample_next(*s, {.logits = l}).token);
    }
    return out;
  };
  EXPECT_EQ(run(7), run(7));
  EXPECT_NE(run(7), run(8));
}

TEST(Sampler, LogprobsAreRawAndNormalised) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 3.0f;  // changes the choice, not the reported logprobs
  p.logprobs = 6;
  auto s = make_seq(p, {2});
  std::vector<float> l = {0.1f, -2.0f, 3.0f, 2.9f, 0.0f, 1.0f};
  SampleResult r = sample_next(*s, {.logits = l});
  EXPECT_EQ(r.token, 3) << "token 2 is penalised (prompt)";
  ASSERT_TRUE(r.has_logprobs);
  auto lsm = log_softmax(l);
  EXPECT_FLOAT_EQ(r.logprob.logprob, lsm[3]);
  ASSERT_EQ(r.logprob.top.size(), 6u);
  double sum = 0;
  for (size_t i = 0; i < r.logprob.top.size(); ++i) {
    sum += std::exp(double(r.logprob.top[i].second));
    if (i) EXPECT_GE(r.logprob.top[i - 1].second, r.logprob.top[i].second);
  }
  EXPECT_NEAR(sum, 1.0, 1e-5);
  EXPECT_EQ(r.logprob.top[0].first, 2);
  p.logprobs = 0;
  auto s0 = make_seq(p, {2});
  SampleResult r0 = sample_next(*s0, {.logits = l});
  EXPECT_TRUE(r0.has_logprobs);
  EXPECT_TRUE(r0.logprob.top.empty());
}

TEST(Sampler, MinTokensMasksEosAndStopIds) {
  SamplingParams p;
  p.temperature = 0;
  p.min_tokens = 2;
  p.stop_token_ids = {3};
  auto s = make_seq(p);
  std::vector<int32_t> eos = {1};
  std::vector<float> l = {0.0f, 9.0f, 1.0f, 8.0f};
  EXPECT_EQ(sample_next(*s, {.logits = l, .eos_token_ids = &eos}).token, 2);
  s->tokens.push_back(2);
  s->tokens.push_back(2);
  EXPECT_EQ(sample_next(*s, {.logits = l, .eos_token_ids = &eos}).token, 1) << "min_tokens reached";
}

TEST(Sampler, LowTemperatureIsGreedy) {
  SamplingParams p;
  p.temperature = 1e-6f;
  auto s = make_seq(p);
  std::vector<float> l = {1.0f, 1.0f, 0.5f};
  EXPECT_EQ(sample_next(*s, {.logits = l}).token, 0);
}

// sample_token (the fast path) must draw from exactly the distribution filter_candidates
// gives. A low tail_cut puts most of the vocabulary in the "tail", so the bound slot, the
// exact tail walk and the redraw are all exercised, as well as the top_p ambiguity fallback.
void expect_same_distribution(const std::vector<float>& l, const SamplingParams& p, double tail_cut, uint64_t seed) {
  const Candidates c = filter_candidates(l, p);
  std::vector<double> expect(l.size(), 0.0);
  for (size_t i = 0; i < c.ids.size(); ++i) expect[c.ids[i]] = c.probs[i];
  std::mt19937_64 rng(seed);
  const int n = 30000;
  std::vector<int> hist(l.size());
  for (int i = 0; i < n; ++i) ++hist[sample_token(l, p, rng, tail_cut)];
  for (size_t v = 0; v < l.size(); ++v) {
    const double sd = std::sqrt(expect[v] * (1 - expect[v]) / n);
    EXPECT_NEAR(hist[v] / double(n), expect[v], 5 * sd + 1e-4)
        << "id " << v << " T=" << p.temperature << " top_k=" << p.top_k << " top_p=" << p.top_p
        << " min_p=" << p.min_p << " cut=" << tail_cut;
    if (expect[v] == 0) EXPECT_EQ(hist[v], 0) << "id " << v << " is filtered out";
  }
}

TEST(Sampler, FastPathDrawsTheFilteredDistribution) {
  // 48 logits in [-6, 3], a few ties, one -inf and one NaN.
  std::vector<float> l(48);
  for (size_t i = 0; i < l.size(); ++i) l[i] = float(int((i * 37) % 19) - 12) / 2.0f;
  l[5] = -std::numeric_limits<float>::infinity();
  l[9] = std::nanf("");
  struct P {
    float t, top_p, min_p;
    int top_k;
  };
  const std::vector<P> params = {{1.0f, 1.0f, 0, 0},    {0.7f, 1.0f, 0, 0},  {1.0f, 0.9f, 0, 0}, {1.0f, 0.5f, 0, 0},
                                 {1.3f, 1.0f, 0, 3},    {1.0f, 0.8f, 0, 10}, {1.0f, 1.0f, 0.05f, 0},
                                 {2.0f, 0.95f, 0.01f, 20}};
  uint64_t seed = 11;
  for (const P& q : params) {
    SamplingParams p;
    p.temperature = q.t;
    p.top_p = q.top_p;
    p.min_p = q.min_p;
    p.top_k = q.top_k;
    for (double cut : {0.5, 2.0, 5.0, kSamplerTailCut}) expect_same_distribution(l, p, cut, ++seed);
  }
}

TEST(Sampler, FastPathTailHeavierThanHead) {
  // One id at 0 and 600 at -3: with a cut of 2 the tail (mass 600 e^-3 = 29.9) outweighs the
  // head (1), and the bound (600 e^-2 = 81.2) is loose, so the redraw path runs often.
  std::vector<float> l(601, -3.0f);
  l[300] = 0.0f;
  SamplingParams p;
  const Candidates c = filter_candidates(l, p);
  std::mt19937_64 rng(5);
  const int n = 40000;
  int head = 0;
  std::set<int32_t> seen;
  for (int i = 0; i < n; ++i) {
    const int32_t t = sample_token(l, p, rng, 2.0);
    head += t == 300;
    seen.insert(t);
  }
  const double expect = c.probs[300];  // 1 / (1 + 600 e^-3)
  EXPECT_NEAR(head / double(n), expect, 5 * std::sqrt(expect * (1 - expect) / n));
  EXPECT_GT(seen.size(), 550u) << "tail ids are drawn";
}

TEST(Sampler, LargePeakedVocabularyPicksThePeak) {
  // The replay backend's rows at MiniMax-M2's vocabulary: one id at 30, the rest 0. Every
  // other id has probability e^-30 relative, so a draw is the peak (chance of another id
  // over these draws < 1e-5). With top_k 40 the 200k tied zeros are all kept (boundary ties),
  // which takes the exact full path.
  std::vector<float> l(200064, 0.0f);
  SamplingParams p;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 60; ++i) {
    const int32_t peak = (i * 7919) % 200064;
    l[peak] = 30.0f;
    EXPECT_EQ(sample_token(l, p, rng), peak);
    p.top_p = i % 2 ? 0.95f : 1.0f;
    p.top_k = i % 3 ? 40 : 0;
    l[peak] = 0.0f;
  }
}

TEST(Sampler, GreedyOnBlocksWithNanAndTail) {
  std::vector<float> l(1000, -1.0f);
  l[17] = std::nanf("");
  l[999] = 4.0f;
  l[640] = 4.0f;
  EXPECT_EQ(argmax_lowest(l), 640);
  std::vector<float> all_nan(33, std::nanf(""));
  EXPECT_EQ(argmax_lowest(all_nan), 0);
}

}  // namespace
}  // namespace moeserve
