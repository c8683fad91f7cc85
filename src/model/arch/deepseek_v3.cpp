// DeepSeek-V3 family (architectures[0] "DeepseekV3ForCausalLM", model_type deepseek_v3 / kimi_k2:
// DeepSeek-V3 / R1, Kimi-K2) and Kimi-K2.5's text backbone ("KimiK25ForConditionalGeneration",
// model_type kimi_k25: the same decoder under text_config, tensors under "language_model.";
// the vision tower is not supported: its tensors are skipped and only text is served), on the
// shared decoder layers (model/layers/decoder.h, MLA in layers/mla.cpp):
//   h = embed[ids]
//   per layer: x = RMSNorm(h); multi-head latent attention (q_a -> q_a_layernorm -> q_b, or
//              q_proj; latent = kv_a_proj_with_mqa -> kv_a_layernorm | RoPE'd k_rot, cached;
//              keys/values from kv_b_proj; RoPE interleaved when rope_interleave; softmax scale
//              (nope + rope)^-0.5 * mscale^2 under YaRN); h += o_proj(attn);
//              x = RMSNorm(h); layers < first_k_dense_replace: h += SwiGLU(x) (intermediate_size);
//              others: sigmoid router with e_score_correction_bias for the choice, grouped top-k
//              (n_group, topk_group), weights renormalised when norm_topk_prob, times
//              routed_scaling_factor; h += sum_k w_k SwiGLU_e(x) + SharedSwiGLU(x)
//   logits = RMSNorm(h) lm_head^T.
// Checkpoints: bf16/f16/f32, or FP8 e4m3 with 128x128 block scales (weight_scale_inv) as DeepSeek
// ships them, or compressed-tensors pack-quantized INT4 modules (Kimi-K2's routed experts;
// model/int4.h: dequantised to F32 on the CPU, refused by backends without W4A16 kernels). MTP modules (model.layers.{num_hidden_layers + i}, num_nextn_predict_layers) are
// skipped (the speculative-decoding issue's `mtp` method will load them).
#include <cmath>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "model/int4.h"
#include "model/layers/decoder.h"
#include "model/registry.h"

namespace moeserve {
namespace {

using json = nlohmann::json;
using namespace config_json;

// The RoPE dict HF reads (parse_rope's rule: a non-empty rope_scaling replaces rope_parameters).
const json* rope_dict(const json& j) {
  const json* rp = nullptr;
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (j.contains(key) && j[key].is_object() && !j[key].empty()) rp = &j[key];
  return rp;
}

// HF DeepseekV3Attention.scaling: qk_head_dim^-0.5, times yarn_get_mscale(factor,
// mscale_all_dim)^2 when the rope type is not default and mscale_all_dim is set.
float mla_softmax_scale(const json& j, int qk_head_dim) {
  double scale = 1.0 / std::sqrt(double(qk_head_dim));
  if (const json* rp = rope_dict(j)) {
    const std::string type = get_string(*rp, "rope_type", get_string(*rp, "type", "default"));
    const double all_dim = get_double(*rp, "mscale_all_dim", 0.0);
    if (type != "default" && all_dim != 0) {
      const double factor = get_double(*rp, "factor");
      const double m = factor <= 1 ? 1.0 : 0.1 * all_dim * std::log(factor) + 1.0;
      scale *= m * m;
    }
  }
  return float(scale);
}

struct DeepseekV3Config final : ArchConfig {
  ModelDesc d;
  DecoderSpec spec;
  DecoderNames names;
  int first_k_dense_replace = 3;
  bool vision_tower = false;  // Kimi-K2.5: a vision_config is present (not served)
  json raw;

