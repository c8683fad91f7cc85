// MiniMaxM2Config parsing: the real M2.5 config, RoPE spellings, quantisation, errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "model/arch/minimax_m2.h"
#include "tools/inspect.h"
#include "model/arch/minimax_m2.h"

using namespace moeserve;
using json = nlohmann::json;

namespace {

json base() {
  return json{{"model_type", "minimax_m2"},
              {"hidden_size", 256},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"head_dim", 64},
              {"intermediate_size", 128},
              {"num_local_experts", 8},
              {"num_experts_per_tok", 2},
              {"vocab_size", 1000}};
}

std::string error_of(const json& j) {
  try {
    MiniMaxM2Config::from_json(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

std::string real_config_path() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return (std::filesystem::path(src ? src : ".") / "tests/fixtures/shared-data/models/minimax-m2.5/config.json").string();
}

TEST(Config, RealMiniMaxM25) {
  const std::string path = real_config_path();
  ASSERT_TRUE(std::filesystem::exists(path)) << path;
  auto c = MiniMaxM2Config::from_file(path);
  EXPECT_EQ(c.architectures, std::vector<std::string>{"MiniMaxM2ForCausalLM"});
  EXPECT_EQ(c.hidden_size, 3072);
  EXPECT_EQ(c.num_hidden_layers, 62);
  EXPECT_EQ(c.num_attention_heads, 48);
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rotary_dim, 64);
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e6);
  EXPECT_EQ(c.max_position_embeddings, 196608);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_local_experts, 256);
  EXPECT_EQ(c.num_experts_per_tok, 8);
  EXPECT_EQ(c.vocab_size, 200064);
  EXPECT_EQ(c.attn_type_list.size(), 62u);
  EXPECT_TRUE(c.use_mtp);
  EXPECT_EQ(c.num_mtp_modules, 3);
  EXPECT_EQ(c.mtp_transformer_layers, 1);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.0);
  ASSERT_TRUE(c.quantization.enabled());
  EXPECT_EQ(c.quantization.quant_method, "fp8");
  EXPECT_EQ(c.quantization.fmt, "float8_e4m3fn");
  EXPECT_EQ(c.quantization.block_out, 128);
  EXPECT_EQ(c.quantization.block_in, 128);
  EXPECT_EQ(c.quantization.modules_to_not_convert,
            (std::vector<std::string>{"gate", "e_score_correction_bias", "lm_head"}));
  // to_json round-trips every typed field.
  auto c2 = MiniMaxM2Config::from_json(c.to_json());
  EXPECT_EQ(c2.rotary_dim, 64);
  EXPECT_EQ(c2.quantization.block_out, 128);
  EXPECT_EQ(c2.num_mtp_modules, 3);
  EXPECT_EQ(c2.to_json(), c.to_json());
}

// --hf-overrides (serve): merged before the fields are read; fewer layers trim the per-layer
// lists the override leaves alone (the full-size M2.5 config with 30 layers, issue 17).
TEST(Config, HfOverrides) {
  const std::string path = real_config_path();
  auto c = MiniMaxM2Config::from_file(path, R"({"num_hidden_layers": 30})");
  EXPECT_EQ(c.num_hidden_layers, 30);
  EXPECT_EQ(c.hidden_size, 3072);
  EXPECT_TRUE(c.quantization.enabled());
  c = MiniMaxM2Config::from_file(path, R"({"max_position_embeddings": 8192, "quantization_config": null})");
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_FALSE(c.quantization.enabled());
  EXPECT_THROW(MiniMaxM2Config::from_file(path, "[1]"), Error);
  EXPECT_THROW(MiniMaxM2Config::from_file(path, "{not json"), Error);
  EXPECT_THROW(MiniMaxM2Config::from_file(path, R"({"num_hidden_layers": 30, "attn_type_list": [1]})"), Error);
}

