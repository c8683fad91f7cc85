// `moeserve plan` for the DeepSeek-V3 family (MLA attention, shared experts, INT4 experts)
// against arithmetic written out below: Kimi-K2.5 INT4 (compressed-tensors pack-quantized,
// group 32) on 8 x H200 (141 GB) and 8 x RTX PRO 6000 (96 GB), DeepSeek-V3 FP8 on 8 x H200.
// Configs: tests/fixtures/models/{kimi-k2.5,deepseek-v3}/config.json. GB = 1e9 B.
#include <gtest/gtest.h>

#include <fstream>

#include "tools/plan.h"

using nlohmann::json;
using namespace moeserve::plan;

namespace {

json config(const std::string& name) {
  std::ifstream f(std::string(MOESERVE_TEST_SHARED_DATA) + "/../models/" + name + "/config.json");
  EXPECT_TRUE(f.good()) << name;
  return json::parse(f);
}
const json& layout(const json& plan, const std::string& name) {
  for (const auto& l : plan["layouts"])
    if (l["name"] == name) return l;
  ADD_FAILURE() << "no layout " << name;
  static json none;
  return none;
}
int64_t I(const json& j) { return j.get<int64_t>(); }

// Kimi-K2.5 text model: H 7168, 61 layers (layer 0 dense, 60 MoE), 64 heads, q_lora 1536,
// kv_lora 512, nope 128, rope 64, v 128, 384 experts x 2048 top-8, 1 shared expert (2048),
// dense MLP 18432, vocab 163840 untied. bf16 everywhere except the routed experts (INT4: the
// ignore list names lm_head, self_attn, shared_experts and the dense mlp.*_proj).
constexpr int64_t H = 7168, L = 61, MOE_L = 60, E = 384, I_E = 2048, V = 163840;

// One INT4 linear [out, in]: int32 words of 8 nibbles + a bf16 scale per 32 inputs + the
// int32 [2] weight_shape.
int64_t int4(int64_t out, int64_t in) { return out * in / 8 * 4 + out * in / 32 * 2 + 8; }

// Weights on one GPU of TP8+EP8 (attention TP 8, experts whole, 384/8 = 48 per GPU).
int64_t kimi_tp8_ep8_weights() {
  const int64_t attn = 1536 * H * 2             // q_a_proj, replicated
                       + 1536 * 2               // q_a_layernorm
                       + (64 / 8 * 192) * 1536 * 2  // q_b_proj rows 64*192 / 8
                       + 576 * H * 2            // kv_a_proj_with_mqa [512+64, H], replicated
                       + 512 * 2                // kv_a_layernorm
                       + (64 / 8 * 256) * 512 * 2   // kv_b_proj rows 64*(128+128) / 8
                       + H * (64 / 8 * 128) * 2     // o_proj columns 64*128 / 8
                       + 2 * H * 2;             // input + post-attention layernorm
  const int64_t router = E * H * 2 + E * 4;     // gate bf16 + e_score_correction_bias fp32
  const int64_t experts = 48 * (2 * int4(I_E, H) + int4(H, I_E));
  const int64_t shared = 3 * (2048 / 8) * H * 2;
  const int64_t dense = 3 * (18432 / 8) * H * 2;
  const int64_t vocab = 2 * (V / 8) * H * 2 + H * 2;  // embedding + lm_head by vocab over TP, final norm
  return L * attn + MOE_L * (router + experts + shared) + dense + vocab;
}
constexpr int64_t kKimiKvPerToken = L * (512 + 64) * 2;  // one latent [kv_lora + rope] per layer, bf16
// Reserve: 1 GiB + 8192 tokens * 2 B * (4H + attention widths + MLP widths) + 256 * V * 4 B.
// Attention widths (TP8): q_lora 1536 + 8*192 + kv 576 + 8*(128+128) = 5696; MLP (EP8, DP1):
// top-8 * 3 * 2048/8 + 3 * 2048/8 = 6912, dense 3 * 18432/8 = 6912.
constexpr int64_t kKimiReserve = (int64_t(1) << 30) + 8192 * 2 * (4 * H + 5696 + 6912) + 256 * V * 4;

TEST(PlanMla, KimiK25Int4OnEightH200) {
  PlanOptions o;
  o.gpus = 8;
  o.gpu_memory = 141000000000;
  const json p = make_plan(config("kimi-k2.5"), nullptr, o);
  EXPECT_EQ(p["model"]["quantization"]["group_size"], 32);
  EXPECT_EQ(I(p["model"]["mla"]["kv_lora_rank"]), 512);
  const json& l = layout(p, "TP8+EP8");
  EXPECT_TRUE(l["valid"].get<bool>()) << l.dump();
  EXPECT_EQ(I(l["weights_bytes_per_gpu"]), kimi_tp8_ep8_weights());
  EXPECT_EQ(I(l["kv_bytes_per_token_per_gpu"]), kKimiKvPerToken);  // 70,272 B: not per head
  EXPECT_EQ(I(l["reserve_bytes"]["total"]), kKimiReserve);
  const int64_t usable = 126900000000;  // 141 GB * 0.9
  const int64_t blocks = (usable - kimi_tp8_ep8_weights() - kKimiReserve) / (16 * kKimiKvPerToken);
  EXPECT_EQ(I(l["kv_blocks_per_gpu"]), blocks);
  EXPECT_EQ(I(l["seqs_per_replica"]), blocks / (262144 / 16));
  // Expert TP8 also fits: 2048/8 = 256 inputs of down_proj per rank is a multiple of 32.
  EXPECT_TRUE(layout(p, "TP8")["valid"].get<bool>());
  EXPECT_FALSE(p["recommended"].is_null());
}

TEST(PlanMla, KimiK25Int4OnEightRtxPro6000) {
  PlanOptions o;
  o.gpus = 8;
  o.gpu_memory = 96000000000;
  // Full 262,144 context: usable 86.4 GB - 76.2 GB weights - reserve leaves fewer KV tokens than
  // one sequence needs.
  const json full = make_plan(config("kimi-k2.5"), nullptr, o);
  const json& f = layout(full, "TP8+EP8");
  EXPECT_FALSE(f["valid"].get<bool>());
  const int64_t blocks = (86400000000 - kimi_tp8_ep8_weights() - kKimiReserve) / (16 * kKimiKvPerToken);
  EXPECT_EQ(I(f["kv_tokens_per_replica"]), blocks * 16);
  EXPECT_LT(blocks * 16, 262144);
  // 64k context fits on TP8 and TP8+EP8; DP layouts hold more weights per GPU and do not.
  o.max_model_len = 65536;
  const json p = make_plan(config("kimi-k2.5"), nullptr, o);
  EXPECT_TRUE(layout(p, "TP8")["valid"].get<bool>());
  EXPECT_TRUE(layout(p, "TP8+EP8")["valid"].get<bool>());
  EXPECT_EQ(I(layout(p, "TP8+EP8")["seqs_per_replica"]), blocks / (65536 / 16));
  EXPECT_FALSE(layout(p, "DP8xTP1+EP8")["valid"].get<bool>());
  // FP8 KV halves the bytes per token.
  o.kv_cache_dtype = "fp8";
  EXPECT_EQ(I(layout(make_plan(config("kimi-k2.5"), nullptr, o), "TP8")["kv_bytes_per_token_per_gpu"]), L * 576);
}

// DeepSeek-V3: 128 heads, 256 experts, first 3 layers dense, FP8 [128, 128] blocks on every
// linear (no modules_to_not_convert), vocab 129280.
TEST(PlanMla, DeepSeekV3Fp8OnEightH200) {
  PlanOptions o;
  o.gpus = 8;
  o.gpu_memory = 141000000000;
  const json p = make_plan(config("deepseek-v3"), nullptr, o);
  const json& l = layout(p, "TP8");
  EXPECT_TRUE(l["valid"].get<bool>()) << l.dump();
  EXPECT_EQ(I(l["kv_bytes_per_token_per_gpu"]), 61 * 576 * 2);
  // One FP8 linear [out, in]: 1 B per element + an fp32 scale per 128x128 block.
  auto fp8 = [](int64_t out, int64_t in) { return out * in + ((out + 127) / 128) * ((in + 127) / 128) * 4; };
  const int64_t h = 7168;
  const int64_t attn = fp8(1536, h) + 1536 * 2 + fp8(128 / 8 * 192, 1536) + fp8(576, h) + 512 * 2 +
                       fp8(128 / 8 * 256, 512) + fp8(h, 128 / 8 * 128) + 2 * h * 2;
  const int64_t router = 256 * h * 2 + 256 * 4;
  const int64_t experts = 256 * (2 * fp8(2048 / 8, h) + fp8(h, 2048 / 8));  // expert TP8
  const int64_t shared = 2 * fp8(2048 / 8, h) + fp8(h, 2048 / 8);
  const int64_t dense = 2 * fp8(18432 / 8, h) + fp8(h, 18432 / 8);
  const int64_t vocab = 2 * (129280 / 8) * h * 2 + h * 2;
  EXPECT_EQ(I(l["weights_bytes_per_gpu"]), 61 * attn + 58 * (router + experts + shared) + 3 * dense + vocab);
  EXPECT_EQ(I(p["checkpoint"]["mtp"]["declared_modules"]), 1);
  EXPECT_TRUE(layout(p, "TP8+EP8")["valid"].get<bool>());
}

}  // namespace
