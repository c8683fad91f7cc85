// The fused decoder-layer op (Backend::decode_layer): one pre-norm attention + MoE layer of a
// step on one rank (no tensor parallelism), in the order a model runs it:
//   [residual += moe_out; x = rmsnorm(residual) * input_norm]  (x as given on the first layer)
//   q/k/v = x @ W^T; QK-norm + RoPE + KV write + attention -> attn (qk.norm / qk.rope specs)
//   o = attn @ Wo^T; residual += o; x = rmsnorm(residual) * post_attention_norm
//   routing (moe->route spec); moe_out = experts(x)
// Afterwards residual, moe_out, routing and the KV cache hold the layer's results; x, q, k,
// v, attn and o are workspaces whose contents are unspecified. Architecture-neutral: the
// specs inside the args say what the layer is; a backend runs a fused kernel only for the
// specs it implements and the reference body (decode_layer_op.cpp) otherwise.
#pragma once
#include "backend/backend.h"

namespace moeserve {

struct DecodeLayerArgs {
  bool first = false;  // first layer: *x already holds rmsnorm(residual), moe_out is not added
  Tensor* residual = nullptr;  // [T, H]
  Tensor* moe_out = nullptr;   // [T, H]: in, the previous layer's expert output; out, this layer's
  Tensor *x = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr, *o = nullptr;
  const Tensor* input_norm = nullptr;
  const Tensor* post_attention_norm = nullptr;
  float eps = 1e-6f;
  const LinearWeight *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  const MoeWeights* moe = nullptr;
  MoeRouting* routing = nullptr;
  QkNormRopeArgs qk;      // qk.q == q, qk.k == k
  AttentionArgs attn_args;  // attn_args.q == q, .out == attn, .kv == kv, .meta == meta
  KVCacheLayer* kv = nullptr;
  const AttentionMeta* meta = nullptr;
};

}  // namespace moeserve
