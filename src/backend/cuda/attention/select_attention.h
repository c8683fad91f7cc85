// The attention family's kernel selectors: paged attention (decode, verify, prefill, mixed),
// the fused decode layer part qk_norm_rope_attention, and MLA. Pure host code
// (common/select_common.h); cuda_attention.cpp and cuda_backend.cpp launch what they name.
#pragma once
#include <string>

#include "backend/cuda/common/select_common.h"

namespace moeserve::cuda {

struct AttentionOpDesc {
  int T = 0, num_seqs = 0, max_query_len = 0, max_context_len = 0;
  int Hq = 0, Hkv = 0, D = 0, block_size = 0;
  int v_head_dim = 0;  // 0 or D (V head dim != K head dim: unsupported)
  bool kv_fp8 = false;  // e4m3 cache (else bf16)
  WorkspaceView ws;     // attn_part: split-KV partials
};

struct AttentionKernel {
  enum Id : uint8_t {
    kUnsupported,  // V head dim != K head dim
    kVerify,       // k_attn_verify.cu (decode-like steps: every sequence <= 32 / G query rows)
    kWgmma,        // k_attn_wgmma.cu / k_attn_ws.cu (Hopper prefill)
    kPrefill,      // k_attn_prefill.cu (pipelined mma.sync prefill)
    kTc,           // k_attn_tc.cu
    kGeneric,      // k_attention.cu (split-KV when the grid is small)
    // qk_norm_rope_attention only:
    kDecode2,      // k_attn_decode2.cu (norm + RoPE + KV write + attention, tensor-core key loop)
    kDecode1,      // k_attn_decode.cu (the same, scalar key loop)
    kUnfused,      // qk_norm_rope_write_kv, then attention (see `then`)
  };
  Id id = kGeneric;
  int splits = 1;       // KV splits (merged by a combine kernel or in the cluster)
  Id then = kGeneric;   // kUnfused: attention()'s kernel
  int then_splits = 1;
  const char* name() const { return id_name(id); }
  static const char* id_name(Id id);
  std::string describe() const;
  bool operator==(Id o) const { return id == o; }
};

AttentionKernel select_attention(const AttentionOpDesc& d, const DeviceCaps& caps, const CudaTuning& t);

// qk_norm_rope_attention: the QK-norm / RoPE part that the fused decode kernels also read.
struct DecodeAttnOpDesc {
  AttentionOpDesc attn;
  bool fast_spec = true;  // full-width QK-norm, plain NeoX RoPE (else the Backend default body)
  bool act_bf16 = true, w_bf16 = true;  // q/k and the norm weights
  int rope_head_dim = 0, rotary_dim = 0, q_width = 0, k_width = 0, qk_T = 0;
};
AttentionKernel select_decode_attention(const DecodeAttnOpDesc& d, const DeviceCaps& caps, const CudaTuning& t);

struct MlaOpDesc {
  int T = 0, num_seqs = 0, max_query_len = 0, max_context_len = 0;
  int H = 0, nope = 0, R = 0, C = 0, V = 0;  // heads, qk_nope / qk_rope / v head dims, kv_lora_rank
  bool cache_fp8 = false;
  WorkspaceView ws;
};
struct MlaKernel {
  enum Id : uint8_t { kUnsupported, kFlash };  // k_mla.cu projections around k_mla_flash.cu
  Id id = kFlash;
  int chunk = 0;   // tokens per pass
  int splits = 1;  // KV splits of the flash kernel
  int passes = 1;
  const char* name() const { return id == kFlash ? "mla_flash" : "unsupported"; }
  std::string describe() const;
  bool operator==(Id o) const { return id == o; }
};
MlaKernel select_mla(const MlaOpDesc& d, const DeviceCaps& caps, const CudaTuning& t);
// "" when the CUDA MLA kernels take these dims (rope even and <= 64, kv_lora_rank <= 512).
std::string mla_dims_problem(const MlaOpDesc& d);
// The workspace bytes of one MLA pass (q_abs + o_lat, then the split partials).
size_t mla_head_bytes(int Tc, int H, int C, int R);
size_t mla_split_bytes(int Tc, int H, int C);

}  // namespace moeserve::cuda
