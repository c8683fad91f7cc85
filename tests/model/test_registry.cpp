// The architecture registry and the Qwen3-MoE architecture file: dispatch by architectures[0]
// / model_type, the refusal naming the supported ones, Qwen3's typed config (errors naming the
// field, dense-layer rule, routing / QK-norm / RoPE specs), and `inspect` on the published
// Qwen3-30B-A3B and Qwen3-235B-A22B configs (tests/fixtures/models/, no weights).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "model/arch/minimax_m2.h"
#include "tools/inspect.h"
#include "model/layers/decoder.h"
#include "model/registry.h"

using namespace moeserve;
using json = nlohmann::json;

namespace {

std::filesystem::path models_dir() {
  const char* src = std::getenv("MOESERVE_SOURCE_DIR");
  return std::filesystem::path(src ? src : ".") / "tests" / "fixtures" / "models";
}

json qwen3_30b() {
  std::ifstream f(models_dir() / "qwen3-30b-a3b" / "config.json");
  EXPECT_TRUE(f.good());
  return json::parse(f);
}

std::string error_of(const json& j) {
  try {
    parse_config(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Registry, DispatchesByArchitectureThenModelType) {
  EXPECT_EQ(parse_config(qwen3_30b()).entry->architecture, "Qwen3MoeForCausalLM");
  json j = qwen3_30b();
  j.erase("architectures");  // model_type alone
  EXPECT_EQ(parse_config(j).entry->architecture, "Qwen3MoeForCausalLM");
  std::ifstream f(std::string(std::getenv("MOESERVE_SHARED_DATA") ? std::getenv("MOESERVE_SHARED_DATA")
                                                                   : MOESERVE_TEST_SHARED_DATA) +
                  "/models/minimax-m2.5/config.json");
  const LoadedConfig m = parse_config(json::parse(f));
  EXPECT_EQ(m.entry->architecture, "MiniMaxM2ForCausalLM");
  EXPECT_NE(dynamic_cast<const MiniMaxM2Config*>(m.config.get()), nullptr);
}

TEST(Registry, UnknownArchitectureListsTheSupported) {
  const std::string e = error_of({{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}});
  EXPECT_NE(e.find("'LlamaForCausalLM'"), std::string::npos) << e;
  EXPECT_NE(e.find("not supported"), std::string::npos) << e;
  EXPECT_NE(e.find("MiniMaxM2ForCausalLM"), std::string::npos) << e;
  EXPECT_NE(e.find("Qwen3MoeForCausalLM"), std::string::npos) << e;
}

TEST(Qwen3Config, ErrorsNameTheField) {
  json j = qwen3_30b();
  j["num_experts_per_tok"] = "eight";
  EXPECT_NE(error_of(j).find("num_experts_per_tok"), std::string::npos);
  j = qwen3_30b();
  j["mlp_only_layers"] = {3, 99};
  EXPECT_NE(error_of(j).find("mlp_only_layers"), std::string::npos);
  j = qwen3_30b();
  j["attention_bias"] = true;
  EXPECT_NE(error_of(j).find("attention_bias"), std::string::npos);
  j = qwen3_30b();
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_NE(error_of(j).find("dynamic"), std::string::npos);
  j = qwen3_30b();
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e6}};  // no factor
  EXPECT_NE(error_of(j).find("factor"), std::string::npos);
}

// Sparse iff not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0 (HF's rule).
TEST(Qwen3Config, DenseLayersAndSpecs) {
  json j = qwen3_30b();
  j["num_hidden_layers"] = 6;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = {3};
  const LoadedConfig c = parse_config(j);
  const ModelDesc d = c.config->desc();
  EXPECT_EQ(d.num_dense_layers, 4);  // 0, 2, 4 (step) and 3 (listed): sparse 1, 5
  EXPECT_EQ(d.dense_intermediate_size, 6144);
  int dense_decls = 0, routers = 0;
  for (const auto& w : c.config->weights(ParallelConfig{})) {
    dense_decls += w.name.find(".mlp.gate_proj.weight") != std::string::npos;
    routers += w.name.find(".mlp.gate.weight") != std::string::npos;
    if (w.name == "model.layers.0.self_attn.q_norm.weight") EXPECT_EQ(w.shape, (Shape{128}));  // per head
  }
  EXPECT_EQ(dense_decls, 4);
  EXPECT_EQ(routers, 2);
  // rope_theta (hub) and rope_parameters (transformers v5) give the same RoPE.
  json a = qwen3_30b(), b = qwen3_30b();
  b.erase("rope_theta");
  b["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  EXPECT_EQ(parse_config(a).config->desc().rotary_dim, 128);
  EXPECT_EQ(parse_config(b).config->desc().rotary_dim, 128);
}

// inspect on config-only folders: parameter counts from the declarations, by hand:
// 30B-A3B per layer: q/o 4096x2048 x2 + k/v 512x2048 x2 = 18,874,368; norms 2*2048 + q/k_norm
// 2*128 = 4,352; router 128x2048 = 262,144; experts 128 x 3 x 768x2048 = 603,979,776.
// Total 48 x 623,120,640 + embed/lm_head 2 x 151936x2048 + final norm 2048 = 30,532,122,624.
// Active without lm_head: 48 x (18,874,368 + 4,352 + 262,144 + 8 x 4,718,592) + 311,164,928 (embed)
// + 2048 = 2,730,702,848 + ... (the inspect figure leaves embed and lm_head out: 2,730,702,848).
TEST(Qwen3Config, InspectPublishedConfigs) {
  const json r30 = inspect_checkpoint((models_dir() / "qwen3-30b-a3b").string());
  EXPECT_EQ(r30["architecture"], "Qwen3MoeForCausalLM");
  EXPECT_EQ(r30["params_total"].get<int64_t>(), 30532122624LL);
  EXPECT_EQ(r30["params_active"].get<int64_t>(), 2730702848LL);
  EXPECT_EQ(r30["params_active_with_lm_head"].get<int64_t>(), 3041867776LL);
  EXPECT_EQ(r30["num_experts"], 128);
  EXPECT_FALSE(r30["weights_present"].get<bool>());
  const json r235 = inspect_checkpoint((models_dir() / "qwen3-235b-a22b").string());
  EXPECT_EQ(r235["params_total"].get<int64_t>(), 235093634560LL);
  EXPECT_EQ(r235["params_active_with_lm_head"].get<int64_t>(), 21568433664LL);
  EXPECT_NE(format_inspect(r235).find("experts          128 (top-8), intermediate 1536"), std::string::npos);
}

// Layouts: TP 8 over 4 KV heads replicates each KV head on 2 ranks; EP 8 owns 16 experts a rank;
// TP 3 does not split 32 heads.
TEST(Qwen3Config, ParallelLayouts) {
  const LoadedConfig c = parse_config(qwen3_30b());
  EXPECT_EQ(c.config->shard_problem(ParallelConfig{0, 8, true}), "");
  const DecoderShard s = plan_decoder_shard(c.config->desc(), ParallelConfig{7, 8, true});
  EXPECT_EQ(s.kv_heads, 1);
  EXPECT_EQ(s.kv_replicate, 2);
  EXPECT_EQ(s.first_expert, 112);
  EXPECT_EQ(s.num_experts, 16);
  EXPECT_NE(c.config->shard_problem(ParallelConfig{0, 3, false}).find("num_attention_heads"), std::string::npos);
  // The FP8 checkpoint (128x128 blocks): expert intermediate 768 over 8 ranks = 96 rows cuts blocks.
  json j = qwen3_30b();
  j["quantization_config"] = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"},
                              {"weight_block_size", {128, 128}}};
  const LoadedConfig f = parse_config(j);
  EXPECT_NE(f.config->fp8_split_problem(ParallelConfig{0, 8, false}).find("expert intermediate_size"),
            std::string::npos);
  EXPECT_EQ(f.config->fp8_split_problem(ParallelConfig{0, 8, true}), "");
}

}  // namespace
