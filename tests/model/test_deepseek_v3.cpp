// The DeepSeek-V3 architecture file's typed config (model/arch/deepseek_v3.cpp) on the published
// DeepSeek-V3 and Kimi-K2.5 configs (written here from their config.json values): sizes, MLA
// dims, the softmax scale with YaRN's mscale, RoPE in both spellings, routing spec, dense layers,
// shared experts, the latent KV layout, weight names (Kimi's language_model. prefix), skipped
// MTP / vision tensors, layouts, and errors naming the field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/layers/decoder.h"
#include "model/registry.h"
#include "golden_fixture.h"

using namespace moeserve;
using json = nlohmann::json;

namespace {

// deepseek-ai/DeepSeek-V3 config.json (the fields the model reads).
json deepseek_v3() {
  return json::parse(R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "bos_token_id": 0, "eos_token_id": 1,
    "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168, "intermediate_size": 18432,
    "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
    "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                            "weight_block_size": [128, 128]},
    "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
      "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128,
    "vocab_size": 129280})");
}

// moonshotai/Kimi-K2.5 (wave2-research.md 5.1): the DeepSeek-V3 decoder under text_config.
json kimi_k25() {
  json t = deepseek_v3();
  t["first_k_dense_replace"] = 1;
  t["n_routed_experts"] = 384;
  t["num_attention_heads"] = 64;
  t["num_key_value_heads"] = 64;
  t["n_group"] = 1;
  t["topk_group"] = 1;
  t["routed_scaling_factor"] = 2.827;
  t["rms_norm_eps"] = 1e-5;
  t["vocab_size"] = 163840;
  t["max_position_embeddings"] = 262144;
  t["num_nextn_predict_layers"] = 0;
  t.erase("quantization_config");
  t.erase("bos_token_id");
  t.erase("eos_token_id");
  t["rope_scaling"] = {{"type", "yarn"}, {"factor", 64.0}, {"original_max_position_embeddings", 4096},
                       {"beta_fast", 32.0}, {"beta_slow", 1.0}, {"mscale", 1.0}, {"mscale_all_dim", 1.0}};
  t["rope_theta"] = 50000.0;
  return {{"architectures", {"KimiK25ForConditionalGeneration"}}, {"model_type", "kimi_k25"},
          {"bos_token_id", 163584}, {"eos_token_id", 163585}, {"tie_word_embeddings", false},
          {"text_config", t}, {"vision_config", {{"vt_num_hidden_layers", 27}, {"vt_hidden_size", 1152}}}};
}

