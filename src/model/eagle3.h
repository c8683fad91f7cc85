// EAGLE-3 draft head in the SpecForge / vLLM checkpoint format (`LlamaForCausalLMEagle3`),
// composed of backend ops. Tensors (shapes: H draft hidden, Ht target hidden, Vd draft vocab):
//   fc.weight [H, 3 Ht]                        over the three captured target hidden states
//   midlayer.input_layernorm.weight [H]         norm of the token embedding
//   midlayer.hidden_norm.weight [H]             norm of the hidden input g
//   midlayer.self_attn.{q,k,v}_proj.weight [heads * D, 2H] over cat(embed, hidden)
//   midlayer.self_attn.o_proj.weight [H, heads * D]
//   midlayer.post_attention_layernorm.weight [H], midlayer.mlp.{gate,up,down}_proj.weight
//   norm.weight [H], lm_head.weight [Vd, H], d2t [Vd] (target id = draft id + d2t[draft id]),
//   t2d [V] bool (optional; checked against d2t), embed_tokens.weight [V, H] (optional: the
//   target's embedding is shared when absent).
// One step over T rows (the training forward of scripts/demo_heads.py, Eagle3):
//   x      = cat(input_layernorm(E(tok)), hidden_norm(g))            [T, 2H]
//   resid  = g + o_proj(attn(rope(q_proj x), rope(k_proj x), v_proj x))   (paged, causal)
//   prenorm = resid + mlp(post_attention_layernorm(resid))
//   logits = lm_head(norm(prenorm))                                   [R, Vd]
// A linear over a concatenation is the sum of linears over its column blocks, so the [2H] and
// [3 Ht] inputs are never materialised.
//
// Tap convention (src/engine/README.md, "Draft heads"): the config's
// `eagle_aux_hidden_state_layer_ids` (top level or in `eagle_config`) are read with the
// convention named by `eagle_aux_hidden_state_convention` (same places):
//   "input_of_layer":  id b = the residual stream entering layer b (vLLM's reading, HF
//                      hidden_states[b]); the demo head's [2, 3, 5] are this.
//   "output_of_layer": id i = the output of layer i = the residual entering layer i + 1
//                      (SpecForge / SGLang; the thoughtworks MiniMax-M2.5 draft's [1, 30, 58]).
// Without the key the ids are ambiguous and refused, except vLLM's default tuple
// (2, L/2, L-3), which both readings' tools produce as boundaries, and a head without ids
// (vLLM's default boundaries then).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/safetensors.h"
#include "model/model.h"

namespace moeserve {

struct Eagle3Config {
  int hidden_size = 0, target_hidden_size = 0, num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  int intermediate_size = 0, draft_vocab_size = 0, vocab_size = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  std::vector<int> layer_ids;   // as written in the config
  std::string convention;       // "input_of_layer" / "output_of_layer" / "" (vLLM default ids)
  std::vector<int> boundaries;  // what the target captures: residual entering layer b
  // Reads dir/config.json and resolves the taps for `target` (throws naming the key).
  static Eagle3Config from_dir(const std::string& dir, const ModelDesc& target);
};

struct Eagle3StepArgs {
  const Tensor* ids = nullptr;  // [T] I32: the token of each row
  const Tensor* g = nullptr;    // [T, H]: fc(taps) or the previous step's prenorm
  const AttentionMeta* meta = nullptr;
  KVCacheLayer* kv = nullptr;   // the draft's own cache (one layer)
  const Tensor* rows = nullptr; // [R] I32: rows to produce logits for
};

class Eagle3Head {
 public:
  // `target_embed`: the target's embedding [V, H] (device), used when the draft ships none.
  Eagle3Head(Eagle3Config cfg, Backend& backend, const Tensor& target_embed);
  // Checks every tensor (name, shape, dtype, d2t range, t2d agreement) and uploads.
  void load(const Checkpoint& ckpt);
  const Eagle3Config& config() const { return cfg_; }
  KvLayout kv_layout() const { return KvLayout{1, cfg_.num_key_value_heads, cfg_.head_dim, cfg_.head_dim}; }
  // g [T, H] = fc(cat(taps)): taps[i] [T, Ht] in the config's tap order. Returns a view.
  Tensor fc(const std::vector<Tensor>& taps);
  // One draft step; returns logits [R, Vd] (valid until the next call). prenorm() is the
  // step's [T, H] output before `norm` (the next chained step's g).
  Tensor step(const Eagle3StepArgs& a);
  const Tensor& prenorm() const { return prenorm_; }
  int32_t to_target(int32_t draft_id) const { return draft_id + d2t_[size_t(draft_id)]; }

 private:
  void reserve(int64_t T, int64_t R);
  Eagle3Config cfg_;
  Backend& be_;
  Tensor embed_;
  std::vector<LinearWeight> fc_;           // 3 x [H, Ht]
  Tensor in_norm_, hid_norm_, post_norm_, norm_;
  LinearWeight q_e_, q_h_, k_e_, k_h_, v_e_, v_h_, o_;  // column halves of q/k/v_proj
  ExpertWeights mlp_;
  LinearWeight lm_head_;
  std::vector<int32_t> d2t_;
  // Workspace (grow-only).
  int64_t max_t_ = 0, max_r_ = 0;
  Tensor g_, tmp_h_, xe_, xh_, q_, k_, v_, tmp_q_, tmp_kv_, attn_, o_out_, resid_, h_, gate_, up_, m_, xn_, sel_,
      logits_, prenorm_;
};

}  // namespace moeserve
