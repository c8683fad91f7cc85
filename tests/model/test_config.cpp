// MiniMaxM2Config parsing: the real M2.5 config, RoPE spellings, quantisation, errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "model/config.h"

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

TEST(Config, RealMiniMaxM25) {
  const char* shared = "/work/shared/data/models/minimax-m2.5/config.json";
  if (!std::filesystem::exists(shared)) GTEST_SKIP() << shared << " not present";
  auto c = MiniMaxM2Config::from_file(shared);
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
