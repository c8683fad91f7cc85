// Simple single-sequence generation over a ModelExecutor (used by `moeserve generate` and
// the golden tests): prefill the prompt, then decode one token at a time with a contiguous
// block table. Tokens are drawn by the engine's sampler (engine/sampler.h sample_token: one
// sampling implementation): temperature < kSamplingEps is greedy with ties to the lowest id;
// otherwise softmax at the temperature from a std::mt19937_64 seeded with `seed`, the same
// generator and draws as a server request with that seed (and no other sampling options).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/executor.h"
#include "engine/sampler.h"

namespace moeserve {

struct GenerateOptions {
  std::vector<int32_t> prompt_ids;
  int max_tokens = 16;
  float temperature = 0.f;
  uint64_t seed = 0;
  bool keep_logits = false;
  int prefill_chunk = 0;  // 0: whole prompt in one step; else chunked prefill of this size
};

struct GenerateResult {
  std::vector<int32_t> generated_ids;
  // Row k: the logits from which generated token k was chosen ([N, vocab], when kept).
  std::vector<float> logits;
  int vocab_size = 0;
};

GenerateResult generate(ModelExecutor& exec, const GenerateOptions& opts);

// The engine's greedy choice (largest value, ties to the lowest index, NaN as -inf) over a
// raw row of n logits (tests and tools hold rows as pointers into [R, V] buffers).
inline int32_t argmax_lowest(const float* x, int n) { return argmax_lowest(std::span<const float>(x, size_t(n))); }

// Writes a float32 .npy file (format 1.0, little endian, C order) of shape [rows, cols].
void write_npy_f32(const std::string& path, const float* data, int64_t rows, int64_t cols);
// Reads a float32 2-D .npy file written by numpy (tests).
std::vector<float> read_npy_f32(const std::string& path, int64_t* rows, int64_t* cols);

}  // namespace moeserve
