// Typed model configuration parsed from a checkpoint's config.json. Unknown keys are kept
// in `raw`; missing required keys or wrong types fail at load naming the field.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace moeserve {

struct QuantizationConfig {
  std::string quant_method;       // "fp8" or "" (none)
  std::string fmt;                // "float8_e4m3fn"
  std::string activation_scheme;  // "dynamic"
  int block_out = 0, block_in = 0;  // weight_block_size [out, in]
  std::vector<std::string> modules_to_not_convert;
  bool enabled() const { return !quant_method.empty(); }
};

// MiniMax-M2 / M2.5 (model_type "minimax_m2"); see shared/reference/minimax-m2.md §1.
struct MiniMaxM2Config {
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
  nlohmann::json to_json() const;  // hub-style config.json
};

}  // namespace moeserve
