// MiniMaxM2Config parsing (shared/reference/minimax-m2.md §1). Every field is type-checked
// and named in errors; combinations the model code cannot run fail here, at load.
#include <cmath>

#include "core/error.h"
#include "core/log.h"
#include "model/arch/minimax_m2.h"

namespace moeserve {
using json = nlohmann::json;
using namespace config_json;

MiniMaxM2Config MiniMaxM2Config::from_json(const json& j) {
  MS_CHECK(j.is_object(), "config.json: top level must be an object");
  MiniMaxM2Config c;
  c.raw = j;
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (a.is_string()) c.architectures.push_back(a.get<std::string>());
  c.model_type = get_string(j, "model_type", "");
  MS_CHECK(c.model_type == "minimax_m2" || c.model_type == "minimax_m2_5",
           "config.json: model_type '{}' is not minimax_m2", c.model_type);

  c.hidden_size = get_int(j, "hidden_size");
  c.num_hidden_layers = get_int(j, "num_hidden_layers");
  c.num_attention_heads = get_int(j, "num_attention_heads");
  // Defaults as HF MiniMaxM2Config (the reference): 8 KV heads, head_dim 128 (not hidden/heads).
  c.num_key_value_heads = get_int(j, "num_key_value_heads", 8);
  MS_CHECK(c.hidden_size > 0 && c.num_hidden_layers > 0 && c.num_attention_heads > 0 && c.num_key_value_heads > 0,
           "config.json: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads must be positive");
  c.head_dim = get_int(j, "head_dim", 128);
  MS_CHECK(c.head_dim > 0, "config.json: head_dim must be positive");
  MS_CHECK(c.num_attention_heads % c.num_key_value_heads == 0,
           "config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}", c.num_attention_heads,
           c.num_key_value_heads);

  // RoPE: theta at top level or in rope_parameters (HF v5) / rope_scaling's default type.
  // Rotary width: rotary_dim (vLLM/SGLang), else partial_rotary_factor at top level or in
  // rope_parameters (HF v5); if several are given they must agree.
  // As HF v5: a non-empty rope_scaling replaces rope_parameters; values inside the dict win
  // over top-level rope_theta / partial_rotary_factor.
  const json* rp = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    MS_CHECK(j[key].is_object(), "config.json: '{}' must be an object, got {}", key, j[key].dump());
    if (j[key].empty()) continue;
    rp = &j[key];
    const std::string rt = get_string(*rp, "rope_type", get_string(*rp, "type", "default"));
    MS_CHECK(rt == "default", "config.json: {}.rope_type '{}' is not supported (only default)", key, rt);
  }
  if (rp && rp->contains("rope_theta") && !(*rp)["rope_theta"].is_null())
    c.rope_theta = get_double(*rp, "rope_theta");
  else if (j.contains("rope_theta") && !j["rope_theta"].is_null())
    c.rope_theta = get_double(j, "rope_theta");
  else
    c.rope_theta = 5000000.0;  // HF MiniMaxM2Config.default_theta
  MS_CHECK(c.rope_theta > 0, "config.json: rope_theta must be positive");

  std::vector<std::pair<std::string, int>> widths;
  if (j.contains("rotary_dim") && !j["rotary_dim"].is_null()) widths.push_back({"rotary_dim", get_int(j, "rotary_dim")});
  auto from_factor = [&](const json& o, const std::string& where) {
    if (o.contains("partial_rotary_factor") && !o["partial_rotary_factor"].is_null()) {
      double f = get_double(o, "partial_rotary_factor");
      MS_CHECK(f > 0 && f <= 1, "config.json: {} {} must be in (0, 1]", where, f);
      // HF: dim = int(head_dim * partial_rotary_factor) (truncation, in double).
      widths.push_back({where, int(double(c.head_dim) * f)});
    }
  };
  from_factor(j, "partial_rotary_factor");
  if (rp) from_factor(*rp, "rope_parameters.partial_rotary_factor");
  c.rotary_dim = widths.empty() ? c.head_dim : widths[0].second;
  for (const auto& [src, w] : widths)
    MS_CHECK(w == c.rotary_dim, "config.json: rotary width disagrees: {} gives {}, {} gives {}", widths[0].first,
             c.rotary_dim, src, w);
  MS_CHECK(c.rotary_dim > 0 && c.rotary_dim <= c.head_dim && c.rotary_dim % 2 == 0,
           "config.json: rotary_dim {} must be even and in (0, head_dim {}]", c.rotary_dim, c.head_dim);

