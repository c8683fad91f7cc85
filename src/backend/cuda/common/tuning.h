// CudaTuning: every threshold and kernel toggle of one CudaBackend instance, and DeviceCaps:
// what the device runs (the compiled code it loaded, not its compute capability). Both are
// plain host types (no CUDA header): the kernel selectors (select_*.h of each op family) read
// them, and `bench-model --explain-dispatch` evaluates those selectors for a named device
// profile without a GPU.
//
// A backend copies the debug registry's narrowing lists (MOESERVE_DECODE_OFF /
// MOESERVE_PREFILL_OFF, core/debug_flags.h) into its own CudaTuning when it is made
// (apply_debug_flags); tests set fields per instance (CudaBackend::tuning), never through
// process globals. validate() names the first field outside its range.
#pragma once
#include <cstddef>
#include <string>

namespace moeserve {
struct DebugFlags;

struct CudaTuning {
  // ---- linear / GEMV / GEMM (linear/select_linear.h) ----
  // linear uses the GEMV path up to this many rows, else the tensor-core GEMM.
  int linear_gemv_max_tokens = 8;
  // ... and up to 64 rows when N <= this (narrow outputs fill too few GEMM tiles); 0: off.
  int linear_gemv_narrow_n = 2048;
  // ... and up to this many rows for FP8 linears the tensor-core GEMV supports; 0: off.
  int linear_gemv_tc_max_tokens = 64;
  // linear_multi as one tensor-core GEMV launch where every weight allows it (else a loop);
  // MOESERVE_DECODE_OFF=qkv.
  bool fuse_linear_multi = true;
  // Dense decode GEMV (k_gemv_dense.cu: whole weight slice per block into shared memory before
  // the PDL wait) for linear_multi / add_rms_norm_linear_multi (q/k/v) up to this many tokens;
  // 0: off (MOESERVE_DECODE_OFF=dense_gemv). Batch 1 only: at 2-8 tokens the dense q/k/v
  // measured slower (docs/bench/log.md, "Batch-1 dense decode").
  int gemv_dense_max_tokens = 1;
  // add_rms_norm_linear_multi with the norm inside that kernel (MOESERVE_DECODE_OFF=dense_norm).
  bool fuse_norm_dense = true;
  // GEMV rows (decode) of FP8 128x128-block linears and experts on the tensor-core kernel.
  bool use_gemv_tc = true;
  // Prefill: from fp8_act_min_tokens rows, FP8 128x128-block linears and experts quantise their
  // bf16 activations per (token, 128 columns) to e4m3 and run FP8 x FP8 tensor-core GEMMs
  // (cuBLASLt block-scaled on sm_90 for linears, k_gemm_fp8*.cu otherwise and for the experts);
  // MOESERVE_PREFILL_OFF=fp8_act. Adds the activation rounding (<= 2^-4 relative per element).
  bool use_fp8_act_gemm = true;
  int fp8_act_min_tokens = 128;
  bool use_lt_fp8 = true;  // cuBLASLt for the dense linears (else k_gemm_fp8.cu); PREFILL_OFF=lt
  // The FP8 grouped GEMM on Hopper's wgmma kernel (k_gemm_fp8_wgmma.cu) where it applies
  // (MOESERVE_PREFILL_OFF=gemm_wgmma: the mma.sync kernel of k_gemm_fp8.cu).
  bool fp8_gemm_wgmma = true;
  // Layout of the activation scales handed to cuBLASLt (false: token-fastest [K/128, T]).
  bool lt_act_scale_kmajor = false;
  // Prefill linear_multi / add_rms_norm_linear_multi: quantise the (normed) input once for all
  // weights (MOESERVE_PREFILL_OFF=norm_quant).
  bool prefill_norm_quant = true;
  // The dense prefill linears' activation quantisation on the 16-byte-load kernel
  // (k_norm_quant.cu; same bits); MOESERVE_PREFILL_OFF=quant_vec.
  bool prefill_quant_vec = true;

  // ---- MoE route + experts (moe/select_moe.h) ----
  // Experts: GEMV tiles (8 pairs of one expert) up to this many tokens, else the grouped GEMM
  // (FP8 activations from fp8_act_min_tokens). 256: at decode batch 256 (M2.5, one H200) the
  // GEMV step measured 45.5 ms against 52.5 ms with the FP8 grouped GEMM; 128: 29.9 vs 41.3 ms.
  int moe_gemv_max_tokens = 256;
  // Up to this many tokens moe_experts skips the align step (direct pair tiles, tensor-core
  // GEMV only) and folds the combine into the down GEMV; 0: off (MOESERVE_DECODE_OFF=moe).
  int moe_direct_max_tokens = 1;
  // Router logits + top-k in one kernel (T <= 8). MOESERVE_DECODE_OFF=router: off.
  bool fuse_router = true;
  // add_rms_norm_route as one decode kernel (k_route_dense.cu); MOESERVE_DECODE_OFF=route_dense.
  bool route_norm_dense = true;
  // ... its one-token top-k tail (last_block_tail_t1) rather than the residual loop.
  bool route_fast_tail = true;
  // Router logits as a cuBLASLt GEMM from this many tokens; 0: off (MOESERVE_PREFILL_OFF=router).
  int router_gemm_min_tokens = 64;
  // ... as the split-bf16 tensor-core GEMM rather than the f32 CUDA-core GEMM
  // (MOESERVE_PREFILL_OFF=router_split).
  bool router_split_bf16 = true;
  // ... with the gate split once per gate tensor and kept (MOESERVE_PREFILL_OFF=gate_cache).
  bool gate_split_cache = true;
  // The top-k after the router GEMM: 2 = warp per token with redux.sync, 1 = warp per token
  // with a 64-bit shuffle reduction, 0 = the generic per-token kernel
  // (MOESERVE_PREFILL_OFF=topk_redux: 1, topk: 0).
  int route_topk_warp = 2;
  // The post-attention add + RMSNorm also writes the FP8 experts' input (MOESERVE_PREFILL_OFF=moe_nq).
  bool prefill_moe_norm_quant = true;
  // The FP8 experts' activation quantisations on the 16-byte-load kernel (PREFILL_OFF=moe_quant_vec).
  bool prefill_moe_quant_vec = true;