TEST(Config, RotaryWidthSpellings) {
  json j = base();
  EXPECT_EQ(MiniMaxM2Config::from_json(j).rotary_dim, 64);  // full RoPE when unspecified
  j["rotary_dim"] = 32;
  EXPECT_EQ(MiniMaxM2Config::from_json(j).rotary_dim, 32);
  j = base();
  j["partial_rotary_factor"] = 0.25;
  EXPECT_EQ(MiniMaxM2Config::from_json(j).rotary_dim, 16);
  j = base();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5}};
  auto c = MiniMaxM2Config::from_json(j);
  EXPECT_EQ(c.rotary_dim, 32);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  // Disagreeing spellings are an error naming both.
  j["rotary_dim"] = 16;
  EXPECT_NE(error_of(j).find("rotary width disagrees"), std::string::npos) << error_of(j);
  j = base();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_NE(error_of(j).find("rope_type"), std::string::npos);
  j = base();
  j["rotary_dim"] = 65;
  EXPECT_NE(error_of(j).find("rotary_dim"), std::string::npos);
}

TEST(Config, QuantizationConfig) {
  json j = base();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {64, 32}}};
  auto c = MiniMaxM2Config::from_json(j);
  EXPECT_EQ(c.quantization.block_out, 64);
  EXPECT_EQ(c.quantization.block_in, 32);
  EXPECT_EQ(c.quantization.activation_scheme, "dynamic");
  j["quantization_config"]["weight_block_size"] = {128};
  EXPECT_NE(error_of(j).find("weight_block_size"), std::string::npos);
  j["quantization_config"] = {{"quant_method", "awq"}};
  EXPECT_NE(error_of(j).find("awq"), std::string::npos);
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {128, 0}}};
  EXPECT_NE(error_of(j).find("positive"), std::string::npos);
}

TEST(Config, ErrorsNameTheField) {
  json j = base();
  j.erase("hidden_size");
  EXPECT_NE(error_of(j).find("'hidden_size' is missing"), std::string::npos);
  j = base();
  j["num_local_experts"] = "eight";
  EXPECT_NE(error_of(j).find("'num_local_experts' must be an integer"), std::string::npos);
  j = base();
  j["scoring_func"] = "softmax";
  EXPECT_NE(error_of(j).find("scoring_func"), std::string::npos);
  j = base();
  j["num_experts_per_tok"] = 9;
  EXPECT_NE(error_of(j).find("num_experts_per_tok"), std::string::npos);
  j = base();
  j["num_key_value_heads"] = 3;
  EXPECT_NE(error_of(j).find("num_key_value_heads"), std::string::npos);
  j = base();
  j["attn_type_list"] = {1, 0};
  EXPECT_NE(error_of(j).find("attn_type_list"), std::string::npos);
  j = base();
  j["model_type"] = "llama";
  EXPECT_NE(error_of(j).find("model_type"), std::string::npos);
  j = base();
  j["shared_intermediate_size"] = 64;
  EXPECT_NE(error_of(j).find("shared_intermediate_size"), std::string::npos);
  j = base();
  j["eos_token_id"] = {200020, 5};
  EXPECT_EQ(*MiniMaxM2Config::from_json(j).eos_token_id, 200020);
  EXPECT_THROW(MiniMaxM2Config::from_file("/nonexistent/config.json"), Error);
}

// Declarations and parameter counts of the real model agree with the checkpoint dump
// (shared/reference/minimax-m2.md §1.3, §4.1): 228,689,764,864 parameters; 96,103 tensors
// = declared tensors + one weight_scale_inv per FP8-capable linear (62 x (4 + 768)).
TEST(Config, RealModelDeclarationsAndCounts) {
  auto c = MiniMaxM2Config::from_file(real_config_path());
  const auto p = count_params(c);
  EXPECT_EQ(p.total, 228689764864LL);
  EXPECT_EQ(p.per_expert, 14155776);
  EXPECT_EQ(p.active_no_lm_head - c.hidden_size, 9801356800LL);  // without the final norm
  const auto decls = declare_minimax_m2_weights(c, ParallelConfig{});
  size_t fp8_capable = 0;
  int64_t numel = 0;
  for (const auto& d : decls) {
    numel += shape_numel(d.shape);
    if (std::find(d.dtypes.begin(), d.dtypes.end(), DType::F8_E4M3) != d.dtypes.end()) ++fp8_capable;
  }
  EXPECT_EQ(fp8_capable, 62u * (4 + 768));
  EXPECT_EQ(decls.size() + fp8_capable, 96103u);
  EXPECT_EQ(numel, p.total);
  // TP=8 with EP: one KV head per rank, 32 experts per rank.
  auto sh = plan_shard(c, ParallelConfig{7, 8, true});
  EXPECT_EQ(sh.q_heads, 6);
  EXPECT_EQ(sh.kv_heads, 1);
  EXPECT_EQ(sh.kv_replicate, 1);
  EXPECT_EQ(sh.first_expert, 224);
  EXPECT_EQ(sh.num_experts, 32);
}

