#include "engine/testing/replay_executor.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"

namespace moeserve::testing {

ReplayExecutorConfig replay_config_from_json(const nlohmann::json& j) {
  ReplayExecutorConfig c;
  MS_CHECK(j.is_object(), "replay config: expected a JSON object");
  try {
    c.vocab_size = j.value("vocab_size", c.vocab_size);
    c.max_model_len = j.value("max_model_len", c.max_model_len);
    c.block_size = j.value("block_size", c.block_size);
    c.num_kv_blocks = j.value("num_kv_blocks", c.num_kv_blocks);
    c.end_token = j.value("end_token", c.end_token);
    c.forced_logit = j.value("forced_logit", c.forced_logit);
    c.step_sleep = std::chrono::microseconds(j.value("step_sleep_us", int64_t(0)));
    c.per_token_sleep = std::chrono::microseconds(j.value("per_token_sleep_us", int64_t(0)));
    if (j.contains("scripts")) {
      for (const auto& s : j.at("scripts")) {
        ReplayScript rs;
        rs.marker = s.value("marker", std::vector<int32_t>{});
        rs.tokens = s.at("tokens").get<std::vector<int32_t>>();
        c.scripts.push_back(std::move(rs));
      }
    }
  } catch (const nlohmann::json::exception& e) {
    fail("replay config: {}", e.what());
  }
  return c;
}

ReplayExecutor::ReplayExecutor(ReplayExecutorConfig config)
    : config_(std::move(config)), kv_(config_.num_kv_blocks, config_.block_size) {
  MS_CHECK(config_.vocab_size > 0, "ReplayExecutor: vocab_size must be positive");
  auto check = [&](int32_t t) {
    MS_CHECK(t >= 0 && t < config_.vocab_size, "ReplayExecutor: token {} outside vocab {}", t, config_.vocab_size);
  };
  check(config_.end_token);
  for (const auto& s : config_.scripts)
    for (int32_t t : s.tokens) check(t);
}

ExecutorInfo ReplayExecutor::info() const {
  return ExecutorInfo{.vocab_size = config_.vocab_size,
                      .max_model_len = config_.max_model_len,
                      .block_size = config_.block_size,
                      .num_kv_blocks = config_.num_kv_blocks};
}

int ReplayExecutor::choose_script(const std::vector<int32_t>& prompt) const {
  int fallback = -1;
  for (size_t i = 0; i < config_.scripts.size(); ++i) {
    const auto& m = config_.scripts[i].marker;
    if (m.empty()) {
      if (fallback < 0) fallback = static_cast<int>(i);
      continue;
    }
    if (std::search(prompt.begin(), prompt.end(), m.begin(), m.end()) != prompt.end()) return static_cast<int>(i);
  }
  return fallback;
}

void ReplayExecutor::recycle(StepResult&& result) {
  spare_ = std::move(result.logits);
  if (spare_.empty()) dirty_.clear();
}

StepResult ReplayExecutor::execute(const StepBatch& batch) {
  StepResult res;
  res.vocab_size = config_.vocab_size;
  size_t rows = 0;
  for (const SequenceStep& st : batch.seqs) rows += st.need_logits ? size_t(st.num_logits) : 0;
  const size_t V = static_cast<size_t>(config_.vocab_size);
  res.logits = std::move(spare_);
  spare_.clear();
  for (size_t i : dirty_)
    if (i < res.logits.size()) res.logits[i] = 0.0f;
  dirty_.clear();
  res.logits.resize(rows * V, 0.0f);  // entries past the old size are zeroed by resize
  size_t row = 0;
  int64_t num_tokens = 0;
  for (const SequenceStep& st : batch.seqs) {
    num_tokens += static_cast<int64_t>(st.tokens.size());
    const std::vector<int32_t> ctx = kv_.write_and_read(st);
    if (!st.need_logits) continue;
    auto [it, fresh] = seqs_.try_emplace(st.seq_id);
    if (fresh) {  // first logits request: the context is the prompt
      it->second.script = choose_script(ctx);
      it->second.prompt_len = static_cast<int>(ctx.size());
    }
    const SeqState& s = it->second;
    for (int j = st.num_logits - 1; j >= 0; --j) {  // speculative verify: one row per last query token
      const size_t k = ctx.size() - size_t(j) - size_t(s.prompt_len);  // tokens generated before this row
      int32_t next = config_.end_token;
      if (s.script >= 0 && k < config_.scripts[s.script].tokens.size()) next = config_.scripts[s.script].tokens[k];
      const size_t at = V * row++ + size_t(next);
      res.logits[at] = config_.forced_logit;
      dirty_.push_back(at);
    }
  }
  const auto sleep = config_.step_sleep + config_.per_token_sleep * num_tokens;
  if (sleep.count() > 0) std::this_thread::sleep_for(sleep);
  return res;
}

}  // namespace moeserve::testing