  c.max_position_embeddings = get_int(j, "max_position_embeddings", 196608);
  c.intermediate_size = get_int(j, "intermediate_size");
  c.shared_intermediate_size = get_int(j, "shared_intermediate_size", 0);
  MS_CHECK(c.shared_intermediate_size == 0, "config.json: shared_intermediate_size {} (a shared expert) is not supported",
           c.shared_intermediate_size);
  // HF's attribute_map aliases num_experts to num_local_experts.
  c.num_local_experts = j.contains("num_local_experts") || !j.contains("num_experts")
                            ? get_int(j, "num_local_experts")
                            : get_int(j, "num_experts");
  c.num_experts_per_tok = get_int(j, "num_experts_per_tok");
  MS_CHECK(c.intermediate_size > 0 && c.num_local_experts > 0, "config.json: intermediate_size and num_local_experts must be positive");
  MS_CHECK(c.num_experts_per_tok > 0 && c.num_experts_per_tok <= c.num_local_experts,
           "config.json: num_experts_per_tok {} must be in [1, num_local_experts {}]", c.num_experts_per_tok,
           c.num_local_experts);
  c.scoring_func = get_string(j, "scoring_func", "sigmoid");
  MS_CHECK(c.scoring_func == "sigmoid", "config.json: scoring_func '{}' is not supported (only sigmoid)", c.scoring_func);
  c.use_routing_bias = get_bool(j, "use_routing_bias", true);
  c.use_qk_norm = get_bool(j, "use_qk_norm", true);
  c.qk_norm_type = get_string(j, "qk_norm_type", "per_layer");
  MS_CHECK(!c.use_qk_norm || c.qk_norm_type == "per_layer",
           "config.json: qk_norm_type '{}' is not supported (only per_layer)", c.qk_norm_type);
  c.hidden_act = get_string(j, "hidden_act", "silu");
  MS_CHECK(c.hidden_act == "silu", "config.json: hidden_act '{}' is not supported (only silu)", c.hidden_act);
  c.rms_norm_eps = get_double(j, "rms_norm_eps", 1e-6);
  MS_CHECK(c.rms_norm_eps >= 0, "config.json: rms_norm_eps {} must be >= 0", c.rms_norm_eps);
  if (j.contains("attn_type_list") && !j["attn_type_list"].is_null()) {
    const json& a = j["attn_type_list"];
    MS_CHECK(a.is_array(), "config.json: attn_type_list must be a list");
    for (const auto& x : a) {
      MS_CHECK(x.is_number_integer(), "config.json: attn_type_list must hold integers");
      MS_CHECK(x.get<int>() == 1, "config.json: attn_type_list holds {} (only 1 = full softmax attention is supported)",
               x.dump());
      c.attn_type_list.push_back(x.get<int>());
    }
    MS_CHECK(int(c.attn_type_list.size()) == c.num_hidden_layers,
             "config.json: attn_type_list has {} entries for {} layers", c.attn_type_list.size(), c.num_hidden_layers);
  }
  if (j.contains("sliding_window") && !j["sliding_window"].is_null())
    fail("config.json: sliding_window {} is not supported for minimax_m2", j["sliding_window"].dump());
  c.vocab_size = get_int(j, "vocab_size");
  MS_CHECK(c.vocab_size > 0, "config.json: vocab_size must be positive");
  // Sanity bounds, far above any real model, so a corrupt config fails here instead of
  // declaring billions of tensors or overflowing sizes.
  bound("num_hidden_layers", c.num_hidden_layers, 4096);
  bound("num_local_experts", c.num_local_experts, 65536);
  bound("num_hidden_layers * num_local_experts", int64_t(c.num_hidden_layers) * c.num_local_experts, 1 << 22);
  bound("hidden_size", c.hidden_size, 1 << 20);
  bound("intermediate_size", c.intermediate_size, 1 << 22);
  bound("num_attention_heads", c.num_attention_heads, 1 << 14);
  bound("head_dim", c.head_dim, 1 << 14);
  bound("vocab_size", c.vocab_size, 1 << 26);
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", false);
  c.bos_token_id = get_token_id(j, "bos_token_id");
  c.eos_token_id = get_token_id(j, "eos_token_id");
  c.torch_dtype = get_string(j, "torch_dtype", get_string(j, "dtype", "bfloat16"));
  c.use_mtp = get_bool(j, "use_mtp", false);
  c.num_mtp_modules = get_int(j, "num_mtp_modules", 0);
  c.mtp_transformer_layers = get_int(j, "mtp_transformer_layers", 0);
  MS_CHECK(c.num_mtp_modules >= 0, "config.json: num_mtp_modules must be >= 0");
  c.routed_scaling_factor = get_double(j, "routed_scaling_factor", 1.0);
  if (j.contains("quantization_config") && !j["quantization_config"].is_null())
    c.quantization = parse_quantization(j["quantization_config"]);
  return c;
}

