#include "engine/structured_sampling.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "engine/sequence.h"
#include "structured/constraint.h"

namespace moeserve {

StructuredState::~StructuredState() = default;

namespace {
StructuredState* state_of(Sequence& seq) {
  const auto& c = seq.params().structured;
  if (!c || !c->grammar) return nullptr;
  auto& st = seq.sampler.structured;
  if (!st) {
    st = std::make_shared<StructuredState>();
    st->matcher = std::make_unique<structured::Matcher>(c->grammar);
    st->started = c->start_after_tokens.empty();
  }
  return st.get();
}
}  // namespace

bool has_structured_constraint(const Sequence& seq) {
  return seq.params().structured && seq.params().structured->grammar;
}

std::span<const float> apply_structured_mask(Sequence& seq, std::span<const float> logits) {
  StructuredState* st = state_of(seq);
  if (!st || !st->started || st->failed || st->matcher->terminated()) return logits;
  thread_local std::vector<uint32_t> mask;
  thread_local std::vector<float> masked;
  mask.resize(st->matcher->mask_words());
  st->matcher->fill_mask(mask);
  masked.assign(logits.size(), -std::numeric_limits<float>::infinity());
  bool any = false;
  const size_t n = std::min(logits.size(), mask.size() * 32);
  for (size_t w = 0; w * 32 < n; ++w) {
    uint32_t bits = mask[w];
    while (bits) {
      const size_t i = w * 32 + static_cast<size_t>(__builtin_ctz(bits));
      bits &= bits - 1;
      if (i < n) {
        masked[i] = logits[i];
        any = true;
      }
    }
  }
  if (!any) {
    // Nothing allowed (e.g. the grammar is complete but EOS is ignored or masked by
    // min_tokens): sample unconstrained rather than from an all -inf row; the next
    // structured_note_token marks the constraint failed.
    spdlog::warn("structured output: no token allowed for request {}; the rest is unconstrained", seq.request->id);
    st->failed = true;
    return logits;
  }
  return masked;
}

void structured_note_token(Sequence& seq, int32_t token) {
  StructuredState* st = state_of(seq);
  if (!st || st->failed) return;
  if (!st->started) {
    const auto& starts = seq.params().structured->start_after_tokens;
    st->started = std::find(starts.begin(), starts.end(), token) != starts.end();
    return;
  }
  if (st->matcher->terminated()) return;
  if (!st->matcher->accept_token(token)) {
    spdlog::warn("structured output: token {} rejected by the grammar for request {}", token, seq.request->id);
    st->failed = true;
  }
}

}  // namespace moeserve
