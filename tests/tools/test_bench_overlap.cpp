// bench-model --measure-routing-overlap on the trained demo model (assets/demo-model, 8 experts
// top-2): the router's overlap between consecutive tokens, measured on the CPU reference;
// bench-model's decode bytes of an MLA model (model_decode_bytes) on a DeepSeek-V3 fixture; and
// the --synthetic kimi-k2.5-fp8 config.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include <cmath>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/registry.h"
#include "tools/bench_model.h"
#include "tools/bench_step.h"

using namespace moeserve;
using namespace moeserve::tools;

namespace {

std::string source_dir() {
  const char* s = std::getenv("MOESERVE_SOURCE_DIR");
  return s ? s : ".";
}

nlohmann::json run(const std::string& prompts, int decode_tokens) {
  BenchModelOptions o;
  o.device = "cpu";
  o.checkpoint = source_dir() + "/assets/demo-model";
  o.measure_routing_overlap = prompts;
  o.overlap_decode_tokens = decode_tokens;
  o.json_out = ::testing::TempDir() + "bench_overlap.json";
  EXPECT_EQ(run_bench_model_cpu(o), 0);
  std::ifstream f(o.json_out);
  return nlohmann::json::parse(f);
}

}  // namespace

TEST(BenchOverlap, DemoModelConsecutiveTokens) {
  // The first 4 prompts of the spec-acceptance fixture, 12 greedy tokens each.
  std::ifstream in(source_dir() + "/tests/fixtures/spec_acceptance/prompts.json");
  nlohmann::json all = nlohmann::json::parse(in);
  nlohmann::json few = {{"prompts", nlohmann::json::array()}};
  for (int i = 0; i < 4; ++i) few["prompts"].push_back(all["prompts"][i]);
  const std::string path = ::testing::TempDir() + "overlap_prompts.json";
  std::ofstream(path) << few.dump();
  const nlohmann::json r = run(path, 12)["routing_overlap"];
  EXPECT_EQ(r["model_experts"], 8);
  EXPECT_EQ(r["top_k"], 2);
  EXPECT_EQ(r["moe_layers"], 6);
  EXPECT_DOUBLE_EQ(r["chance_overlap"].get<double>(), 0.25);
  const auto& g = r["generated"];
  EXPECT_GT(g["pairs"].get<int>(), 0);
  EXPECT_LE(g["pairs"].get<int>(), 4 * 11);
  EXPECT_EQ(r["prompt"]["pairs"].get<int>(), 4 * (96 - 1));
  for (const auto& p : {g["overlap"], r["prompt"]["overlap"]}) {
    EXPECT_GE(p.get<double>(), 0.0);
    EXPECT_LE(p.get<double>(), 1.0);
  }
  EXPECT_EQ(g["overlap_per_layer"].size(), 6u);
  // Distinct experts of w consecutive tokens lie between top-k and min(E, w * top-k).
  for (int w = 2; w <= 5; ++w) {
    const double d = g["distinct_per_layer_of_window"][std::to_string(w)].get<double>();
    EXPECT_GE(d, 2.0);
    EXPECT_LE(d, std::min(8.0, 2.0 * w));
  }
}

TEST(BenchOverlap, BadPromptFilesAreClearErrors) {
  const std::string bad = ::testing::TempDir() + "overlap_bad.json";
  std::ofstream(bad) << R"({"prompts": [[1, 2, 99999]]})";
  EXPECT_THROW(run(bad, 4), Error);
  std::ofstream(bad) << "not json";
  EXPECT_THROW(run(bad, 4), Error);
  EXPECT_THROW(run(::testing::TempDir() + "no_such_file.json", 4), Error);
}

