// select_qk_norm_rope.
#include "backend/cuda/norm_rope/select_norm_rope.h"

namespace moeserve::cuda {

const char* QkNormRopeKernel::id_name(Id id) {
  switch (id) {
    case kGeneric: return "qk_norm_rope_generic";
    case kRopeVec: return "qk_rope_vec";
    case kCluster8: return "qk_norm_rope_cluster8";
    case kPerToken: return "qk_norm_rope";
  }
  return "?";
}

std::string QkNormRopeKernel::describe() const {
  std::string s = name();
  if (separate_write_kv) s += "+write_kv";
  return s;
}

namespace {
bool pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }
}  // namespace

bool qk_rope_vec_shape(const QkNormRopeOpDesc& d) {
  const int D = d.head_dim, rot = d.rotary_dim;
  constexpr int kThreads = 256, kQV = 4, kKV = 1, kMaxHalf = 128;
  return d.act_bf16 && d.w_bf16 && (!d.write_kv || d.cache_bf16) && D % 8 == 0 && pow2(D / 8) && D / 8 <= 32 &&
         rot % 16 == 0 && rot <= D && rot / 2 <= kMaxHalf && pow2(rot / 16) && d.q_width % D == 0 &&
         d.k_width % D == 0 && d.q_width <= 8 * kThreads * kQV && d.k_width <= 8 * kThreads * kKV && d.aligned;
}

QkNormRopeKernel select_qk_norm_rope(const QkNormRopeOpDesc& in, const DeviceCaps& caps, const CudaTuning& t) {
  QkNormRopeOpDesc d = in;
  QkNormRopeKernel k;
  if (d.write_kv && !t.fuse_qk_write_kv) {  // the norm + RoPE kernel, then write_kv
    d.write_kv = false;
    k.separate_write_kv = true;
  }
  if (!d.fast_spec) {
    k.id = QkNormRopeKernel::kGeneric;
    k.separate_write_kv = d.write_kv || k.separate_write_kv;
    return k;
  }
  if (d.T >= limits::kQkRopeVecMinTokens && t.qk_rope_vec && qk_rope_vec_shape(d))
    k.id = QkNormRopeKernel::kRopeVec;
  else
    k.id = d.T < 64 && caps.code_arch >= 900 ? QkNormRopeKernel::kCluster8 : QkNormRopeKernel::kPerToken;
  return k;
}

}  // namespace moeserve::cuda