  // ---- attention, MLA (attention/select_attention.h) ----
  // qk_norm_rope_attention as one kernel (k_attn_decode*.cu) for decode batches of up to this
  // many sequences; 0: off (MOESERVE_DECODE_OFF=attn_decode).
  int attn_decode_max_tokens = 64;
  // Which fused decode attention kernel: 2 = k_attn_decode2.cu (default), 1 = k_attn_decode.cu
  // (which also serves the shapes version 2 refuses). Tests set 1 to cover that fallback.
  int attn_decode_version = 2;
  // Largest split count of version 2 (a power of two <= 16; 16 = non-portable clusters, used
  // only when the device can co-schedule them).
  int attn_decode_max_splits = 8;
  // Prefill attention (>= 64 query tokens of head_dim 128) on the tensor-core kernels:
  bool use_attention_tc = true;
  // ... on the pipelined kernel (k_attn_prefill.cu) rather than k_attn_tc.cu (PREFILL_OFF=attn).
  bool use_attention_prefill = true;
  // ... on the Hopper wgmma kernel (k_attn_wgmma.cu) where the device and build allow it
  // (PREFILL_OFF=attn_wgmma).
  bool use_attention_wgmma = true;
  // Decode-like attention (every sequence 1..32 / G query rows) on k_attn_verify.cu; false:
  // the generic kernel of k_attention.cu.
  bool use_attention_verify = true;
  // MLA (k_mla_flash.cu): bf16 q_abs + o_lat per pass within this many bytes (a long prefill
  // runs in token chunks; tests lower it to cross chunks).
  size_t mla_chunk_bytes = size_t(256) << 20;
  // decode_layer as the persistent one-kernel layer where it applies (MOESERVE_DECODE_MEGA=1).
  // Off by default: faster than the separate ops at 8192 context (5.45 vs 5.73 ms, 30 layers)
  // but slower at 1024 (4.21 vs 3.26 ms); docs/bench/log.md.
  bool decode_mega = false;

  // ---- norm / RoPE (norm_rope/select_norm_rope.h) ----
  // qk_norm_rope_write_kv as one kernel (MOESERVE_DECODE_OFF=qk_kv).
  bool fuse_qk_write_kv = true;
  // Prefill QK-norm + RoPE (>= 512 tokens) on the 16-byte-load kernel (k_rope_prefill.cu);
  // MOESERVE_PREFILL_OFF=qk_rope.
  bool qk_rope_vec = true;

  // ---- capture ----
  // The prefill paths (FP8-activation GEMMs, cuBLASLt, the router GEMM) also run inside captured
  // graphs (decode buckets of >= fp8_act_min_tokens rows). false: captured steps take the
  // previous kernels (the A/B baseline of test_cuda_graphs_big).
  bool prefill_paths_in_graphs = true;

  // "" when every field is in range, else "CudaTuning.<field> = <value>: <why>".
  std::string validate() const;
  // The debug registry's narrowing lists applied to these fields.
  void apply_debug_flags(const DebugFlags& f);
};

// What the device runs: the code the device loaded (code_arch(), k_arch.cu) and the features
// probed once when a backend is made. Named profiles for --explain-dispatch: device_profile().
struct DeviceCaps {
  std::string name;        // profile name or the device's
  int code_arch = 0;       // __CUDA_ARCH__ of the loaded code, rounded to tens (800, 890, 900)
  bool sm90a = false;      // the loaded code is sm_90a (wgmma, setmaxnreg)
  int cc = 0;              // compute capability, major * 10 + minor
  int num_sms = 0;
  bool attn_wgmma = false;  // attention_wgmma_available(): cc 9.x and the cubin has the kernel
  bool fp8_wgmma = false;   // fp8_wgmma_available(): 90a build on a 9.0 device, binary version 90
  // Co-resident 16-block clusters of k_attn_decode2.cu (attn_decode2_max_cluster(16)); asked
  // only when attn_decode_max_splits is 16 (-1: not known yet).
  int max_clusters16 = -1;
  // Blocks of the cooperative sampling kernel resident at once (occupancy x SMs, k_sample.cu).
  int sample_resident = 0;
};
// "h200": sm_90a code on a 9.0 device, 132 SMs (test_cuda_dispatch compares it with a live
// H200). "sm120": an sm_120 card (RTX PRO 6000: 188 SMs) running the default build's compute_80
// PTX (JIT), i.e. the portable paths; its sampling occupancy is assumed (no such card was
// measured). Throws on other names.
DeviceCaps device_profile(const std::string& name);
std::string device_profile_names();  // "h200, sm120"

}  // namespace moeserve