  // config.json of DeepseekV3ForCausalLM, or of Kimi-K2.5 (the decoder under text_config).
  static DeepseekV3Config from_json(const json& top) {
    MS_CHECK(top.is_object(), "config.json: top level must be an object");
    DeepseekV3Config c;
    c.raw = top;
    const std::string top_type = get_string(top, "model_type", "deepseek_v3");
    const bool kimi_vl = top.contains("text_config");
    MS_CHECK(kimi_vl || top_type != "kimi_k25", "config.json: model_type kimi_k25 needs a text_config object");
    const json& j = kimi_vl ? top["text_config"] : top;
    if (kimi_vl) {
      MS_CHECK(j.is_object(), "config.json: text_config must be an object");
      c.d.architecture = "KimiK25ForConditionalGeneration";
      c.names.root = "language_model.";
      c.vision_tower = top.contains("vision_config") && !top["vision_config"].is_null();
      const std::string tt = get_string(j, "model_type", "deepseek_v3");
      MS_CHECK(tt == "deepseek_v3" || tt == "kimi_k2", "config.json: text_config.model_type '{}' is not deepseek_v3",
               tt);
    } else {
      c.d.architecture = "DeepseekV3ForCausalLM";
      MS_CHECK(top_type == "deepseek_v3" || top_type == "kimi_k2",
               "config.json: model_type '{}' is not deepseek_v3 (or kimi_k2)", top_type);
    }
    c.d.model_type = top_type;
    c.d.vocab_size = get_int(j, "vocab_size", 129280);
    c.d.hidden_size = get_int(j, "hidden_size", 7168);
    c.d.dense_intermediate_size = get_int(j, "intermediate_size", 18432);
    c.d.expert_intermediate_size = get_int(j, "moe_intermediate_size", 2048);
    c.d.num_layers = get_int(j, "num_hidden_layers", 61);
    c.d.num_attention_heads = get_int(j, "num_attention_heads", 128);
    c.d.num_key_value_heads = get_int(j, "num_key_value_heads", c.d.num_attention_heads);
    MS_CHECK(c.d.vocab_size > 0 && c.d.hidden_size > 0 && c.d.num_layers > 0 && c.d.num_attention_heads > 0,
             "config.json: vocab_size, hidden_size, num_hidden_layers, num_attention_heads must be positive");
    // MLA has one latent per token; HF's repeat_kv only works with as many KV heads as heads.
    MS_CHECK(c.d.num_key_value_heads == c.d.num_attention_heads,
             "config.json: num_key_value_heads {} must equal num_attention_heads {} (MLA)", c.d.num_key_value_heads,
             c.d.num_attention_heads);
    c.d.num_shared_experts = get_int(j, "n_shared_experts", 1);
    c.d.num_experts = get_int(j, "n_routed_experts", 256);
    c.d.experts_per_token = get_int(j, "num_experts_per_tok", 8);
    const int n_group = get_int(j, "n_group", 8), topk_group = get_int(j, "topk_group", 4);
    const bool norm_topk_prob = get_bool(j, "norm_topk_prob", true);
    const double scaling = get_double(j, "routed_scaling_factor", 2.5);
    c.first_k_dense_replace = get_int(j, "first_k_dense_replace", 3);
    MlaSpec& m = c.spec.mla;
    m.enabled = true;
    // q_lora_rank: absent -> HF's default 1536; null -> no q low-rank projection (q_proj).
    m.q_lora_rank = !j.contains("q_lora_rank") ? 1536 : (j["q_lora_rank"].is_null() ? 0 : get_int(j, "q_lora_rank"));
    m.kv_lora_rank = get_int(j, "kv_lora_rank", 512);
    m.qk_nope_head_dim = get_int(j, "qk_nope_head_dim", 128);
    m.qk_rope_head_dim = get_int(j, "qk_rope_head_dim", 64);
    m.v_head_dim = get_int(j, "v_head_dim", 128);
    MS_CHECK(m.q_lora_rank >= 0, "config.json: q_lora_rank {} must be positive or null", m.q_lora_rank);
    MS_CHECK(m.kv_lora_rank > 0, "config.json: kv_lora_rank {} must be positive", m.kv_lora_rank);
    MS_CHECK(m.qk_nope_head_dim >= 0, "config.json: qk_nope_head_dim {} must be >= 0", m.qk_nope_head_dim);
    MS_CHECK(m.qk_rope_head_dim > 0 && m.qk_rope_head_dim % 2 == 0,
             "config.json: qk_rope_head_dim {} must be positive and even", m.qk_rope_head_dim);
    MS_CHECK(m.v_head_dim > 0, "config.json: v_head_dim {} must be positive", m.v_head_dim);
    MS_CHECK(m.v_head_dim <= m.qk_nope_head_dim + m.qk_rope_head_dim,
             "config.json: v_head_dim {} above qk_nope_head_dim + qk_rope_head_dim {} is not supported", m.v_head_dim,
             m.qk_nope_head_dim + m.qk_rope_head_dim);
    c.d.max_position_embeddings = get_int(j, "max_position_embeddings", 4096);
    const std::string act = get_string(j, "hidden_act", "silu");
    MS_CHECK(act == "silu", "config.json: hidden_act '{}' is not supported (only silu)", act);
    MS_CHECK(!get_bool(j, "attention_bias", false), "config.json: attention_bias true is not supported");
    const std::string scoring = get_string(j, "scoring_func", "sigmoid");
    MS_CHECK(scoring == "sigmoid", "config.json: scoring_func '{}' is not supported (DeepSeek-V3: sigmoid)", scoring);
    const std::string topk_method = get_string(j, "topk_method", "noaux_tc");
    MS_CHECK(topk_method == "noaux_tc",
             "config.json: topk_method '{}' is not supported (DeepSeek-V3: noaux_tc, sigmoid + correction bias)",
             topk_method);
    const int moe_layer_freq = get_int(j, "moe_layer_freq", 1);
    MS_CHECK(moe_layer_freq == 1, "config.json: moe_layer_freq {} is not supported (only 1, as HF DeepseekV3)",
             moe_layer_freq);
    const double eps = get_double(j, "rms_norm_eps", 1e-6);
    MS_CHECK(eps >= 0, "config.json: rms_norm_eps {} must be >= 0", eps);
    // Kimi-K2.5 keeps the token ids and tying at the top level; text_config may repeat them.
    auto pick = [&](const char* key) { return j.contains(key) ? j : top; };
    c.d.tie_word_embeddings = get_bool(pick("tie_word_embeddings"), "tie_word_embeddings", false);
    c.d.bos_token_id = get_token_id(pick("bos_token_id"), "bos_token_id");
    c.d.eos_token_id = get_token_id(pick("eos_token_id"), "eos_token_id");
    if (!j.contains("bos_token_id") && !top.contains("bos_token_id")) c.d.bos_token_id = 0;  // HF defaults
    if (!j.contains("eos_token_id") && !top.contains("eos_token_id")) c.d.eos_token_id = 1;
    const json& qj = j.contains("quantization_config") ? j : top;
    if (qj.contains("quantization_config") && !qj["quantization_config"].is_null())
      c.d.quantization = parse_quantization(qj["quantization_config"]);
    // MTP modules: num_nextn_predict_layers (hub) or num_mtp_layers (v5); HF's default is 1.
    c.d.num_mtp_modules = get_int(j, "num_nextn_predict_layers", get_int(j, "num_mtp_layers", 1));
    MS_CHECK(c.d.num_mtp_modules >= 0, "config.json: num_nextn_predict_layers must be >= 0");

    bound("num_hidden_layers", c.d.num_layers, 4096);
    bound("n_routed_experts", c.d.num_experts, 65536);
    bound("num_hidden_layers * n_routed_experts", int64_t(c.d.num_layers) * c.d.num_experts, 1 << 22);
    bound("hidden_size", c.d.hidden_size, 1 << 20);
    bound("moe_intermediate_size", c.d.expert_intermediate_size, 1 << 22);
    bound("intermediate_size", c.d.dense_intermediate_size, 1 << 22);
    bound("num_attention_heads", c.d.num_attention_heads, 1 << 14);
    bound("kv_lora_rank", m.kv_lora_rank, 1 << 16);
    bound("q_lora_rank", m.q_lora_rank, 1 << 16);
    bound("qk_nope_head_dim", m.qk_nope_head_dim, 1 << 12);
    bound("qk_rope_head_dim", m.qk_rope_head_dim, 1 << 12);
    bound("v_head_dim", m.v_head_dim, 1 << 12);
    bound("vocab_size", c.d.vocab_size, 1 << 26);
    bound("n_shared_experts", c.d.num_shared_experts, 1 << 10);

    // Layers < first_k_dense_replace are dense (HF: layer_idx >= first_k_dense_replace is MoE).
    MS_CHECK(c.first_k_dense_replace >= 0, "config.json: first_k_dense_replace {} must be >= 0",
             c.first_k_dense_replace);
    c.spec.dense_layer.assign(size_t(c.d.num_layers), 0);
    for (int l = 0; l < c.d.num_layers; ++l) {
      c.spec.dense_layer[size_t(l)] = l < c.first_k_dense_replace;
      c.d.num_dense_layers += l < c.first_k_dense_replace;
    }
    MS_CHECK(c.d.num_dense_layers == 0 || c.d.dense_intermediate_size > 0,
             "config.json: intermediate_size must be positive (dense layers)");
    if (c.d.num_dense_layers < c.d.num_layers) {
      MS_CHECK(c.d.num_experts > 0, "config.json: n_routed_experts must be positive");
      MS_CHECK(c.d.expert_intermediate_size > 0, "config.json: moe_intermediate_size must be positive");
      MS_CHECK(c.d.num_shared_experts >= 0, "config.json: n_shared_experts must be >= 0");
      MS_CHECK(n_group >= 1 && c.d.num_experts % n_group == 0,
               "config.json: n_group {} must be >= 1 and divide n_routed_experts {}", n_group, c.d.num_experts);
      MS_CHECK(topk_group >= 1 && topk_group <= n_group, "config.json: topk_group {} must be in [1, n_group {}]",
               topk_group, n_group);
      // HF scores a group by the sum of its two best experts (topk(2) per group).
      MS_CHECK(c.d.num_experts / n_group >= 2,
               "config.json: n_group {} leaves fewer than 2 experts per group (n_routed_experts {})", n_group,
               c.d.num_experts);
      MS_CHECK(c.d.experts_per_token > 0 && c.d.experts_per_token <= topk_group * (c.d.num_experts / n_group),
               "config.json: num_experts_per_tok {} must be in [1, topk_group {} x experts per group {}]",
               c.d.experts_per_token, topk_group, c.d.num_experts / n_group);
      MS_CHECK(scaling > 0, "config.json: routed_scaling_factor {} must be positive", scaling);
    }
    c.d.shared_expert_intermediate_size = c.d.num_shared_experts * c.d.expert_intermediate_size;
    c.spec.shared_experts = c.d.num_shared_experts > 0 && c.d.num_dense_layers < c.d.num_layers;
    if (!c.spec.shared_experts) c.d.num_shared_experts = 0, c.d.shared_expert_intermediate_size = 0;
    c.d.head_dim = m.qk_nope_head_dim + m.qk_rope_head_dim;
    c.d.v_head_dim = m.v_head_dim;
    c.d.kv_lora_rank = m.kv_lora_rank;
    c.d.q_lora_rank = m.q_lora_rank;
    // RoPE on the qk_rope_head_dim part (HF sets head_dim = qk_rope_head_dim for the rotary
    // embedding); rope_interleave: DeepSeek's interleaved pairs (HF default true).
    c.spec.rope = parse_rope(j, m.qk_rope_head_dim, 10000.0, c.d.max_position_embeddings);
    MS_CHECK(c.spec.rope.rotary_dim == m.qk_rope_head_dim,
             "config.json: partial_rotary_factor is not supported with MLA (the whole qk_rope_head_dim rotates)");
    c.spec.rope.style = get_bool(j, "rope_interleave", true) ? RopeStyle::GptJ : RopeStyle::NeoX;
    c.d.rotary_dim = m.qk_rope_head_dim;
    m.softmax_scale = mla_softmax_scale(j, c.d.head_dim);
    c.spec.qk_norm = QkNormMode::None;
    c.spec.route = RoutingSpec{RouteScoring::Sigmoid, n_group, topk_group, norm_topk_prob, float(scaling)};
    c.spec.routing_bias = true;  // noaux_tc: mlp.gate.e_score_correction_bias
    c.spec.rms_norm_eps = float(eps);
    c.names.router_bias = "mlp.gate.e_score_correction_bias";
    return c;
  }

