// Persistent batch-1 decode layer (k_decode_layer.cu): one MiniMax-M2 layer (input norm,
// q/k/v, QK-norm + RoPE + KV write + attention, o_proj, post-attention norm + router + top-k,
// experts) as ONE kernel of one block per SM whose phases are separated by grid barriers.
// Host side: CudaBackend::decode_layer (cuda_decode_layer.cpp).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common/kernels.h"

namespace moeserve::cuda {

struct DecodeLayerParams {
  // Activations, one token, bf16.
  void* residual = nullptr;      // [H] in/out
  const void* moe_in = nullptr;  // [H] previous layer's expert output; null for the first layer
  const void* x_in = nullptr;    // [H] rmsnorm(residual) (first layer only)
  void* moe_out = nullptr;       // [H] out
  void* attn = nullptr;          // [Hq * D] workspace (attention output, o_proj input)
  const void* in_norm = nullptr;  // [H] bf16
  const void* post_norm = nullptr;
  const void* q_norm = nullptr;  // [Hq * D] bf16
  const void* k_norm = nullptr;  // [Hkv * D] bf16
  float eps = 1e-6f;
  // FP8 e4m3 weights with 128x128 block scales (f32 [rows / 128, cols / 128]).
  const uint8_t *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  const float *sq = nullptr, *sk = nullptr, *sv = nullptr, *so = nullptr;
  const float* gate = nullptr;  // [E, H] f32
  const float* bias = nullptr;  // [E] f32 or null
  const ExpertPtrs* experts = nullptr;  // [E] (all experts local)
  int H = 0, Hq = 0, Hkv = 0, I = 0, E = 0, top_k = 0, rotary_dim = 0;
  float theta = 10000.f, scale = 1.f;
  // Paged KV cache [blocks, block_size, Hkv, 128] bf16 and the step's metadata (one sequence).
  void* kc = nullptr;
  void* vc = nullptr;
  const int32_t* block_table = nullptr;  // row 0
  const int32_t* context_lens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  int block_size = 0;
  int64_t num_slots = 0;
  // Routing out ([top_k] ids / weights).
  int32_t* ids = nullptr;
  float* rw = nullptr;
  // Workspace (decode_layer_ws_floats floats + 2 barrier words), zero between launches: the
  // kernel clears every accumulator after its last read.
  float* ws = nullptr;
  unsigned* bar = nullptr;
  int max_splits = 16;
  // Kernel variants of earlier A/B runs, fixed at their defaults (their environment switches
  // left the tree; docs/bench/cuda_switch_inventory.md): L2 prefetch of o_proj / gate rows
  // during attention (off: ~5 us per layer slower), the split merge in the attention phase
  // (on), PDL launch (off), fenced grid barrier (off), GEMV L2 prefetch distance (0).
  bool l2_prefetch = false;
  bool merge_in_attention = true;
  // Diagnostics (MOESERVE_MEGA_TIMING=1, diagnostic build): [0, 13) summed ns of each phase in
  // block 0, [15] count.
  unsigned long long* timing = nullptr;
  bool pdl = false;
  bool fence_barrier = false;
  int gemv_pf = 0;
};

// Floats of workspace the kernel needs for these shapes.
int64_t decode_layer_ws_floats(const DecodeLayerParams& p);
// Empty when the kernel supports the shapes for a grid of `grid` blocks, else why not.
const char* decode_layer_unsupported(const DecodeLayerParams& p, int grid);
// Blocks per SM the kernel can keep resident (0: cannot run).
int decode_layer_blocks_per_sm();
// Cooperative launch (co-residency checked by the runtime), capture-safe.
void launch_decode_layer(const DecodeLayerParams& p, int grid, cudaStream_t s);

}  // namespace moeserve::cuda
