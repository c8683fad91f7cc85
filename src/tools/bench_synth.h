// bench-model's CUDA weights: a registry model (any DecoderModel architecture, bench_step.h)
// with either random weights (--synthetic NAME: MiniMax-M2.5's generated on the GPU in its
// shapes, FP8 128x128 block-scaled projections and experts, f32 router, bf16 norms / embedding /
// lm_head, each layer's experts carved from one slab allocation; other models from their
// declarations, tools/random_weights.h) or a checkpoint loaded through Model::load.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "model/arch/minimax_m2.h"
#include "tools/bench_step.h"

namespace moeserve::tools {

// Random weights for `model`: the GPU generator where it applies (MiniMax-M2 FP8 128x128),
// else tools/random_weights.h on the host. Returns bytes.
int64_t make_bench_weights(CudaBackend& b, Model& model, uint64_t seed = 1000, bool lm_head = true);

// Random weights for `model` (built from synth_config), generated on the GPU: this rank's
// slices per model.shard() (local q/KV heads, local experts or expert-intermediate slices;
// router, norms and embedding replicated). Seeds do not depend on the rank, so replicated
// tensors are identical on every rank. Without `lm_head` (ranks other than 0 of bench-model
// -tp) it stays empty and forward must be asked for no logits rows. Returns bytes.
int64_t make_synthetic_weights(CudaBackend& b, MiniMaxM2Model& model, uint64_t seed = 1000, bool lm_head = true);
// Bytes of a model's weights (each tensor counted once).
int64_t weight_bytes(const MiniMaxM2Weights& w);

}  // namespace moeserve::tools
