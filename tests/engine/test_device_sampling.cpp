// Device sampling through the engine: which rows the engine asks the executor to sample
// (ExecutorInfo::device_sampling + SequenceStep::device_sample), that it uses the returned
// ids, and that only host rows' logits come back. The "device" is a wrapper around the
// ToyExecutor that samples device rows itself (greedy = argmax, otherwise the host chain with
// an RNG seeded by the row's per-step seed), so results are checkable on the CPU.
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <set>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/testing/toy_executor.h"

namespace moeserve {
namespace {

using namespace std::chrono_literals;
using testing::ToyExecutor;
using testing::ToyExecutorConfig;

const ToyExecutorConfig kToy{.vocab_size = 64, .max_model_len = 96, .block_size = 4, .num_kv_blocks = 96};

struct RowLog {
  int64_t seq_id;
  bool device;
};

class DeviceSamplingToy final : public ModelExecutor {
 public:
  DeviceSamplingToy(ToyExecutorConfig c, bool advertise, bool corrupt = false)
      : toy_(c), advertise_(advertise), corrupt_(corrupt) {}
  // Rows of this seq_id come back with every logit set to `v` (NaN, -inf, +inf), on the
  // device and the host path alike: a model fault the samplers must survive.
  void poison(int64_t seq_id, float v) { poison_seq_ = seq_id, poison_value_ = v; }
  ExecutorInfo info() const override {
    ExecutorInfo i = toy_.info();
    i.device_sampling = advertise_;
    return i;
  }
  StepResult execute(const StepBatch& batch) override {
    StepBatch plain = batch;
    for (auto& s : plain.seqs) s.device_sample.reset();
    StepResult all = toy_.execute(plain);  // every row's logits, as the device would hold them
    const size_t V = size_t(all.vocab_size);
    StepResult res;
    res.vocab_size = all.vocab_size;
    size_t r = 0;
    std::lock_guard lk(mu_);
    for (const auto& s : batch.seqs) {
      if (!s.need_logits) {
        EXPECT_FALSE(s.device_sample) << "device_sample on a row without logits";
        continue;
      }
      std::span<float> row(all.logits.data() + r * V, V);
      ++r;
      if (s.seq_id == poison_seq_) std::fill(row.begin(), row.end(), poison_value_);
      log_.push_back({s.seq_id, s.device_sample.has_value()});
      if (s.device_sample) {
        EXPECT_TRUE(advertise_) << "device_sample sent to an executor without device sampling";
        res.sampled_ids.push_back(corrupt_ ? int32_t(V) : device_sample(row, *s.device_sample));
      } else {
        res.logits.insert(res.logits.end(), row.begin(), row.end());
        ++host_rows_returned_;
      }
    }
    return res;
  }
  // As k_sample.cu: a row without a finite maximum gives kDeviceNoCandidate / kDeviceInfLogit.
  static int32_t device_sample(std::span<const float> row, const DeviceSampling& d) {
    float mx = -std::numeric_limits<float>::infinity();
    for (float x : row) mx = x > mx ? x : mx;  // NaN compares false
    if (!std::isfinite(mx)) return mx > 0 ? kDeviceInfLogit : kDeviceNoCandidate;
    if (d.temperature <= 0) return argmax_lowest(row);
    SamplingParams p;
    p.temperature = d.temperature;
    p.top_k = d.top_k;
    p.top_p = d.top_p;
    std::mt19937_64 rng(d.seed);
    return sample_token(row, p, rng);
  }
  std::vector<RowLog> log() const {
    std::lock_guard lk(mu_);
    return log_;
  }
  int host_rows_returned() const {
    std::lock_guard lk(mu_);
    return host_rows_returned_;
  }

 private:
  ToyExecutor toy_;
  bool advertise_, corrupt_;
  int64_t poison_seq_ = -1;
  float poison_value_ = 0;
  mutable std::mutex mu_;
  std::vector<RowLog> log_;
  int host_rows_returned_ = 0;
};

struct Collector {
  std::mutex mu;
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> final;
  std::map<std::string, int> logprob_entries;
  std::function<void(RequestOutput&&)> sink() {
    return [this](RequestOutput&& o) {
      std::lock_guard lk(mu);
      auto& t = tokens[o.request_id];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      logprob_entries[o.request_id] += int(o.logprobs.size());
      if (o.finished) final[o.request_id] = o;
    };
  }
};

std::vector<int32_t> prompt_of(int n, int salt) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 7 + salt * 13 + 5) % 64;
  return p;
}

