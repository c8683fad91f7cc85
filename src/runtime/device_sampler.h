// The device sampler of an executor (ExecutorOptions::device_sampler) over the backend's
// DeviceSampler capability (backend/capabilities.h): maps the engine's DeviceSampling rows
// onto it. Empty when the backend has none (the executor then reports no device sampling).
#pragma once
#include <algorithm>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/backend.h"
#include "engine/executor.h"

namespace moeserve {

using DeviceSamplerFn = std::function<void(const Tensor&, const std::vector<DeviceSampling>&, Tensor&)>;

// The structured-output masks of a step's device rows packed for one upload: `words` holds
// [rows with a mask, ceil(V / 32)] uint32 (a row's own bitset, cut or zero-padded to the
// logits' vocabulary V: the model's lm_head may be wider than the tokenizer's vocabulary, and
// ids the grammar's vocabulary does not know stay disallowed, as on the host), and
// `mask_row[i]` is row i's index in it or -1.
struct PackedDeviceMasks {
  std::vector<uint32_t> words;
  std::vector<int32_t> mask_row;
  int words_per_row = 0;
  int num_rows = 0;
};

inline void pack_device_masks(const std::vector<DeviceSampling>& rows, int64_t vocab, PackedDeviceMasks& out) {
  out.words_per_row = int((vocab + 31) / 32);
  out.mask_row.assign(rows.size(), -1);
  out.num_rows = 0;
  for (const auto& r : rows) out.num_rows += r.mask != nullptr;
  out.words.assign(size_t(out.num_rows) * size_t(out.words_per_row), 0u);
  const size_t W = size_t(out.words_per_row);
  int k = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].mask) continue;
    uint32_t* dst = out.words.data() + size_t(k) * W;
    const size_t n = std::min(W, rows[i].mask_words);
    std::memcpy(dst, rows[i].mask, n * sizeof(uint32_t));
    // Bits at or past V in the last word: the kernel never reads them, cleared for tidiness.
    if (n == W && vocab % 32) dst[W - 1] &= (1u << (vocab % 32)) - 1u;
    out.mask_row[i] = k++;
  }
}

inline DeviceSamplerFn backend_device_sampler(Backend& backend) {
  DeviceSampler* s = backend.device_sampler();
  if (!s) return {};
  return [s](const Tensor& logits, const std::vector<DeviceSampling>& rows, Tensor& out_ids) {
    thread_local PackedDeviceMasks packed;  // reused: [masked rows, V/32] words each step
    pack_device_masks(rows, logits.rank() == 2 ? logits.dim(1) : 0, packed);
    std::vector<DeviceSampleRow> p(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      p[i] = DeviceSampleRow{rows[i].temperature, rows[i].top_k, rows[i].top_p, rows[i].seed, packed.mask_row[i]};
    s->sample(logits, p, DeviceMasks{packed.words.data(), packed.num_rows, packed.words_per_row}, out_ids);
  };
}

}  // namespace moeserve