std::string error_of(const json& j) {
  try {
    parse_config(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const WeightDecl* find(const std::vector<WeightDecl>& w, const std::string& name) {
  for (const auto& d : w)
    if (d.name == name) return &d;
  return nullptr;
}

TEST(DeepseekV3Config, PublishedConfig) {
  const LoadedConfig lc = parse_config(deepseek_v3());
  EXPECT_EQ(lc.entry->architecture, "DeepseekV3ForCausalLM");
  const ModelDesc d = lc.config->desc();
  EXPECT_EQ(d.num_layers, 61);
  EXPECT_EQ(d.head_dim, 192);
  EXPECT_EQ(d.v_head_dim, 128);
  EXPECT_EQ(d.rotary_dim, 64);
  EXPECT_EQ(d.kv_lora_rank, 512);
  EXPECT_EQ(d.q_lora_rank, 1536);
  EXPECT_EQ(d.num_dense_layers, 3);
  EXPECT_EQ(d.num_shared_experts, 1);
  EXPECT_EQ(d.shared_expert_intermediate_size, 2048);
  EXPECT_EQ(d.num_mtp_modules, 1);
  EXPECT_EQ(d.quantization.block_out, 128);
  // The weights of layer 3 (the first MoE layer) and of layer 0 (dense).
  const auto w = lc.config->weights(ParallelConfig{});
  const WeightDecl* kvb = find(w, "model.layers.0.self_attn.kv_b_proj.weight");
  ASSERT_NE(kvb, nullptr);
  EXPECT_EQ(kvb->shape, (Shape{128 * 256, 512}));
  ASSERT_NE(find(w, "model.layers.0.mlp.gate_proj.weight"), nullptr);
  ASSERT_NE(find(w, "model.layers.3.mlp.shared_experts.down_proj.weight"), nullptr);
  ASSERT_NE(find(w, "model.layers.3.mlp.gate.e_score_correction_bias"), nullptr);
  ASSERT_NE(find(w, "model.layers.3.mlp.experts.255.up_proj.weight"), nullptr);
  EXPECT_EQ(find(w, "model.layers.0.self_attn.q_proj.weight"), nullptr);  // q_lora: q_a / q_b
  ASSERT_NE(find(w, "model.layers.60.self_attn.q_b_proj.weight"), nullptr);
  EXPECT_EQ(find(w, "model.layers.61.input_layernorm.weight"), nullptr);
  EXPECT_TRUE(lc.config->is_skipped_tensor("model.layers.61.eh_proj.weight"));  // MTP
  EXPECT_FALSE(lc.config->is_skipped_tensor("model.layers.60.eh_proj.weight"));
  // Layouts: TP 8 keeps whole FP8 blocks (q_b 16 x 192, kv_b 16 x 256, o_proj 16 x 128 per rank).
  EXPECT_EQ(lc.config->shard_problem(ParallelConfig{0, 8, true}), "");
  EXPECT_EQ(lc.config->fp8_split_problem(ParallelConfig{0, 8, false}), "");
  EXPECT_NE(lc.config->shard_problem(ParallelConfig{0, 3, false}).find("num_attention_heads"), std::string::npos);
}

TEST(DeepseekV3Config, SpecsScaleAndLatentCache) {
  const LoadedConfig lc = parse_config(deepseek_v3());
  auto be = make_cpu_backend();
  const std::unique_ptr<Model> m = lc.entry->create(*lc.config, *be, ParallelConfig{}, {});
  const auto& dm = dynamic_cast<const DecoderModel&>(*m);
  const DecoderSpec& s = dm.spec();
  ASSERT_TRUE(s.mla.enabled);
  // HF: 192^-0.5 * yarn_get_mscale(40, 1.0)^2.
  const double ms = 0.1 * std::log(40.0) + 1.0;
  EXPECT_NEAR(s.mla.softmax_scale, 1.0 / std::sqrt(192.0) * ms * ms, 1e-7);
  EXPECT_EQ(s.rope.scaling, RopeScaling::Yarn);
  EXPECT_EQ(s.rope.style, RopeStyle::GptJ);  // rope_interleave defaults to true
  EXPECT_FLOAT_EQ(s.rope.attention_factor, 1.f);  // mscale == mscale_all_dim
  EXPECT_EQ(s.rope.original_max_position, 4096);
  EXPECT_EQ(s.route.n_group, 8);
  EXPECT_EQ(s.route.topk_group, 4);
  EXPECT_FLOAT_EQ(s.route.routed_scaling_factor, 2.5f);
  EXPECT_TRUE(s.route.renormalize);
  EXPECT_TRUE(s.routing_bias);
  EXPECT_TRUE(s.shared_experts);
  // One latent "head" of kv_lora + rope per token per layer: 61 x 576 bf16 values = 70,272 bytes.
  const KvLayout kv = m->kv_layout();
  EXPECT_EQ(kv.kv_heads, 1);
  EXPECT_EQ(kv.k_head_dim, 576);
  EXPECT_EQ(kv.v_head_dim, 0);
  EXPECT_EQ(kv.bytes_per_block(1, 2), 61 * 576 * 2);
  // The config reports the same layout without a model (inspect / plan), on any TP size.
  for (int w : {1, 8}) {
    const KvLayout c = lc.config->kv_layout(ParallelConfig{0, w, false});
    EXPECT_EQ(c.bytes_per_block(16, 2), kv.bytes_per_block(16, 2)) << w;
  }
}

// The default (GQA) ArchConfig::kv_layout agrees with the built model's, split or replicated.
TEST(DeepseekV3Config, GqaKvLayoutFromTheConfig) {
  json j = {{"architectures", {"Qwen3MoeForCausalLM"}}, {"model_type", "qwen3_moe"}, {"hidden_size", 256},
            {"num_hidden_layers", 2}, {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"head_dim", 32},
            {"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 64}, {"vocab_size", 100}};
  const LoadedConfig lc = parse_config(j);
  auto be = make_cpu_backend();
  for (int w : {1, 2, 4}) {
    const auto m = lc.entry->create(*lc.config, *be, ParallelConfig{0, w, false}, [](Tensor&) {});
    const KvLayout a = m->kv_layout(), b = lc.config->kv_layout(ParallelConfig{0, w, false});
    EXPECT_EQ(a.kv_heads, b.kv_heads) << w;
    EXPECT_EQ(a.bytes_per_block(16, 2), b.bytes_per_block(16, 2)) << w;
  }
}

TEST(DeepseekV3Config, RopeParametersSpellingEqualsRopeScaling) {
  json v5 = deepseek_v3();
  json rp = v5["rope_scaling"];
  rp.erase("type");
  rp["rope_type"] = "yarn";
  rp["rope_theta"] = 10000.0;
  v5.erase("rope_scaling");
  v5.erase("rope_theta");
  v5["rope_parameters"] = rp;
  auto be = make_cpu_backend();
  auto spec_of = [&](const json& j) {
    const LoadedConfig lc = parse_config(j);
    const auto m = lc.entry->create(*lc.config, *be, ParallelConfig{}, {});
    return dynamic_cast<const DecoderModel&>(*m).spec();
  };
  const DecoderSpec a = spec_of(deepseek_v3()), b = spec_of(v5);
  EXPECT_EQ(a.mla.softmax_scale, b.mla.softmax_scale);
  EXPECT_EQ(a.rope.factor, b.rope.factor);
  EXPECT_EQ(a.rope.theta, b.rope.theta);
  EXPECT_EQ(a.rope.original_max_position, b.rope.original_max_position);
  // No scaling: plain qk_head_dim^-0.5; rope_interleave false: NeoX.
  json plain = deepseek_v3();
  plain.erase("rope_scaling");
  plain["rope_interleave"] = false;
  const DecoderSpec c = spec_of(plain);
  EXPECT_NEAR(c.mla.softmax_scale, 1.0 / std::sqrt(192.0), 1e-8);
  EXPECT_EQ(c.rope.style, RopeStyle::NeoX);
}

TEST(DeepseekV3Config, NoQLora) {
  json j = deepseek_v3();
  j["q_lora_rank"] = nullptr;
  const LoadedConfig lc = parse_config(j);
  EXPECT_EQ(lc.config->desc().q_lora_rank, 0);
  const auto w = lc.config->weights(ParallelConfig{});
  const WeightDecl* q = find(w, "model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (Shape{128 * 192, 7168}));
  EXPECT_EQ(find(w, "model.layers.0.self_attn.q_a_proj.weight"), nullptr);
}

TEST(DeepseekV3Config, KimiK25TextBackbone) {
  const LoadedConfig lc = parse_config(kimi_k25());
  EXPECT_EQ(lc.entry->architecture, "KimiK25ForConditionalGeneration");
  const ModelDesc d = lc.config->desc();
  EXPECT_EQ(d.num_experts, 384);
  EXPECT_EQ(d.num_dense_layers, 1);
  EXPECT_EQ(d.bos_token_id, 163584);  // top level
  EXPECT_EQ(d.eos_token_id, 163585);
  const auto w = lc.config->weights(ParallelConfig{});
  EXPECT_NE(find(w, "language_model.model.embed_tokens.weight"), nullptr);
  EXPECT_NE(find(w, "language_model.lm_head.weight"), nullptr);
  EXPECT_NE(find(w, "language_model.model.layers.60.mlp.experts.383.down_proj.weight"), nullptr);
  EXPECT_TRUE(lc.config->is_skipped_tensor("vision_tower.encoder.blocks.0.wqkv.weight"));
  EXPECT_TRUE(lc.config->is_skipped_tensor("mm_projector.proj.0.weight"));
  EXPECT_FALSE(lc.config->is_skipped_tensor("language_model.model.layers.60.input_layernorm.weight"));
  // TP 8: 8 heads per rank; the shared expert (2048 / 8 = 256) and dense MLP (18432 / 8) keep blocks.
  EXPECT_EQ(lc.config->shard_problem(ParallelConfig{0, 8, true}), "");
  json no_text = kimi_k25();
  no_text.erase("text_config");
  EXPECT_NE(error_of(no_text).find("text_config"), std::string::npos) << error_of(no_text);
}

TEST(DeepseekV3Config, ErrorsNameTheField) {
  auto with = [](const char* key, json v) {
    json j = deepseek_v3();
    j[key] = v;
    return error_of(j);
  };
  EXPECT_NE(with("q_lora_rank", "big").find("q_lora_rank"), std::string::npos);
  EXPECT_NE(with("kv_lora_rank", 0).find("kv_lora_rank"), std::string::npos);
  EXPECT_NE(with("qk_rope_head_dim", 7).find("qk_rope_head_dim"), std::string::npos);
  EXPECT_NE(with("scoring_func", "softmax").find("scoring_func"), std::string::npos);
  EXPECT_NE(with("topk_method", "greedy").find("topk_method"), std::string::npos);
  EXPECT_NE(with("n_group", 3).find("n_group"), std::string::npos);
  EXPECT_NE(with("topk_group", 9).find("topk_group"), std::string::npos);
  EXPECT_NE(with("num_experts_per_tok", 300).find("num_experts_per_tok"), std::string::npos);
  EXPECT_NE(with("num_key_value_heads", 8).find("num_key_value_heads"), std::string::npos);
  EXPECT_NE(with("moe_layer_freq", 2).find("moe_layer_freq"), std::string::npos);
  EXPECT_NE(with("attention_bias", true).find("attention_bias"), std::string::npos);
  EXPECT_NE(with("routed_scaling_factor", "x").find("routed_scaling_factor"), std::string::npos);
  EXPECT_NE(with("first_k_dense_replace", -1).find("first_k_dense_replace"), std::string::npos);
  EXPECT_NE(with("v_head_dim", 400).find("v_head_dim"), std::string::npos);
  json bad_rope = deepseek_v3();
  bad_rope["rope_scaling"]["type"] = "dynamic";
  EXPECT_NE(error_of(bad_rope).find("rope_type"), std::string::npos) << error_of(bad_rope);
}

// A checkpoint without one declared tensor fails at load naming it (the index no longer lists
// kv_b_proj of layer 1; its bytes stay in the shard and are ignored as unlisted).
TEST(DeepseekV3Config, MissingTensorIsNamed) {
  namespace fs = std::filesystem;
  const fs::path src = test::golden_fixture("dsv3_tiny_bf16");
  const fs::path dir = fs::temp_directory_path() / ("dsv3_missing_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::copy(src, dir);
  json idx = json::parse(std::ifstream(dir / "model.safetensors.index.json"));
  const std::string gone = "model.layers.1.self_attn.kv_b_proj.weight";
  ASSERT_EQ(idx["weight_map"].erase(gone), 1u);
  std::ofstream(dir / "model.safetensors.index.json") << idx.dump();
  const LoadedConfig lc = load_model_config(dir.string());
  auto be = make_cpu_backend();
  const auto m = lc.entry->create(*lc.config, *be, ParallelConfig{}, {});
  try {
    m->load(Checkpoint::open(dir.string()));
    ADD_FAILURE() << "a missing kv_b_proj must fail the load";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(gone), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
