// MiniMax-M2 / M2.5 (architectures[0] "MiniMaxM2ForCausalLM", model_type "minimax_m2"): the
// typed config and the model, on the shared decoder layers (model/layers/decoder.h). See
// shared/reference/minimax-m2.md. The forward pass:
//   h = embed[ids]
//   per layer: x = RMSNorm(h); q,k,v = x Wq/Wk/Wv; full-width QK-norm; partial NeoX RoPE;
//              paged causal GQA attention; h += o Wo;
//              x = RMSNorm(h); sigmoid router (bias for selection only, renormalised top-k);
//              h += sum_k w_k SwiGLU_e(x)
//   logits = RMSNorm(h) lm_head^T for the requested rows.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/layers/decoder.h"

namespace moeserve {

// The fields of config.json (shared/reference/minimax-m2.md §1). Unknown keys are kept in
// `raw`; missing required keys or wrong types fail at load naming the field.
struct MiniMaxM2Config : ArchConfig {
  std::vector<std::string> architectures;
  std::string model_type;
  int hidden_size = 0;
  int num_hidden_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;
  int rotary_dim = 0;  // from rotary_dim, or head_dim * partial_rotary_factor (top level or rope_parameters)
  double rope_theta = 0;  // rope_theta or rope_parameters.rope_theta
  int max_position_embeddings = 0;
  int intermediate_size = 0;
  int shared_intermediate_size = 0;
  int num_local_experts = 0;
  int num_experts_per_tok = 0;
  std::string scoring_func = "sigmoid";
  bool use_routing_bias = true;
  bool use_qk_norm = true;
  std::string qk_norm_type = "per_layer";
  std::string hidden_act = "silu";
  double rms_norm_eps = 1e-6;
  std::vector<int> attn_type_list;
  int vocab_size = 0;
  bool tie_word_embeddings = false;
  std::optional<int> bos_token_id, eos_token_id;
  std::string torch_dtype;
  bool use_mtp = false;
  int num_mtp_modules = 0;
  int mtp_transformer_layers = 0;
  double routed_scaling_factor = 1.0;
  QuantizationConfig quantization;
  nlohmann::json raw;

  static MiniMaxM2Config from_json(const nlohmann::json& j);  // throws naming the field
  // overrides_json (--hf-overrides): a JSON object merged into config.json (RFC 7386 merge
  // patch, as vLLM updates the HF config) before the fields are read.
  static MiniMaxM2Config from_file(const std::string& config_json_path, const std::string& overrides_json = "");
  nlohmann::json to_json() const override;  // hub-style config.json

  ModelDesc desc() const override;
  std::vector<WeightDecl> weights(const ParallelConfig& par) const override;
  std::string shard_problem(const ParallelConfig& par) const override;
  std::string fp8_split_problem(const ParallelConfig& par) const override;
  bool is_skipped_tensor(const std::string& name) const override;  // MTP modules
  DecoderSpec decoder_spec() const;
};

// MiniMax-M2's vocabulary for the shared decoder types.
using MiniMaxM2Shard = DecoderShard;
using MiniMaxM2Layer = DecoderLayer;
using MiniMaxM2Weights = DecoderWeights;
using MiniMaxM2Workspace = DecoderWorkspace;

MiniMaxM2Shard plan_shard(const MiniMaxM2Config& cfg, const ParallelConfig& par);
// FP8 splits that cut weight blocks ("" when none; see decoder_fp8_split_problem).
std::string fp8_split_problem(const MiniMaxM2Config& cfg, const ParallelConfig& par);
// Every tensor of the main model with its global shape, accepted dtypes and shard spec.
std::vector<WeightDecl> declare_minimax_m2_weights(const MiniMaxM2Config& cfg, const ParallelConfig& par);
// MTP module tensors of this config (model.layers.{L+i}.*, i < num_mtp_modules).
inline bool is_mtp_tensor(const MiniMaxM2Config& cfg, const std::string& name) {
  return is_mtp_tensor(cfg.num_hidden_layers, cfg.num_mtp_modules, name);
}
// The hub names of MiniMax-M2's tensors.
DecoderNames minimax_m2_names();

class MiniMaxM2Model final : public DecoderModel {
 public:
  // Validates the config for this parallel layout; throws naming the problem.
  MiniMaxM2Model(MiniMaxM2Config cfg, Backend& backend, ParallelConfig par, AllReduceFn all_reduce = {});
  const MiniMaxM2Config& config() const override { return cfg_; }
  void load(const Checkpoint& ckpt) override;
  // One KV layer per model layer: [num_blocks, block_size, kv_heads_local, head_dim].
  std::vector<KVCacheLayer> allocate_kv_cache(int num_blocks, int block_size, DType dtype) const {
    return moeserve::allocate_kv_cache(be_, kv_layout(), num_blocks, block_size, dtype);
  }
  Tensor forward(const Tensor& ids, const AttentionMeta& meta, std::vector<KVCacheLayer>& kv,
                 const Tensor& rows) override;

 private:
  MiniMaxM2Config cfg_;
};

}  // namespace moeserve