// Where HF transformers (the reference for the golden tests) and a naive reading differ.
TEST(Config, FollowsTransformersDefaultsAndPrecedence) {
  json j = base();
  j.erase("head_dim");
  j.erase("num_key_value_heads");
  j["num_attention_heads"] = 8;
  auto c = MiniMaxM2Config::from_json(j);
  EXPECT_EQ(c.head_dim, 128);  // HF default, not hidden / heads = 32
  EXPECT_EQ(c.num_key_value_heads, 8);
  EXPECT_EQ(c.rotary_dim, 128);
  // partial_rotary_factor: HF takes int(head_dim * factor) (truncation).
  j = base();
  j["head_dim"] = 80;
  j["partial_rotary_factor"] = 0.3;  // 80 * 0.3 = 24.000000000000004 -> 24
  EXPECT_EQ(MiniMaxM2Config::from_json(j).rotary_dim, 24);
  // rope_parameters' values win over top-level ones.
  j = base();
  j["rope_theta"] = 1e6;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}};
  EXPECT_EQ(MiniMaxM2Config::from_json(j).rope_theta, 10000.0);
  j.erase("rope_parameters");
  EXPECT_EQ(MiniMaxM2Config::from_json(j).rope_theta, 1e6);
  j.erase("rope_theta");
  EXPECT_EQ(MiniMaxM2Config::from_json(j).rope_theta, 5e6);
  // Legacy "type" key; a non-default type is refused.
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_NE(error_of(j).find("linear"), std::string::npos);
  j["rope_scaling"] = json::object();  // empty: ignored, as HF does
  EXPECT_EQ(MiniMaxM2Config::from_json(j).rope_theta, 5e6);
  // Tied embeddings are a supported variant (lm_head = embed_tokens).
  j = base();
  j["tie_word_embeddings"] = true;
  c = MiniMaxM2Config::from_json(j);
  EXPECT_TRUE(c.tie_word_embeddings);
  const auto decls = declare_minimax_m2_weights(c, ParallelConfig{});
  EXPECT_TRUE(std::none_of(decls.begin(), decls.end(), [](const auto& d) { return d.name == "lm_head.weight"; }));
  EXPECT_EQ(count_params(c).total + 1000 * 256, count_params(MiniMaxM2Config::from_json(base())).total);
}

TEST(Config, IntegersOutOfRangeAndNegativeEps) {
  json j = base();
  j["num_hidden_layers"] = 1LL << 40;
  EXPECT_NE(error_of(j).find("out of range"), std::string::npos) << error_of(j);
  j = base();
  j["vocab_size"] = 1e30;
  EXPECT_NE(error_of(j).find("vocab_size"), std::string::npos);
  j = base();
  j["rms_norm_eps"] = -1e-6;
  EXPECT_NE(error_of(j).find("rms_norm_eps"), std::string::npos);
  j = base();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"weight_block_size", {1LL << 40, 128}}};
  EXPECT_NE(error_of(j).find("weight_block_size"), std::string::npos);
}

TEST(Config, ImplausibleSizesFailFast) {
  json j = base();
  j["num_hidden_layers"] = 2000000000;  // would declare ~5e10 tensors
  EXPECT_NE(error_of(j).find("implausibly large"), std::string::npos) << error_of(j);
  j = base();
  j["num_hidden_layers"] = 4000;
  j["num_local_experts"] = 4000;
  EXPECT_NE(error_of(j).find("num_local_experts"), std::string::npos);
}

TEST(Config, NumExpertsAlias) {
  json j = base();
  j.erase("num_local_experts");
  j["num_experts"] = 6;
  EXPECT_EQ(MiniMaxM2Config::from_json(j).num_local_experts, 6);
  j.erase("num_experts");
  EXPECT_NE(error_of(j).find("num_local_experts"), std::string::npos);
}