void submit(Engine& e, Collector& c, const std::string& id, std::vector<int32_t> prompt, SamplingParams p) {
  Request r;
  r.id = id;
  r.prompt_ids = std::move(prompt);
  r.params = p;
  r.on_output = c.sink();
  ASSERT_TRUE(e.submit(std::move(r)));
}

TEST(DeviceSamplingParams, HostFeaturesStayOnTheHost) {
  auto dev = [](SamplingParams p, int generated = 0) {
    auto req = std::make_shared<Request>();
    req->params = p;
    req->prompt_ids = {1, 2, 3};
    Sequence s;
    s.request = req;
    s.tokens = req->prompt_ids;
    s.num_prompt_tokens = 3;
    for (int i = 0; i < generated; ++i) s.tokens.push_back(4);
    return device_sampling_params(s);
  };
  auto d = dev(SamplingParams{.temperature = 0.7f, .top_p = 0.9f, .top_k = 40, .seed = 5});
  ASSERT_TRUE(d);
  EXPECT_FLOAT_EQ(d->temperature, 0.7f);
  EXPECT_FLOAT_EQ(d->top_p, 0.9f);
  EXPECT_EQ(d->top_k, 40);
  d = dev(SamplingParams{.temperature = 5e-6f, .top_k = -1});  // below kSamplingEps: greedy, as on the host
  ASSERT_TRUE(d);
  EXPECT_EQ(d->temperature, 0.f);
  EXPECT_EQ(d->top_k, 0);
  EXPECT_FALSE(dev(SamplingParams{.min_p = 0.1f}));
  EXPECT_FALSE(dev(SamplingParams{.presence_penalty = 0.5f}));
  EXPECT_FALSE(dev(SamplingParams{.frequency_penalty = -0.5f}));
  EXPECT_FALSE(dev(SamplingParams{.repetition_penalty = 1.1f}));
  EXPECT_FALSE(dev(SamplingParams{.logprobs = 0}));
  EXPECT_FALSE(dev(SamplingParams{.min_tokens = 2}, 1));  // EOS still masked
  EXPECT_TRUE(dev(SamplingParams{.min_tokens = 2}, 2));   // mask no longer applies
  // The vLLM logits processors run on the host: the device path gives the host's tokens.
  EXPECT_FALSE(dev(SamplingParams{.logit_bias = {{3, 100.f}}}));
  EXPECT_FALSE(dev(SamplingParams{.allowed_token_ids = {1, 2}}));
  EXPECT_FALSE(dev(SamplingParams{.bad_words_token_ids = {{7}}}));
}

// A row without a finite maximum fails that request alone, with the same message on the
// device path (the kernel's -1 / -2) and on the host path (SamplingError); the engine and
// the other request go on.
TEST(DeviceSamplingEngine, NonFiniteRowFailsOnlyItsRequestOnBothPaths) {
  const float kInf = std::numeric_limits<float>::infinity();
  for (float poison : {std::nanf(""), -kInf, kInf}) {
    std::map<bool, std::string> errors;
    for (bool device : {true, false}) {
      auto exec = std::make_unique<DeviceSamplingToy>(kToy, true);
      exec->poison(1, poison);  // the first submitted request is seq 1
      EngineConfig cfg{.max_num_seqs = 4, .device_sampling = device};
      auto engine = make_engine(cfg, std::move(exec));
      Collector c;
      submit(*engine, c, "bad", prompt_of(5, 1), SamplingParams{.temperature = 0.8f, .seed = 3, .max_tokens = 4});
      submit(*engine, c, "good", prompt_of(6, 2), SamplingParams{.temperature = 0, .max_tokens = 6});
      engine->shutdown(10s);
      ASSERT_TRUE(c.final.count("bad") && c.final.count("good"));
      EXPECT_EQ(c.final["bad"].finish_reason, FinishReason::Error) << poison;
      EXPECT_TRUE(c.tokens["bad"].empty());
      EXPECT_EQ(c.final["good"].finish_reason, FinishReason::Length);
      EXPECT_EQ(c.tokens["good"], ToyExecutor::reference_greedy(kToy, prompt_of(6, 2), 6));
      errors[device] = c.final["bad"].error;
    }
    EXPECT_EQ(errors[true], errors[false]);
    EXPECT_NE(errors[true].find(poison > 0 ? "+inf" : "-inf or NaN"), std::string::npos) << errors[true];
  }
}