// model_decode_bytes (bench-model's roofline for MLA models) on the DeepSeek-V3 fixture
// dsv3_tiny_bf16 (H 128, 3 layers with layer 0 dense (I 160), MLA 4 heads q_lora 48 kv_lora 32
// nope 32 rope 16 v 24, 8 experts top-2 of I 64, 1 shared of I 64), loaded on the CPU backend:
// against the arithmetic of its config, in the loaded tensors' element size.
TEST(BenchBytes, DeepseekV3FixtureMatchesHandArithmetic) {
  const std::string dir = source_dir() + "/tests/fixtures/golden/dsv3_tiny_bf16";
  auto cpu = make_cpu_backend();
  LoadedConfig lc = load_model_config(dir);
  std::unique_ptr<DecoderModel> m = make_bench_model(*lc.config, *cpu);
  m->load(Checkpoint::open(dir));
  const double es = double(dtype_size(m->weights().layers[1].mla.q_b.weight.dtype));
  const double H = 128, QL = 48, KL = 32, R = 16, N = 32, V = 24, Hq = 4, I = 64, Id = 160, E = 8;
  const double norms = 2 * H + QL + KL;  // input + post-attention, q_a_layernorm, kv_a_layernorm
  const double mla = H * QL + QL * Hq * (N + R) + H * (KL + R) + KL * Hq * (N + V) + Hq * V * H;
  const double expert = 3 * H * I;
  const double dense_layer = (norms + mla + 3 * H * Id) * es;
  const double moe_attn = (norms + mla + expert) * es;  // + the shared expert
  const double router = E * H * dtype_size(m->weights().layers[1].moe.gate.dtype) +
                        E * dtype_size(m->weights().layers[1].moe.score_bias.dtype);
  for (int B : {1, 3}) {
    const DecodeBytes d = model_decode_bytes(*m, B, 40, 2);
    const double distinct = E * (1 - std::pow(1 - 2 / E, B));
    EXPECT_NEAR(d.distinct, distinct, 1e-9);
    EXPECT_NEAR(d.attn_w * 3, dense_layer + 2 * moe_attn, 1e-6) << B;
    EXPECT_NEAR(d.router * 3, 2 * router, 1e-6);
    EXPECT_NEAR(d.experts * 3, 2 * distinct * expert * es, 1e-6);
    EXPECT_NEAR(d.kv, double(B) * 40 * (KL + R) * 2, 1e-6);  // per layer: the latent, bf16
  }
}

// bench-model --synthetic kimi-k2.5-fp8: Kimi-K2.5's text config (DeepSeek-V3 backbone) with FP8
// 128x128 blocks in place of its INT4 experts (--synthetic kimi-k2.5, the INT4 one, is checked in
// test_random_weights), trimmed to the layers asked for; listed among the synthetic names.
TEST(BenchSynthetic, KimiK25Fp8IsTheRealConfigWithFp8Blocks) {
  EXPECT_NE(synthetic_model_names().find("kimi-k2.5-fp8"), std::string::npos);
  const SyntheticModel sm = synthetic_model("kimi-k2.5-fp8", 3);
  const ModelDesc d = sm.config->desc();
  EXPECT_EQ(d.architecture, "DeepseekV3ForCausalLM");
  EXPECT_EQ(d.num_layers, 3);
  EXPECT_EQ(sm.shapes.total_layers, 61);
  EXPECT_EQ(d.hidden_size, 7168);
  EXPECT_EQ(d.num_attention_heads, 64);
  EXPECT_EQ(d.num_experts, 384);
  EXPECT_EQ(d.experts_per_token, 8);
  EXPECT_EQ(d.num_dense_layers, 1);
  EXPECT_EQ(d.kv_lora_rank, 512);
  EXPECT_EQ(d.q_lora_rank, 1536);
  EXPECT_EQ(d.head_dim, 128 + 64);
  EXPECT_EQ(d.v_head_dim, 128);
  EXPECT_EQ(d.vocab_size, 163840);
  EXPECT_EQ(d.quantization.quant_method, "fp8");
  EXPECT_EQ(d.quantization.block_out, 128);
  EXPECT_EQ(d.quantization.block_in, 128);
  EXPECT_THROW(synthetic_model("kimi-k3", 3), Error);
}
