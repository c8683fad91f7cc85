// Structured outputs on device rows (engine side, CPU): constrained rows go to the executor's
// device sampler with DeviceSampling::mask (no host fallback), the executor waits for the masks
// through StepBatch::await_masks, and the outputs equal the host path's. The "device" is a
// ToyExecutor wrapper that samples device rows itself with the mask applied (as k_sample.cu:
// disallowed logits -inf, greedy = argmax lowest id, else the host chain seeded by the row's
// seed). Plus pack_device_masks (runtime/device_sampler.h), the host-side packing the CUDA
// sampler uploads.
#include <gtest/gtest.h>

#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <regex>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/structured_sampling.h"
#include "engine/testing/toy_executor.h"
#include "runtime/device_sampler.h"
#include "structured/constraint.h"
#include "structured/regex.h"

namespace moeserve {
namespace {

using namespace std::chrono_literals;
using testing::ToyExecutor;
using testing::ToyExecutorConfig;

constexpr int32_t kEos = 0;
constexpr int32_t kThinkEnd = 1;

std::shared_ptr<structured::TokenVocab> toy_vocab(bool with_stop = true) {
  auto v = std::make_shared<structured::TokenVocab>();
  v->token_bytes = {"<eos>", "</think>"};
  const char* pieces[] = {"a", "b", "c", "d", "x", "ab", "cd", "xx", "ba", "dc", "y", "z", "abc", "-", "--", "q"};
  for (int i = 2; i < 64; ++i) v->token_bytes.push_back(pieces[(i - 2) % 16] + std::string((i - 2) / 16, 'a'));
  v->special.assign(64, false);
  v->special[0] = v->special[1] = true;
  if (with_stop) v->stop_ids = {kEos};
  v->mask_size = 64;
  v->build();
  return v;
}

std::shared_ptr<structured::StructuredConstraint> constraint(const std::string& regex, std::vector<int32_t> start = {},
                                                             bool with_stop = true) {
  auto c = std::make_shared<structured::StructuredConstraint>();
  c->grammar = std::make_shared<structured::CompiledGrammar>(structured::grammar_from_regex(regex), toy_vocab(with_stop));
  c->start_after_tokens = std::move(start);
  return c;
}

class MaskingDeviceToy final : public ModelExecutor {
 public:
  explicit MaskingDeviceToy(ToyExecutorConfig c) : toy_(c) {}
  ExecutorInfo info() const override {
    ExecutorInfo i = toy_.info();
    i.device_sampling = true;
    return i;
  }
  StepResult execute(const StepBatch& batch) override {
    StepBatch plain;
    plain.seqs = batch.seqs;
    for (auto& s : plain.seqs) s.device_sample.reset();
    StepResult all = toy_.execute(plain);
    bool any_mask = false;
    for (const auto& s : batch.seqs) any_mask |= s.device_sample && s.device_sample->mask;
    if (any_mask) {
      EXPECT_TRUE(batch.await_masks || !overlap_expected) << "masked device rows without await_masks";
      if (batch.await_masks) {
        batch.await_masks();
        ++awaits;
      }
    }
    const size_t V = size_t(all.vocab_size);
    StepResult res;
    res.vocab_size = all.vocab_size;
    size_t r = 0;
    for (const auto& s : batch.seqs) {
      if (!s.need_logits) continue;
      std::span<const float> row(all.logits.data() + r * V, V);
      ++r;
      if (!s.device_sample) {
        res.logits.insert(res.logits.end(), row.begin(), row.end());
        continue;
      }
      ++device_rows;
      std::vector<float> m(row.begin(), row.end());
      if (const DeviceSampling& d = *s.device_sample; d.mask) {
        ++masked_rows;
        for (size_t i = 0; i < V; ++i)
          if (i >= d.mask_words * 32 || !((d.mask[i / 32] >> (i % 32)) & 1u)) m[i] = -std::numeric_limits<float>::infinity();
      }
      float mx = -std::numeric_limits<float>::infinity();
      for (float x : m) mx = x > mx ? x : mx;
      if (!std::isfinite(mx)) {
        res.sampled_ids.push_back(kDeviceNoCandidate);
        continue;
      }
      const DeviceSampling& d = *s.device_sample;
      if (d.temperature <= 0) {
        res.sampled_ids.push_back(argmax_lowest(m));
      } else {
        SamplingParams p;
        p.temperature = d.temperature;
        p.top_k = d.top_k;
        p.top_p = d.top_p;
        std::mt19937_64 rng(d.seed);
        res.sampled_ids.push_back(sample_token(m, p, rng));
      }
    }
    return res;
  }
  int device_rows = 0, masked_rows = 0, awaits = 0;
  bool overlap_expected = true;

