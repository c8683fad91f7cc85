// Qwen3-MoE (architectures[0] "Qwen3MoeForCausalLM", model_type "qwen3_moe"; Qwen3-30B-A3B,
// Qwen3-235B-A22B) on the shared decoder layers (model/layers/decoder.h):
//   h = embed[ids]
//   per layer: x = RMSNorm(h); q,k,v = x Wq/Wk/Wv (GQA); per-head RMSNorm of q and k (one
//              [head_dim] weight each); RoPE (NeoX, full width unless partial_rotary_factor,
//              theta from rope_theta or rope_parameters; linear / YaRN scaling); paged causal
//              attention; h += o Wo;
//              x = RMSNorm(h); sparse layers: softmax router over all experts, top-k,
//              renormalised when norm_topk_prob; h += sum_k w_k SwiGLU_e(x);
//              dense layers (mlp_only_layers, or (l + 1) % decoder_sparse_step != 0): h += SwiGLU(x)
//   logits = RMSNorm(h) lm_head^T (or embed_tokens^T when tie_word_embeddings).
// Checkpoints: bf16/f16/f32, or FP8 e4m3 with block scales (weight_scale_inv) as Qwen
// publishes them (quantization_config quant_method fp8, weight_block_size [128, 128]).
#include <algorithm>
#include <memory>

#include "core/error.h"
#include "model/layers/decoder.h"
#include "model/registry.h"

namespace moeserve {
namespace {

using json = nlohmann::json;
using namespace config_json;

// config.json as HF Qwen3MoeConfig reads it (defaults as HF's where a key may be absent).
struct Qwen3MoeConfig final : ArchConfig {
  ModelDesc d;
  DecoderSpec spec;
  bool norm_topk_prob = false;
  int decoder_sparse_step = 1;
  std::vector<int> mlp_only_layers;
  double rms_norm_eps = 1e-6;
  std::string torch_dtype;
  json raw;

  static Qwen3MoeConfig from_json(const json& j) {
    MS_CHECK(j.is_object(), "config.json: top level must be an object");
    Qwen3MoeConfig c;
    c.raw = j;
    c.d.architecture = "Qwen3MoeForCausalLM";
    c.d.model_type = get_string(j, "model_type", "qwen3_moe");
    MS_CHECK(c.d.model_type == "qwen3_moe", "config.json: model_type '{}' is not qwen3_moe", c.d.model_type);
    c.d.vocab_size = get_int(j, "vocab_size", 151936);
    c.d.hidden_size = get_int(j, "hidden_size", 2048);
    c.d.num_layers = get_int(j, "num_hidden_layers", 24);
    c.d.num_attention_heads = get_int(j, "num_attention_heads", 32);
    c.d.num_key_value_heads = get_int(j, "num_key_value_heads", 4);
    MS_CHECK(c.d.vocab_size > 0 && c.d.hidden_size > 0 && c.d.num_layers > 0 && c.d.num_attention_heads > 0 &&
                 c.d.num_key_value_heads > 0,
             "config.json: vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads "
             "must be positive");
    MS_CHECK(c.d.num_attention_heads % c.d.num_key_value_heads == 0,
             "config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}",
             c.d.num_attention_heads, c.d.num_key_value_heads);
    // HF: getattr(config, "head_dim", hidden_size // num_attention_heads).
    c.d.head_dim = get_int(j, "head_dim", c.d.hidden_size / c.d.num_attention_heads);
    MS_CHECK(c.d.head_dim > 0, "config.json: head_dim must be positive");
    c.d.v_head_dim = c.d.head_dim;
    c.d.max_position_embeddings = get_int(j, "max_position_embeddings", 32768);
    c.d.num_experts = get_int(j, "num_experts", 128);
    c.d.experts_per_token = get_int(j, "num_experts_per_tok", 8);
    c.d.expert_intermediate_size = get_int(j, "moe_intermediate_size", 768);
    c.d.dense_intermediate_size = get_int(j, "intermediate_size", 6144);
    c.decoder_sparse_step = get_int(j, "decoder_sparse_step", 1);
    c.mlp_only_layers = get_int_list(j, "mlp_only_layers");
    MS_CHECK(c.d.num_experts >= 0 && c.decoder_sparse_step >= 1,
             "config.json: num_experts must be >= 0 and decoder_sparse_step >= 1");
    for (int l : c.mlp_only_layers)
      MS_CHECK(l >= 0 && l < c.d.num_layers, "config.json: mlp_only_layers holds {} (layers are 0..{})", l,
               c.d.num_layers - 1);
    c.norm_topk_prob = get_bool(j, "norm_topk_prob", false);
    const std::string act = get_string(j, "hidden_act", "silu");
    MS_CHECK(act == "silu", "config.json: hidden_act '{}' is not supported (only silu)", act);
    MS_CHECK(!get_bool(j, "attention_bias", false), "config.json: attention_bias true is not supported");
    MS_CHECK(!get_bool(j, "use_sliding_window", false), "config.json: use_sliding_window true is not supported");
    c.rms_norm_eps = get_double(j, "rms_norm_eps", 1e-6);
    MS_CHECK(c.rms_norm_eps >= 0, "config.json: rms_norm_eps {} must be >= 0", c.rms_norm_eps);
    c.d.tie_word_embeddings = get_bool(j, "tie_word_embeddings", false);
    c.d.bos_token_id = get_token_id(j, "bos_token_id");
    c.d.eos_token_id = get_token_id(j, "eos_token_id");
    c.torch_dtype = get_string(j, "torch_dtype", get_string(j, "dtype", "bfloat16"));
    if (j.contains("quantization_config") && !j["quantization_config"].is_null())
      c.d.quantization = parse_quantization(j["quantization_config"]);
    bound("num_hidden_layers", c.d.num_layers, 4096);
    bound("num_experts", c.d.num_experts, 65536);
    bound("num_hidden_layers * num_experts", int64_t(c.d.num_layers) * c.d.num_experts, 1 << 22);
    bound("hidden_size", c.d.hidden_size, 1 << 20);
    bound("moe_intermediate_size", c.d.expert_intermediate_size, 1 << 22);
    bound("intermediate_size", c.d.dense_intermediate_size, 1 << 22);
    bound("num_attention_heads", c.d.num_attention_heads, 1 << 14);
    bound("head_dim", c.d.head_dim, 1 << 14);
    bound("vocab_size", c.d.vocab_size, 1 << 26);

    // Sparse iff not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0 (HF's rule).
    c.spec.dense_layer.assign(size_t(c.d.num_layers), 0);
    for (int l = 0; l < c.d.num_layers; ++l) {
      const bool listed = std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), l) != c.mlp_only_layers.end();
      const bool sparse = !listed && c.d.num_experts > 0 && (l + 1) % c.decoder_sparse_step == 0;
      c.spec.dense_layer[size_t(l)] = !sparse;
      c.d.num_dense_layers += !sparse;
    }
    if (c.d.num_dense_layers < c.d.num_layers) {
      MS_CHECK(c.d.expert_intermediate_size > 0, "config.json: moe_intermediate_size must be positive");
      MS_CHECK(c.d.experts_per_token > 0 && c.d.experts_per_token <= c.d.num_experts,
               "config.json: num_experts_per_tok {} must be in [1, num_experts {}]", c.d.experts_per_token,
               c.d.num_experts);
    }
    MS_CHECK(c.d.num_dense_layers == 0 || c.d.dense_intermediate_size > 0,
             "config.json: intermediate_size must be positive (dense layers)");
    c.spec.qk_norm = QkNormMode::PerHead;
    c.spec.rope = parse_rope(j, c.d.head_dim, 10000.0, c.d.max_position_embeddings);
    c.d.rotary_dim = c.spec.rope.rotary_dim;
    c.spec.route = RoutingSpec{RouteScoring::Softmax, 1, 1, c.norm_topk_prob, 1.f};
    c.spec.routing_bias = false;
    c.spec.rms_norm_eps = float(c.rms_norm_eps);
    return c;
  }