// Everything masked by the request's own processors (allowed_token_ids {5} and bad word 5)
// is a clear per-request error, not a crash or a silent token.
TEST(DeviceSamplingEngine, AllMaskedByTheRequestFailsIt) {
  auto engine = make_engine({}, std::make_unique<DeviceSamplingToy>(kToy, true));
  Collector c;
  SamplingParams p{.temperature = 0, .max_tokens = 3};
  p.allowed_token_ids = {5};
  p.bad_words_token_ids = {{5}};
  submit(*engine, c, "masked", prompt_of(4, 3), p);
  SamplingParams q{.temperature = 0, .max_tokens = 3};
  q.allowed_token_ids = {5, 9};
  submit(*engine, c, "allowed", prompt_of(4, 3), q);
  engine->shutdown(10s);
  EXPECT_EQ(c.final["masked"].finish_reason, FinishReason::Error);
  EXPECT_NE(c.final["masked"].error.find("no token can be sampled"), std::string::npos) << c.final["masked"].error;
  ASSERT_EQ(c.tokens["allowed"].size(), 3u);
  for (int32_t t : c.tokens["allowed"]) EXPECT_TRUE(t == 5 || t == 9) << t;
}

TEST(DeviceSamplingEngine, RoutesRowsAndUsesReturnedIds) {
  auto exec = std::make_unique<DeviceSamplingToy>(kToy, true);
  DeviceSamplingToy* ex = exec.get();
  EngineConfig cfg{.max_num_seqs = 16, .max_num_batched_tokens = 64, .eos_token_ids = {63}};
  auto engine = make_engine(cfg, std::move(exec));
  Collector c;
  const int kTokens = 6;
  auto base = [&] {
    SamplingParams p;
    p.temperature = 0;
    p.max_tokens = kTokens;
    p.ignore_eos = true;
    return p;
  };
  // Submission order = sequence ids 1..7.
  std::vector<std::pair<std::string, SamplingParams>> reqs;
  reqs.push_back({"greedy", base()});
  SamplingParams p = base();
  p.temperature = 0.8f, p.top_k = 5, p.top_p = 0.9f, p.seed = 7;
  reqs.push_back({"topk", p});
  p = base(), p.repetition_penalty = 1.3f;
  reqs.push_back({"rep", p});
  p = base(), p.presence_penalty = 0.5f;
  reqs.push_back({"pres", p});
  p = base(), p.temperature = 1.0f, p.min_p = 0.1f;
  reqs.push_back({"minp", p});
  p = base(), p.logprobs = 2;
  reqs.push_back({"lp", p});
  p = base(), p.min_tokens = 3;
  reqs.push_back({"mintok", p});
  for (size_t i = 0; i < reqs.size(); ++i) submit(*engine, c, reqs[i].first, prompt_of(4 + int(i), int(i)), reqs[i].second);
  engine->shutdown(10s);

  std::map<int64_t, std::vector<bool>> device_by_seq;
  int device_rows = 0, host_rows = 0;
  for (const RowLog& r : ex->log()) {
    device_by_seq[r.seq_id].push_back(r.device);
    (r.device ? device_rows : host_rows)++;
  }
  ASSERT_EQ(device_by_seq.size(), reqs.size());
  const std::vector<bool> all_dev(kTokens, true), all_host(kTokens, false);
  EXPECT_EQ(device_by_seq[1], all_dev) << "greedy";
  EXPECT_EQ(device_by_seq[2], all_dev) << "temperature / top-k / top-p / seed";
  for (int64_t s = 3; s <= 6; ++s) EXPECT_EQ(device_by_seq[s], all_host) << reqs[s - 1].first;
  EXPECT_EQ(device_by_seq[7], (std::vector<bool>{false, false, false, true, true, true})) << "min_tokens 3";
  EXPECT_EQ(ex->host_rows_returned(), host_rows) << "only host rows' logits come back";
  EXPECT_EQ(device_rows, 2 * kTokens + 3);

  for (const auto& [id, sp] : reqs) {
    ASSERT_TRUE(c.final.count(id)) << id;
    EXPECT_EQ(c.final[id].finish_reason, FinishReason::Length) << id;
    EXPECT_EQ(int(c.tokens[id].size()), kTokens) << id;
  }
  EXPECT_EQ(c.logprob_entries["lp"], kTokens);
  EXPECT_EQ(c.logprob_entries["greedy"], 0);
  // The ids the engine delivered are the device's: greedy = the toy model's argmax chain.
  EXPECT_EQ(c.tokens["greedy"], ToyExecutor::reference_greedy(kToy, prompt_of(4, 0), kTokens));
  // The seeded device row: replay the fake device sampler over the reference logits with the
  // seeds the engine derives (the request's mt19937_64, one draw per token).
  std::mt19937_64 rng(7);
  std::vector<int32_t> ctx = prompt_of(5, 1), expect;
  std::vector<float> logits(kToy.vocab_size);
  for (int t = 0; t < kTokens; ++t) {
    ToyExecutor::reference_logits(kToy, ctx, logits.data());
    const int32_t tok = DeviceSamplingToy::device_sample(logits, DeviceSampling{0.8f, 5, 0.9f, rng()});
    expect.push_back(tok);
    ctx.push_back(tok);
  }
  EXPECT_EQ(c.tokens["topk"], expect);
}

