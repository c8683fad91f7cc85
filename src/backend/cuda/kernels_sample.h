// Structured-output masks for the sampling kernel (k_sample.cu). Kept out of kernels.h, which
// every kernel file includes, so the mask interface does not touch their builds.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace moeserve::cuda {

// Device pointers: rows [R] int32, each row's index into words (-1: unmasked); words
// [*, words_per_row] uint32 allowed-token bitsets (bit t%32 of word t/32 = token t allowed),
// words_per_row = ceil(vocab / 32). Graph-capturable: the kernel reads both at run time, so
// a captured launch over fixed buffers samples with whatever masks they hold at replay.
struct SampleMasks {
  const int32_t* rows = nullptr;
  const uint32_t* words = nullptr;
  int words_per_row = 0;
};

// launch_sample with masks: a masked row samples as if its disallowed logits were -inf.
void launch_sample_masked(const void* logits, bool logits_bf16, int rows, int vocab, const SampleRowParams* params,
                          const SampleMasks& masks, int32_t* out_ids, cudaStream_t s);

}  // namespace moeserve::cuda
