// Simple single-sequence generation over a ModelExecutor (used by `moeserve generate` and
// the golden tests): prefill the prompt, then decode one token at a time with a contiguous
// block table. Temperature 0 is greedy with ties to the lowest id; otherwise softmax
// sampling at the temperature with a seeded generator.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/executor.h"

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

// Index of the largest value; ties go to the lowest index.
int32_t argmax_lowest(const float* x, int n);

// Writes a float32 .npy file (format 1.0, little endian, C order) of shape [rows, cols].
void write_npy_f32(const std::string& path, const float* data, int64_t rows, int64_t cols);
// Reads a float32 2-D .npy file written by numpy (tests).
std::vector<float> read_npy_f32(const std::string& path, int64_t* rows, int64_t* cols);

}  // namespace moeserve