std::map<std::string, std::vector<int32_t>> run(bool advertise, bool engine_device, float temperature,
                                                int extra_requests, std::vector<RowLog>* log = nullptr) {
  auto exec = std::make_unique<DeviceSamplingToy>(kToy, advertise);
  DeviceSamplingToy* ex = exec.get();
  EngineConfig cfg{.max_num_seqs = 8, .max_num_batched_tokens = 32, .device_sampling = engine_device};
  auto engine = make_engine(cfg, std::move(exec));
  Collector c;
  for (int k = 0; k < extra_requests; ++k) {  // other traffic first: different batch positions
    SamplingParams p{.temperature = 1.0f, .max_tokens = 12};
    submit(*engine, c, "x" + std::to_string(k), prompt_of(3 + k, 50 + k), p);
  }
  for (int k = 0; k < 6; ++k) {
    SamplingParams p{.temperature = temperature, .top_p = 0.95f, .top_k = 20, .seed = 100 + uint64_t(k), .max_tokens = 16};
    submit(*engine, c, "q" + std::to_string(k), prompt_of(4 + k, k), p);
  }
  engine->shutdown(10s);
  if (log) *log = ex->log();
  std::map<std::string, std::vector<int32_t>> out;
  for (auto& [id, t] : c.tokens)
    if (id[0] == 'q') out[id] = t;
  return out;
}

TEST(DeviceSamplingEngine, GreedyDeviceEqualsHostAndReference) {
  std::vector<RowLog> dev_log, host_log, plain_log;
  const auto dev = run(true, true, 0.f, 0, &dev_log);
  const auto host = run(true, false, 0.f, 0, &host_log);  // EngineConfig::device_sampling = false
  const auto plain = run(false, true, 0.f, 0, &plain_log);  // executor without the capability
  ASSERT_EQ(dev.size(), 6u);
  EXPECT_EQ(dev, host);
  EXPECT_EQ(dev, plain);
  for (int k = 0; k < 6; ++k)
    EXPECT_EQ(dev.at("q" + std::to_string(k)), ToyExecutor::reference_greedy(kToy, prompt_of(4 + k, k), 16));
  for (const RowLog& r : dev_log) EXPECT_TRUE(r.device);
  for (const RowLog& r : host_log) EXPECT_FALSE(r.device);
  for (const RowLog& r : plain_log) EXPECT_FALSE(r.device);
}

TEST(DeviceSamplingEngine, SeededDeviceSamplingIsReproducibleAndBatchIndependent) {
  const auto a = run(true, true, 1.0f, 0);
  const auto b = run(true, true, 1.0f, 0);
  const auto crowded = run(true, true, 1.0f, 5);  // same requests behind 5 unseeded ones
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, crowded);
  // Sampling, not greedy: at temperature 1 some request leaves the greedy chain.
  const auto greedy = run(true, true, 0.f, 0);
  EXPECT_NE(a, greedy);
  // Distinct seeds give distinct streams.
  std::set<std::vector<int32_t>> distinct;
  for (auto& [id, t] : a) distinct.insert(t);
  EXPECT_GT(distinct.size(), 1u);
}

TEST(DeviceSamplingEngine, BadDeviceIdFailsTheRequest) {
  auto engine = make_engine({}, std::make_unique<DeviceSamplingToy>(kToy, true, /*corrupt=*/true));
  Collector c;
  submit(*engine, c, "bad", prompt_of(5, 2), SamplingParams{.temperature = 0, .max_tokens = 3});
  engine->shutdown(10s);
  ASSERT_TRUE(c.final.count("bad"));
  EXPECT_EQ(c.final["bad"].finish_reason, FinishReason::Error);
  EXPECT_NE(c.final["bad"].error.find("outside"), std::string::npos) << c.final["bad"].error;
}

}  // namespace
}  // namespace moeserve
