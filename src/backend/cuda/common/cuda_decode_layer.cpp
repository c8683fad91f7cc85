// CudaBackend::decode_layer: a batch-1 decode layer as one persistent kernel
// (k_decode_layer.cu) where every shape qualifies, else the default body (the separate ops).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <initializer_list>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/decode_layer.h"
#include "backend/cuda/common/kernels.h"
#include "core/debug_flags.h"
#include "core/error.h"
#include "core/log.h"

namespace moeserve {
using namespace cuda;

void CudaBackend::decode_layer(const DecodeLayerArgs& a) {
  if (tuning.decode_mega && decode_layer_mega(a)) {
    ++mega_launches_;
    return;
  }
  Backend::decode_layer(a);
}

// Returns false (nothing launched, reason in mega_why_) where the kernel does not apply.
bool CudaBackend::decode_layer_mega(const DecodeLayerArgs& a) {
  DecodeLayerParams p;
  if (!mega_params(a, &p)) return false;
  launch_decode_layer(p, mega_grid_, stream_);
  return true;
}

bool CudaBackend::mega_params(const DecodeLayerArgs& a, DecodeLayerParams* out) {
  auto refuse = [&](const char* why) {
    ++mega_refusals_;
    if (mega_why_ != why && a.meta->num_tokens == 1) spdlog::debug("decode_layer: separate ops ({})", why);
    mega_why_ = why;
    return false;
  };
  const AttentionMeta& m = *a.meta;
  if (m.num_tokens != 1 || m.num_seqs != 1 || m.max_query_len != 1) return refuse("not one decode token");
  auto fp8_128 = [](const LinearWeight* w) {
    return w->fp8() && w->block_out == 128 && w->block_in == 128 && w->scale_inv.dtype == DType::F32 &&
           w->weight.device == Device::CUDA;
  };
  if (!fp8_128(a.wq) || !fp8_128(a.wk) || !fp8_128(a.wv) || !fp8_128(a.wo)) return refuse("linears not FP8 128x128");
  const QkNormRopeArgs& qk = *&a.qk;
  const AttentionArgs& at = a.attn_args;
  if (qk.q_sum_squares || qk.k_sum_squares) return refuse("tensor-parallel QK-norm");
  if (!qk_fast_spec(qk)) return refuse("QK-norm mode / RoPE spec");
  if (!a.moe->route.sigmoid_renorm()) return refuse("routing spec");
  if (at.head_dim != 128 || qk.rope.head_dim != 128) return refuse("head_dim != 128");
  const int H = int(a.residual->dim(-1)), Hq = at.num_q_heads, Hkv = at.num_kv_heads, D = 128;
  const MoeWeights& moe = *a.moe;
  if (qk.q_full_width && qk.q_full_width != int64_t(Hq) * D) return refuse("QK-norm width");
  if (qk.k_full_width && qk.k_full_width != int64_t(Hkv) * D) return refuse("QK-norm width");
  for (const Tensor* t : std::initializer_list<const Tensor*>{a.residual, a.moe_out, a.x, a.attn, a.input_norm, a.post_attention_norm, qk.q_norm_weight,
                          qk.k_norm_weight, &a.kv->k, &a.kv->v})
    if (t->dtype != DType::BF16 || t->device != Device::CUDA) return refuse("activations / norms / cache not BF16");
  if (a.wq->out_features() != Hq * D || a.wq->in_features() != H || a.wk->out_features() != Hkv * D ||
      a.wk->in_features() != H || a.wv->out_features() != Hkv * D || a.wv->in_features() != H ||
      a.wo->out_features() != H || a.wo->in_features() != Hq * D || qk.q_norm_weight->numel() != Hq * D ||
      qk.k_norm_weight->numel() != Hkv * D || a.kv->k.rank() != 4 || a.kv->k.dim(2) * a.kv->k.dim(3) != Hkv * D)
    return refuse("shapes");
  if (moe.gate.dtype != DType::F32 || moe.gate.dim(0) != moe.num_experts || moe.gate.dim(1) != H)
    return refuse("router gate not f32 [E, H]");
  if (moe.score_bias.defined() && (moe.score_bias.dtype != DType::F32 || moe.score_bias.numel() != moe.num_experts))
    return refuse("router bias");
  if (moe.first_local_expert != 0 || int(moe.experts.size()) != moe.num_experts) return refuse("experts not all local");
  if (a.routing->expert_ids.numel() < moe.top_k || a.routing->weights.numel() < moe.top_k) return refuse("routing");
  if (!aligned16({a.residual->data, a.moe_out->data, a.x->data, a.attn->data})) return refuse("alignment");
  if (capturing_ && !expert_tables_.count(&moe)) return refuse("expert table not built before capture");
  int I = 0;
  const ExpertPtrs* ep = expert_ptrs_fp8(moe, &I);
  if (!ep) return refuse("experts not FP8 128x128");

  DecodeLayerParams& p = *out;
  p = DecodeLayerParams{};
  p.residual = a.residual->data;
  p.moe_in = a.first ? nullptr : a.moe_out->data;
  p.x_in = a.x->data;
  p.moe_out = a.moe_out->data;
  p.attn = a.attn->data;
  p.in_norm = a.input_norm->data, p.post_norm = a.post_attention_norm->data;
  p.q_norm = qk.q_norm_weight->data, p.k_norm = qk.k_norm_weight->data;
  p.eps = a.eps;
  p.wq = static_cast<const uint8_t*>(a.wq->weight.data), p.sq = a.wq->scale_inv.ptr<float>();
  p.wk = static_cast<const uint8_t*>(a.wk->weight.data), p.sk = a.wk->scale_inv.ptr<float>();
  p.wv = static_cast<const uint8_t*>(a.wv->weight.data), p.sv = a.wv->scale_inv.ptr<float>();
  p.wo = static_cast<const uint8_t*>(a.wo->weight.data), p.so = a.wo->scale_inv.ptr<float>();
  p.gate = moe.gate.ptr<float>();
  p.bias = moe.score_bias.defined() ? moe.score_bias.ptr<float>() : nullptr;
  p.experts = ep;
  p.H = H, p.Hq = Hq, p.Hkv = Hkv, p.I = I, p.E = moe.num_experts, p.top_k = moe.top_k;
  p.rotary_dim = qk.rope.rotary_dim, p.theta = qk.rope.theta, p.scale = at.scale;
  p.kc = a.kv->k.data, p.vc = a.kv->v.data;
  p.block_table = m.block_tables.ptr<int32_t>(), p.context_lens = m.context_lens.ptr<int32_t>();
  p.positions = m.positions.ptr<int32_t>(), p.slots = m.slot_mapping.ptr<int32_t>();
  p.block_size = int(a.kv->k.dim(1));
  p.num_slots = a.kv->k.dim(0) * a.kv->k.dim(1);
  p.ids = a.routing->expert_ids.ptr<int32_t>(), p.rw = a.routing->weights.ptr<float>();
  // MOESERVE_MEGA_TIMING (diagnostic build; core/debug_flags.h).
  static const bool timing = debug_flags().mega_timing;
  if (timing) {
    if (!mega_timing_) {
      if (capturing_) return refuse("timing buffer not made before capture");
      CUDA_CHECK(cudaMalloc(&mega_timing_, 32 * sizeof(unsigned long long)));
      CUDA_CHECK(cudaMemset(mega_timing_, 0, 32 * sizeof(unsigned long long)));
    }
    p.timing = static_cast<unsigned long long*>(mega_timing_);
  }
  if (mega_grid_ < 0) {
    const int per_sm = decode_layer_blocks_per_sm();
    mega_grid_ = per_sm >= 1 ? num_sms_ : 0;  // one block per SM
  }
  if (const char* why = decode_layer_unsupported(p, mega_grid_); *why) return refuse(why);
  // One zeroed workspace per shape: the kernel leaves its accumulators zero, but the layout
  // moves with the shapes, so another shape's leftovers (logits, partials) would sit in them.
  const std::string key = fmt::format("{}/{}/{}/{}/{}/{}", H, Hq, Hkv, I, p.E, p.top_k);
  auto it = mega_ws_.find(key);
  if (it == mega_ws_.end()) {
    if (capturing_) return refuse("workspace not made before capture");
    const size_t bytes = size_t(decode_layer_ws_floats(p)) * sizeof(float) + 256;
    void* d = nullptr;
    CUDA_CHECK(cudaMalloc(&d, bytes));
    CUDA_CHECK(cudaMemset(d, 0, bytes));
    it = mega_ws_.emplace(key, d).first;
  }
  if (mega_launches_ == 0)
    spdlog::info("decode_layer: persistent kernel, {} blocks (H {}, {}/{} heads, {} experts top-{}, I {})", mega_grid_,
                 H, Hq, Hkv, p.E, p.top_k, I);
  p.bar = static_cast<unsigned*>(it->second);
  p.ws = reinterpret_cast<float*>(static_cast<char*>(it->second) + 256);
  return true;
}

void CudaBackend::print_mega_timing() {
  if (!mega_timing_) return;
  unsigned long long t[32] = {};
  if (cudaMemcpy(t, mega_timing_, sizeof(t), cudaMemcpyDeviceToHost) != cudaSuccess || t[15] == 0) return;
  static const char* names[13] = {"P1 norm+qkv",  "B1",     "P2 attention", "B2",        "P3 o_proj", "gate+B4", "P4 norm+logits",
                                  "B5",           "top-k",  "P5 up",        "B6",        "P6 down",   "B7"};
  std::string line;
  double total = 0;
  for (int i = 0; i < 13; ++i) total += double(t[i]) / t[15];
  for (int i = 0; i < 13; ++i) line += fmt::format(" {} {:.1f}", names[i], double(t[i]) / t[15] / 1000.0);
  spdlog::info("decode_layer timing (block 0, us per layer over {} layers, total {:.1f}):{}; P2 = q/k sums {:.1f} + "
               "staging/normalise {:.1f} + keys/merge {:.1f}",
               t[15], total / 1000.0, line, double(t[16]) / t[15] / 1000.0, double(t[17]) / t[15] / 1000.0,
               double(t[18]) / t[15] / 1000.0);
}

}  // namespace moeserve