  ModelDesc desc() const override { return d; }
  std::vector<WeightDecl> weights(const ParallelConfig& par) const override {
    std::vector<WeightDecl> out;
    declare_decoder_weights(d, spec, names, par, out);
    return out;
  }
  // Plus INT4 experts: a tensor-parallel split must keep whole quantisation groups per rank.
  std::string shard_problem(const ParallelConfig& par) const override {
    std::string p = decoder_shard_problem(d, par);
    if (p.empty() && d.quantization.int4()) p = int4_split_problem(weights(par), d.quantization);
    return p;
  }
  std::string fp8_split_problem(const ParallelConfig& par) const override {
    return decoder_fp8_split_problem(d, par, &spec);
  }
  bool is_skipped_tensor(const std::string& name) const override {
    if (is_vision_tensor(name)) return true;
    if (name.compare(0, names.root.size(), names.root) != 0) return false;
    return is_mtp_tensor(d.num_layers, std::max(1, d.num_mtp_modules), name.substr(names.root.size()));
  }
  static bool is_vision_tensor(const std::string& name) {
    return name.rfind("vision_tower.", 0) == 0 || name.rfind("mm_projector.", 0) == 0;
  }
  json to_json() const override { return raw; }
  // The latent cache: kv_lora_rank + qk_rope_head_dim values per token per layer on every rank
  // (the latent path is replicated under TP), no V.
  KvLayout kv_layout(const ParallelConfig&) const override {
    return KvLayout{d.num_layers, 1, spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim, 0};
  }
};

class DeepseekV3Model final : public DecoderModel {
 public:
  DeepseekV3Model(const DeepseekV3Config& cfg, Backend& backend, ParallelConfig par, AllReduceFn all_reduce)
      : DecoderModel(cfg.d, cfg.spec, cfg.names, backend, par, std::move(all_reduce)), cfg_(cfg) {}
  const ArchConfig& config() const override { return cfg_; }
  void load(const Checkpoint& ckpt) override {
    int vision = 0, mtp = 0;
    for (const auto& n : ckpt.names()) {
      if (DeepseekV3Config::is_vision_tensor(n)) ++vision;
      else if (cfg_.is_skipped_tensor(n)) ++mtp;
    }
    if (cfg_.vision_tower || vision)
      spdlog::warn("{}: the vision tower (vision_config; {} vision_tower.* / mm_projector.* tensors) is not "
                   "supported and is not loaded: serving the text model (text_config) only",
                   cfg_.d.architecture, vision);
    if (mtp)
      spdlog::info("{}: {} MTP tensors (model.layers.{}+) skipped (loaded by --speculative-config method mtp)", cfg_.d.architecture, mtp,
                   cfg_.d.num_layers);
    load_decoder(ckpt, cfg_.weights(par_), [this](const std::string& n) { return cfg_.is_skipped_tensor(n); });
  }

