#include "engine/structured_sampling.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <vector>

#include "engine/sampler.h"
#include "engine/sequence.h"
#include "structured/constraint.h"

namespace moeserve {

StructuredState::~StructuredState() = default;

namespace {
std::atomic<uint64_t> g_taken_ahead{0};

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
  thread_local std::vector<uint32_t> own_mask;
  thread_local std::vector<float> masked;
  std::vector<uint32_t>* mp = &own_mask;
  if (st->ready_at == st->matcher->position() && !st->ready_mask.empty()) {
    mp = &st->ready_mask;
    g_taken_ahead.fetch_add(1, std::memory_order_relaxed);
  } else {
    own_mask.resize(st->matcher->mask_words());
    st->matcher->fill_mask(own_mask);
  }
  st->ready_at = {0, -1};
  const std::vector<uint32_t>& mask = *mp;
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
    // Nothing allowed: the grammar is complete but no end-of-sequence token is known, or the
    // vocabulary cannot spell any continuation. The request finishes here with
    // finish_reason "error" (vLLM ends such a request as FINISHED_ERROR) instead of going on
    // unconstrained; the engine reports the message.
    throw SamplingError("structured output: the grammar allows no next token (" +
                        std::string(st->matcher->accepting() ? "the output is complete and no end-of-sequence token is known"
                                                             : "the vocabulary cannot continue the output") +
                        ")");
  }
  return masked;
}

bool structured_allows_only_stop(Sequence& seq, std::span<const int32_t> stop_ids) {
  StructuredState* st = state_of(seq);
  if (!st || !st->started || st->failed || st->matcher->terminated() || !st->matcher->accepting()) return false;
  // At an accepting state: does any non-stop token continue? (The mask is cached per state.)
  thread_local std::vector<uint32_t> mask;
  mask.resize(st->matcher->mask_words());
  st->matcher->fill_mask(mask);
  for (int32_t id : stop_ids)
    if (id >= 0 && size_t(id) < mask.size() * 32) mask[id >> 5] &= ~(1u << (id & 31));
  return std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; });
}

void prepare_structured_mask(Sequence& seq) {
  StructuredState* st = nullptr;
  try {
    st = state_of(seq);
    if (!st || !st->started || st->failed || st->matcher->terminated()) return;
    st->ready_at = {0, -1};
    st->ready_mask.resize(st->matcher->mask_words());
    st->matcher->fill_mask(st->ready_mask);
    st->ready_at = st->matcher->position();
  } catch (const std::exception&) {
    // A host row: apply_structured_mask computes the mask again and reports the failure. A
    // device row: an empty mask, so the kernel finds no candidate and the engine reports it.
    if (st) std::fill(st->ready_mask.begin(), st->ready_mask.end(), 0u);
  }
}

std::span<const uint32_t> structured_device_mask(Sequence& seq) {
  StructuredState* st = state_of(seq);
  if (!st || !st->started || st->failed || st->matcher->terminated()) return {};
  st->ready_mask.resize(st->matcher->mask_words());
  return st->ready_mask;
}

uint64_t structured_masks_taken_ahead() { return g_taken_ahead.load(std::memory_order_relaxed); }

bool structured_terminated(const Sequence& seq) {
  const auto& st = seq.sampler.structured;
  return st && st->started && !st->failed && st->matcher && st->matcher->terminated();
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
