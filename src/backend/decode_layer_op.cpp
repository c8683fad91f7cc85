// Reference bodies of Backend::decode_layer / decode_layers: the separate ops, in order.
#include "backend/decode_layer_op.h"

namespace moeserve {

void Backend::decode_layer(const DecodeLayerArgs& a) {
  const LinearWeight* w[3] = {a.wq, a.wk, a.wv};
  Tensor* outs[3] = {a.q, a.k, a.v};
  if (a.first)
    linear_multi(*a.x, w, outs, 3);
  else
    add_rms_norm_linear_multi(*a.residual, *a.moe_out, *a.input_norm, a.eps, *a.x, w, outs, 3);
  qk_norm_rope_attention(a.qk, *a.v, *a.kv, *a.meta, a.attn_args);
  linear(*a.attn, *a.wo, *a.o);
  add_rms_norm_route(*a.residual, *a.o, *a.post_attention_norm, a.eps, *a.x, *a.moe, *a.routing);
  moe_experts(*a.x, *a.moe, *a.routing, *a.moe_out);
}

void Backend::decode_layers(const DecodeLayerArgs* layers, int n) {
  for (int i = 0; i < n; ++i) decode_layer(layers[i]);
}

}  // namespace moeserve
