#include "engine/testing/toy_executor.h"

#include <algorithm>
#include <thread>

#include "core/error.h"

namespace moeserve::testing {

namespace {
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}
}  // namespace

ToyExecutor::ToyExecutor(ToyExecutorConfig config)
    : config_(config), kv_(config.num_kv_blocks, config.block_size) {}

ExecutorInfo ToyExecutor::info() const {
  return ExecutorInfo{.vocab_size = config_.vocab_size,
                      .max_model_len = config_.max_model_len,
                      .block_size = config_.block_size,
                      .num_kv_blocks = config_.num_kv_blocks};
}

void ToyExecutor::reference_logits(const ToyExecutorConfig& config, std::span<const int32_t> context, float* out) {
  MS_CHECK(!context.empty(), "ToyExecutor: empty context");
  uint64_t ctx_hash = 0;
  for (int32_t t : context) ctx_hash = mix(ctx_hash ^ uint64_t(uint32_t(t)));
  const uint64_t pos = context.size() - 1;
  const uint64_t base = mix(ctx_hash ^ mix(uint64_t(uint32_t(context.back())) * 31 + pos));
  const int32_t preferred = static_cast<int32_t>(base % uint64_t(config.vocab_size));
  for (int v = 0; v < config.vocab_size; ++v) {
    const double u = double(mix(base + uint64_t(v)) >> 11) * 0x1.0p-53;  // [0, 1)
    out[v] = float(2.0 * u) + (v == preferred ? config.peak : 0.0f);
  }
}

std::vector<int32_t> ToyExecutor::reference_greedy(const ToyExecutorConfig& config, std::vector<int32_t> prompt,
                                                   int n, const std::vector<int32_t>& eos) {
  std::vector<float> logits(config.vocab_size);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    reference_logits(config, prompt, logits.data());
    const int32_t t = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(t);
    prompt.push_back(t);
    if (std::find(eos.begin(), eos.end(), t) != eos.end()) break;
  }
  return out;
}

StepResult ToyExecutor::execute(const StepBatch& batch) {
  if (config_.step_sleep.count() > 0) std::this_thread::sleep_for(config_.step_sleep);
  StepResult res;
  res.vocab_size = config_.vocab_size;
  ToyStepRecord rec;
  rec.num_seqs = static_cast<int>(batch.seqs.size());
  for (const SequenceStep& st : batch.seqs) {
    MS_CHECK(!st.tokens.empty(), "ToyExecutor: seq {} has no query tokens", st.seq_id);
    for (int32_t t : st.tokens) MS_CHECK(t >= 0 && t < config_.vocab_size, "ToyExecutor: token {} out of vocab", t);
    MS_CHECK(st.start_pos + int(st.tokens.size()) <= config_.max_model_len, "ToyExecutor: seq {} past max_model_len",
             st.seq_id);
    rec.num_tokens += static_cast<int>(st.tokens.size());
    const std::vector<int32_t> ctx = kv_.write_and_read(st);
    if (st.need_prompt_logits) {  // every query token's logits: the context up to that token
      for (size_t j = 0; j < st.tokens.size(); ++j) {
        const size_t off = res.prompt_logits.size();
        res.prompt_logits.resize(off + config_.vocab_size);
        reference_logits(config_, std::span<const int32_t>(ctx.data(), size_t(st.start_pos) + j + 1),
                         res.prompt_logits.data() + off);
      }
    }
    if (!st.need_logits) continue;
    MS_CHECK(st.num_logits >= 1 && st.num_logits <= int(st.tokens.size()), "ToyExecutor: seq {} num_logits {}",
             st.seq_id, st.num_logits);
    // The last num_logits query tokens, each over the context up to itself (causal).
    for (int j = st.num_logits - 1; j >= 0; --j) {
      ++rec.num_logit_rows;
      const size_t off = res.logits.size();
      res.logits.resize(off + config_.vocab_size);
      reference_logits(config_, std::span<const int32_t>(ctx.data(), ctx.size() - size_t(j)), res.logits.data() + off);
    }
  }
  std::lock_guard lk(mu_);
  records_.push_back(rec);
  return res;
}

std::vector<ToyStepRecord> ToyExecutor::records() const {
  std::lock_guard lk(mu_);
  return records_;
}

}  // namespace moeserve::testing