  ModelDesc desc() const override { return d; }
  std::vector<WeightDecl> weights(const ParallelConfig& par) const override {
    std::vector<WeightDecl> out;
    declare_decoder_weights(d, spec, DecoderNames{}, par, out);  // hub names are the defaults
    return out;
  }
  std::string shard_problem(const ParallelConfig& par) const override { return decoder_shard_problem(d, par); }
  std::string fp8_split_problem(const ParallelConfig& par) const override {
    return decoder_fp8_split_problem(d, par);
  }
  json to_json() const override { return raw; }
};

class Qwen3MoeModel final : public DecoderModel {
 public:
  Qwen3MoeModel(const Qwen3MoeConfig& cfg, Backend& backend, ParallelConfig par, AllReduceFn all_reduce)
      : DecoderModel(cfg.d, cfg.spec, DecoderNames{}, backend, par, std::move(all_reduce)), cfg_(cfg) {}
  const ArchConfig& config() const override { return cfg_; }
  void load(const Checkpoint& ckpt) override { load_decoder(ckpt, cfg_.weights(par_), nullptr); }

  Tensor forward(const Tensor& ids, const AttentionMeta& meta, std::vector<KVCacheLayer>& kv,
                 const Tensor& rows) override {
    MS_CHECK(int(kv.size()) == desc_.num_layers, "KV cache has {} layers, model {}", kv.size(), desc_.num_layers);
    StepViews s = begin_step(meta.num_tokens, rows.defined() ? rows.numel() : 0);
    embed(ids, s);
    for (int l = 0; l < desc_.num_layers; ++l) {
      capture_boundary(l, s, ids);  // draft-head taps (no-op unless set_capture asked)
      attention_block(l, s, kv, meta, Repeat{});
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
  Qwen3MoeConfig cfg_;
};

}  // namespace

// The registry entry (model/registry.cpp lists it).
ArchEntry qwen3_moe_arch() {
  ArchEntry e;
  e.architecture = "Qwen3MoeForCausalLM";
  e.model_types = {"qwen3_moe"};
  e.parse = [](const json& j) -> std::unique_ptr<ArchConfig> {
    return std::make_unique<Qwen3MoeConfig>(Qwen3MoeConfig::from_json(j));
  };
  e.create = [](const ArchConfig& c, Backend& b, ParallelConfig p, AllReduceFn ar) -> std::unique_ptr<Model> {
    return std::make_unique<Qwen3MoeModel>(static_cast<const Qwen3MoeConfig&>(c), b, p, std::move(ar));
  };
  return e;
}

}  // namespace moeserve