  Tensor forward(const Tensor& ids, const AttentionMeta& meta, std::vector<KVCacheLayer>& kv,
                 const Tensor& rows) override {
    MS_CHECK(int(kv.size()) == desc_.num_layers, "KV cache has {} layers, model {}", kv.size(), desc_.num_layers);
    StepViews s = begin_step(meta.num_tokens, rows.defined() ? rows.numel() : 0);
    embed(ids, s);
    for (int l = 0; l < desc_.num_layers; ++l) {
      capture_boundary(l, s, ids);  // draft-head taps (no-op unless set_capture asked)
      mla_attention_block(l, s, kv, meta);
      if (w_.layers[size_t(l)].dense)
        dense_block(l, s);
      else
        moe_block(l, s, Repeat{});
    }
    capture_boundary(desc_.num_layers, s, ids);
    Tensor logits = final_logits(s, rows);
    capture_final(s);
    return logits;
  }

 private:
  DeepseekV3Config cfg_;
};

std::unique_ptr<ArchConfig> parse(const json& j) {
  return std::make_unique<DeepseekV3Config>(DeepseekV3Config::from_json(j));
}
std::unique_ptr<Model> create(const ArchConfig& c, Backend& b, ParallelConfig p, AllReduceFn ar) {
  return std::make_unique<DeepseekV3Model>(static_cast<const DeepseekV3Config&>(c), b, p, std::move(ar));
}

}  // namespace

// The registry entries (model/registry.cpp lists both).
ArchEntry deepseek_v3_arch() {
  return ArchEntry{"DeepseekV3ForCausalLM", {"deepseek_v3", "kimi_k2"}, parse, create};
}
ArchEntry kimi_k25_arch() {
  return ArchEntry{"KimiK25ForConditionalGeneration", {"kimi_k25"}, parse, create};
}

}  // namespace moeserve
