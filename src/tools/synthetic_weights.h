// bench-model's GPU generator of MiniMax-M2 FP8 weights (bench_synth.cpp, CUDA builds) as
// `serve --load-format dummy` calls it: declared free of device headers so the CLI can.
// Other architectures, dtypes and backends use tools/random_weights.h.
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "model/model.h"

namespace moeserve::tools {

// Random weights generated on the GPU when `model` is MiniMax-M2 with FP8 128x128 blocks on
// the CUDA backend: returns the bytes generated. Else -1 (nothing done; use
// load_random_weights). lm_head: whether this rank needs the output projection.
int64_t make_device_synthetic_weights(Backend& backend, Model& model, uint64_t seed, bool lm_head);

}  // namespace moeserve::tools