MiniMaxM2Config MiniMaxM2Config::from_file(const std::string& path, const std::string& overrides_json) {
  const json j = read_file(path, overrides_json);
  try {
    MiniMaxM2Config c = from_json(j);
    const bool factor = j.contains("partial_rotary_factor") ||
                        (j.contains("rope_parameters") && j["rope_parameters"].contains("partial_rotary_factor"));
    if (!factor && c.rotary_dim != c.head_dim)
      spdlog::info("{}: partial RoPE given only as rotary_dim {} (head_dim {}): applied as vLLM/SGLang do "
                   "(HF transformers v5 reads only partial_rotary_factor)", path, c.rotary_dim, c.head_dim);
    return c;
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
}

json MiniMaxM2Config::to_json() const {
  json j = raw.is_object() ? raw : json::object();
  j["architectures"] = architectures.empty() ? std::vector<std::string>{"MiniMaxM2ForCausalLM"} : architectures;
  j["model_type"] = model_type.empty() ? "minimax_m2" : model_type;
  j["hidden_size"] = hidden_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  // Both spellings of the rotary width, so vLLM/SGLang (rotary_dim) and HF v5
  // (partial_rotary_factor) read the same partial RoPE.
  j["rotary_dim"] = rotary_dim;
  j["partial_rotary_factor"] = double(rotary_dim) / head_dim;
  j["rope_theta"] = rope_theta;
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    j["rope_parameters"]["rope_theta"] = rope_theta;
    j["rope_parameters"]["partial_rotary_factor"] = double(rotary_dim) / head_dim;
  }
  j["max_position_embeddings"] = max_position_embeddings;
  j["intermediate_size"] = intermediate_size;
  j["shared_intermediate_size"] = shared_intermediate_size;
  j["num_local_experts"] = num_local_experts;
  j["num_experts_per_tok"] = num_experts_per_tok;
  j["scoring_func"] = scoring_func;
  j["use_routing_bias"] = use_routing_bias;
  j["use_qk_norm"] = use_qk_norm;
  j["qk_norm_type"] = qk_norm_type;
  j["hidden_act"] = hidden_act;
  j["rms_norm_eps"] = rms_norm_eps;
  j["attn_type_list"] = attn_type_list.empty() ? std::vector<int>(size_t(num_hidden_layers), 1) : attn_type_list;
  j["vocab_size"] = vocab_size;
  j["tie_word_embeddings"] = tie_word_embeddings;
  if (bos_token_id) j["bos_token_id"] = *bos_token_id;
  if (eos_token_id && !(j.contains("eos_token_id") && j["eos_token_id"].is_array())) j["eos_token_id"] = *eos_token_id;
  j["torch_dtype"] = torch_dtype.empty() ? "bfloat16" : torch_dtype;
  j["use_mtp"] = use_mtp;
  j["num_mtp_modules"] = num_mtp_modules;
  j["mtp_transformer_layers"] = mtp_transformer_layers;
  if (routed_scaling_factor != 1.0) j["routed_scaling_factor"] = routed_scaling_factor;
  if (quantization.enabled()) {
    j["quantization_config"] = quantization_to_json(quantization);
  } else {
    j.erase("quantization_config");
  }
  return j;
}

}  // namespace moeserve