 private:
  ToyExecutor toy_;
};

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> final;
  std::function<void(RequestOutput&&)> sink() {
    return [this](RequestOutput&& o) {
      std::lock_guard lk(mu);
      auto& t = tokens[o.request_id];
      t.insert(t.end(), o.new_token_ids.begin(), o.new_token_ids.end());
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

struct RunOut {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, RequestOutput> final;
  int device_rows = 0, masked_rows = 0, awaits = 0;
};

const std::string kRe = "(ab|cd)+-x{2,3}";

// 10 requests: greedy and seeded, some constrained after a reasoning end token, some free.
RunOut run(bool device, bool overlap, bool greedy_only) {
  EngineConfig cfg{.max_num_seqs = 8, .max_num_batched_tokens = 64};
  cfg.eos_token_ids = {kEos};
  cfg.overlap_structured_masks = overlap;
  const ToyExecutorConfig toy{.vocab_size = 64, .peak = 0.5f};
  MaskingDeviceToy* dev = nullptr;
  std::unique_ptr<ModelExecutor> exec;
  if (device) {
    auto d = std::make_unique<MaskingDeviceToy>(toy);
    d->overlap_expected = overlap;
    dev = d.get();
    exec = std::move(d);
  } else {
    exec = std::make_unique<ToyExecutor>(toy);
  }
  auto engine = make_engine(cfg, std::move(exec));
  Collector c;
  auto con = constraint(kRe);
  auto con_r = constraint(kRe, {kThinkEnd});
  for (int i = 0; i < 10; ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    for (int k = 0; k < 9; ++k) r.prompt_ids.push_back((k * 5 + i * 7) % 64);
    r.params.temperature = (greedy_only || i % 2) ? 0.0f : 0.8f;
    r.params.top_k = i % 4 == 0 ? 5 : 0;
    r.params.top_p = i % 4 == 2 ? 0.9f : 1.f;
    r.params.seed = 77 + i;
    r.params.max_tokens = 60;
    if (i != 9) r.params.structured = i % 3 == 2 ? con_r : con;  // r9: unconstrained, same batch
    r.on_output = c.sink();
    EXPECT_TRUE(engine->submit(std::move(r)));
  }
  EXPECT_TRUE(c.wait(10));
  engine->shutdown(1s);
  RunOut o{c.tokens, c.final};
  if (dev) o.device_rows = dev->device_rows, o.masked_rows = dev->masked_rows, o.awaits = dev->awaits;
  return o;
}

std::string text_of(const std::vector<int32_t>& ids, bool skip_reasoning) {
  static auto v = toy_vocab();
  std::string s;
  bool in_answer = !skip_reasoning;
  for (int32_t id : ids) {
    if (id == kThinkEnd) {
      in_answer = true;
      continue;
    }
    if (id == kEos) break;
    if (in_answer) s += v->token_bytes[size_t(id)];
  }
  return s;
}

TEST(StructuredDevice, GreedyDeviceRowsEqualTheHostPath) {
  RunOut host = run(false, true, true);
  RunOut dev = run(true, true, true);
  EXPECT_EQ(dev.tokens, host.tokens);
  EXPECT_GT(dev.masked_rows, 20);  // constrained rows really went to the device, masked
  EXPECT_GT(dev.device_rows, dev.masked_rows);  // and unmasked ones with them
  EXPECT_GT(dev.awaits, 0);
}

TEST(StructuredDevice, SeededDeviceRowsFollowTheGrammarWithAndWithoutOverlap) {
  RunOut on = run(true, true, false);
  RunOut off = run(true, false, false);
  EXPECT_EQ(on.tokens, off.tokens);  // masks made ahead on a worker == made on the engine thread
  EXPECT_GT(on.masked_rows, 20);
  EXPECT_EQ(off.awaits, 0);
  int stopped = 0;
  for (int i = 0; i < 9; ++i) {
    const std::string id = "r" + std::to_string(i);
    const auto& toks = on.tokens[id];
    const bool reasoning = i % 3 == 2;
    if (reasoning && std::find(toks.begin(), toks.end(), kThinkEnd) == toks.end()) continue;
    const std::string text = text_of(toks, reasoning);
    if (on.final[id].finish_reason == FinishReason::Stop) {
      ++stopped;
      EXPECT_TRUE(std::regex_match(text, std::regex(kRe))) << id << ": " << text;
    } else {
      EXPECT_EQ(on.final[id].finish_reason, FinishReason::Length) << id << ": " << on.final[id].error;
      auto g = constraint(kRe)->grammar;
      EXPECT_GE(g->step_bytes(g->initial_state(), text), 0) << id << ": " << text;
    }
  }
  EXPECT_GT(stopped, 0);
}

// A grammar that allows nothing (complete, no stop token known) on a device row: the request
// fails with the host path's reason, not the generic "no finite logit".
TEST(StructuredDevice, EmptyMaskOnADeviceRowGivesTheGrammarReason) {
  EngineConfig cfg{.max_num_seqs = 2, .max_num_batched_tokens = 64};
  cfg.eos_token_ids = {kEos};
  auto engine = make_engine(cfg, std::make_unique<MaskingDeviceToy>(ToyExecutorConfig{.vocab_size = 64}));
  Collector c;
  Request r;
  r.id = "x";
  r.prompt_ids = {3, 4, 5};
  r.params.max_tokens = 10;
  r.params.structured = constraint("x", {}, false);
  r.on_output = c.sink();
  ASSERT_TRUE(engine->submit(std::move(r)));
  ASSERT_TRUE(c.wait(1));
  engine->shutdown(1s);
  EXPECT_EQ(c.tokens["x"], std::vector<int32_t>{6});
  EXPECT_EQ(c.final["x"].finish_reason, FinishReason::Error);
  EXPECT_NE(c.final["x"].error.find("grammar allows no next token"), std::string::npos) << c.final["x"].error;
}

TEST(DeviceMaskPacking, PacksMaskedRowsCutsAndPadsToTheLogitsVocab) {
  std::vector<uint32_t> a(3, 0xffffffffu), b = {0x1u, 0x80000000u};
  std::vector<DeviceSampling> rows(4);
  rows[1].mask = a.data(), rows[1].mask_words = a.size();  // wider than V: cut
  rows[3].mask = b.data(), rows[3].mask_words = b.size();  // narrower than V: zero-padded
  PackedDeviceMasks p;
  pack_device_masks(rows, 70, p);  // V = 70: 3 words, 6 valid bits in the last
  EXPECT_EQ(p.words_per_row, 3);
  EXPECT_EQ(p.num_rows, 2);
  EXPECT_EQ(p.mask_row, (std::vector<int32_t>{-1, 0, -1, 1}));
  EXPECT_EQ(p.words, (std::vector<uint32_t>{0xffffffffu, 0xffffffffu, 0x3fu, 0x1u, 0x80000000u, 0u}));
  pack_device_masks(std::vector<DeviceSampling>(2), 64, p);  // no masks: nothing to upload
  EXPECT_EQ(p.num_rows, 0);
  EXPECT_TRUE(p.words.empty());
  EXPECT_EQ(p.mask_row, (std::vector<int32_t>{-1, -1}));
}

}  // namespace
}  // namespace moeserve
