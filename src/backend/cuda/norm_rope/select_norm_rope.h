// The norm / RoPE family's kernel selector: qk_norm_rope (with or without the KV write). The
// row norms (rms_norm, add_rms_norm) have one kernel each (k_elementwise.cu); the norms fused
// into other ops are chosen by those ops' selectors (linear, MoE route). Pure host code.
#pragma once
#include <string>

#include "backend/cuda/common/select_common.h"

namespace moeserve::cuda {

struct QkNormRopeOpDesc {
  int T = 0;
  bool fast_spec = true;   // full-width QK-norm with plain NeoX RoPE (else the generic kernel)
  bool act_bf16 = true, w_bf16 = true;
  bool write_kv = false;   // qk_norm_rope_write_kv
  bool cache_bf16 = true;  // (write_kv) the cache is bf16 (else e4m3 or f32)
  int head_dim = 0, rotary_dim = 0, q_width = 0, k_width = 0;
  bool aligned = true;     // q, k, the weights, v and the caches 16-byte aligned
};

struct QkNormRopeKernel {
  enum Id : uint8_t {
    kGeneric,   // k_generic.cu (per-head / no norm, scaled RoPE), then write_kv
    kRopeVec,   // k_rope_prefill.cu (>= 512 tokens, 16-byte loads)
    kCluster8,  // k_elementwise.cu, a cluster of 8 blocks per token (few tokens, sm_90 code)
    kPerToken,  // k_elementwise.cu, one block per token
  };
  Id id = kPerToken;
  bool separate_write_kv = false;  // write_kv as its own kernel after this one
  const char* name() const { return id_name(id); }
  static const char* id_name(Id id);
  std::string describe() const;
  bool operator==(Id o) const { return id == o; }
};

QkNormRopeKernel select_qk_norm_rope(const QkNormRopeOpDesc& d, const DeviceCaps& caps, const CudaTuning& t);
// k_rope_prefill.cu's shape rule (with t.qk_rope_vec): launch_qk_rope_vec checks the same.
bool qk_rope_vec_shape(const QkNormRopeOpDesc& d);

}  // namespace moeserve::cuda
