// `moeserve plan` arithmetic against numbers worked out by hand (below, in comments), for the
// real MiniMax-M2.5 config.json on 4 x 96 GB and 8 x 141 GB, and for a small synthetic
// Mixtral-style bf16 model. Units: GB = 1e9 bytes, GiB = 2^30.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "core/error.h"
#include "tools/plan.h"

using nlohmann::json;
using namespace moeserve::plan;

namespace {

json m25_config() {
  const char* dir = std::getenv("MOESERVE_SHARED_DATA");
  std::ifstream f(std::string(dir ? dir : MOESERVE_TEST_SHARED_DATA) + "/models/minimax-m2.5/config.json");
  EXPECT_TRUE(f.good());
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

// MiniMax-M2.5 shapes: H 3072, 62 layers, 48 q / 8 kv heads x 128, 256 experts top-8,
// expert intermediate 1536, vocab 200064, untied, FP8 [128, 128] blocks, fp32 router.
//
// Per-layer bytes at TP1 (FP8 = 1 B/element + 4 B per 128x128 block scale):
//   q_proj 6144x3072 = 18,874,368 + 48*24*4 = 4,608      o_proj the same
//   k_proj 1024x3072 =  3,145,728 +  8*24*4 =   768      v_proj the same
//   norms  2*3072*2 + q_norm 6144*2 + k_norm 1024*2 = 26,624
//   router 256*3072*4 + bias 256*4 = 3,146,752
//   expert w1/w3 1536x3072 = 4,718,592 + 12*24*4 = 1,152 each; w2 the same -> 14,159,232 per expert
//   -> 256 experts = 3,624,763,392
// Whole checkpoint: 62 * 3,671,987,712 + embed 200064*3072*2 = 1,229,193,216 + lm_head (same)
//   + final norm 6,144 = 230,121,630,720 B (= 230.1 GB, 214.3 GiB), 96,103 tensors.
TEST(PlanM25, CheckpointTotalAndTensorCount) {
  PlanOptions o;
  o.gpus = 1;
  o.gpu_memory = 141000000000;
  const json p = make_plan(m25_config(), nullptr, o);
  EXPECT_EQ(I(p["checkpoint"]["computed_bytes"]), 230121630720);
  EXPECT_EQ(I(p["checkpoint"]["computed_tensors"]), 96103);
  EXPECT_EQ(I(p["checkpoint"]["mtp"]["declared_modules"]), 3);
  EXPECT_TRUE(p["checkpoint"]["mtp"]["present_modules"].is_null());  // unknown without an index
  // One 141 GB GPU cannot hold 230 GB of weights.
  EXPECT_FALSE(layout(p, "TP1")["valid"].get<bool>());
  EXPECT_TRUE(p["recommended"].is_null());
}

// 4 x 96 GB (96e9 B), utilization 0.9 -> usable 86,400,000,000 B per GPU; max_model_len 196,608.
// TP4: per layer q 1536x3072 = 4,718,592 + 12*24*4; k/v 2 heads = 256x3072 = 786,432 + 2*24*4 each;
//   o 3072x1536 = 4,718,592 + 24*12*4 -> attention 11,012,736; norms 12,288 + 3,072 + 512;
//   router 3,146,752; experts sliced to 384: (3 * 384*3072 + 3 * 3*24*4) * 256 = 906,190,848
//   -> 920,366,208 per layer * 62 = 57,062,704,896
//   + embed and lm_head split by vocab 50,016 rows * 3072 * 2 = 307,298,304 each + norm 6,144
//   = 57,677,307,648 B weights per GPU.
// Reserve: 1 GiB + 8192 tokens * 2 B * (4*3072 + 1536 + 2*256 + 8*3*384) = 385,875,968
//   + logits 256 * 200064 * 4 = 204,865,536 -> 1,664,483,328.
// KV: 86,400,000,000 - 57,677,307,648 - 1,664,483,328 = 27,058,209,024 B;
//   per token 62 * 2 * 2 heads * 128 * 2 B = 63,488; blocks of 16 = 1,015,808 B
//   -> 26,637 blocks = 426,192 tokens; at 196,608 (12,288 blocks) -> 2 sequences.
// TP4+EP4: 64 whole experts * 14,159,232 = 906,190,848 too -> identical numbers; TP4 wins the tie.
// DP2xTP2+EP4: attention 22,025,472, norms 19,456, experts 906,190,848, router 3,146,752
//   -> 931,382,528 * 62 + 2 * 614,596,608 + 6,144 = 58,974,916,096; reserve 1 GiB
//   + 8192*2*(12288 + 3072 + 1024 + 8*3*768) + logits = 1,849,032,704; KV 25,576,051,200 B
//   / (16 * 126,976) = 12,589 blocks -> 1 sequence per replica, 2 in all.
// DP4xTP1+EP4: weights 61,570,132,992; KV 5,564 blocks = 89,024 tokens < 196,608 -> invalid.
TEST(PlanM25, FourBy96GB) {
  PlanOptions o;
  o.gpus = 4;
  o.gpu_memory = parse_size("96GB");
  const json p = make_plan(m25_config(), nullptr, o);
  EXPECT_EQ(I(p["options"]["usable_bytes_per_gpu"]), 86400000000);
  EXPECT_EQ(I(p["options"]["max_model_len"]), 196608);
  const json& tp4 = layout(p, "TP4");
  EXPECT_TRUE(tp4["valid"].get<bool>()) << tp4.dump();
  EXPECT_EQ(I(tp4["weights_bytes_per_gpu"]), 57677307648);
  EXPECT_EQ(I(tp4["reserve_bytes"]["activations"]), 385875968);
  EXPECT_EQ(I(tp4["reserve_bytes"]["logits"]), 204865536);
  EXPECT_EQ(I(tp4["reserve_bytes"]["total"]), 1664483328);
  EXPECT_EQ(I(tp4["kv_bytes_per_token_per_gpu"]), 63488);
  EXPECT_EQ(I(tp4["kv_blocks_per_gpu"]), 26637);
  EXPECT_EQ(I(tp4["kv_tokens_per_replica"]), 426192);
  EXPECT_EQ(I(tp4["max_concurrent_seqs"]), 2);
  const json& ep = layout(p, "TP4+EP4");
  EXPECT_EQ(I(ep["weights_bytes_per_gpu"]), 57677307648);
  EXPECT_EQ(I(ep["max_concurrent_seqs"]), 2);
  const json& dp2 = layout(p, "DP2xTP2+EP4");
  EXPECT_TRUE(dp2["valid"].get<bool>());
  EXPECT_EQ(I(dp2["weights_bytes_per_gpu"]), 58974916096);
  EXPECT_EQ(I(dp2["reserve_bytes"]["total"]), 1849032704);
  EXPECT_EQ(I(dp2["kv_blocks_per_gpu"]), 12589);
  EXPECT_EQ(I(dp2["seqs_per_replica"]), 1);
  EXPECT_EQ(I(dp2["max_concurrent_seqs"]), 2);
  const json& dp4 = layout(p, "DP4xTP1+EP4");
  EXPECT_FALSE(dp4["valid"].get<bool>());
  EXPECT_EQ(I(dp4["weights_bytes_per_gpu"]), 61570132992);
  EXPECT_EQ(I(dp4["kv_tokens_per_replica"]), 89024);
  EXPECT_NE(dp4["reasons"][0].get<std::string>().find("less than max_model_len 196608"), std::string::npos);
  EXPECT_EQ(p["recommended"], "TP4");

  // At 32K context the same KV pool holds 26,637 / 2,048 = 13 sequences on TP4.
  o.max_model_len = parse_human_int("32K");
  EXPECT_EQ(I(layout(make_plan(m25_config(), nullptr, o), "TP4")["max_concurrent_seqs"]), 13);
}

// 8 x 141 GB (141e9 B) -> usable 126,900,000,000 B.
// TP8: expert intermediate 1536/8 = 192 is not a multiple of 128 -> invalid, needs EP.
// TP8+EP8: attention 1 kv head per rank: q 768x3072 = 2,359,296 + 6*24*4, k/v 128x3072 = 393,216
//   + 24*4 each, o 3072x768 = 2,359,296 + 24*6*4 -> 5,506,368; norms 6,144 + 1,536 + 256;
//   router 3,146,752; 32 experts * 14,159,232 = 453,095,424 -> 461,762,624 * 62
//   = 28,629,282,688 + embed/lm_head 25,008 rows * 3072 * 2 = 153,649,152 each + 6,144
//   = 28,936,587,136 B. Reserve 1 GiB + 8192*2*(12288 + 768 + 256 + 8*3*192) = 293,601,280
//   + 204,865,536 = 1,572,208,640. KV 126,900,000,000 - 28,936,587,136 - 1,572,208,640
//   = 96,391,204,224 B / (16 * 31,744) = 189,782 blocks = 3,036,512 tokens -> 15 sequences.
// DP2xTP4+EP8: weights 29,585,391,360, 94,161 blocks per replica -> 7 each, 14 in all.
// DP8xTP1+EP8: weights 33,478,216,704, 22,446 blocks = 359,136 tokens -> 1 each, 8 in all.
// Recommended: TP8+EP8 (15). With an fp8 KV cache the per-token bytes halve to 15,872.
TEST(PlanM25, EightBy141GB) {
  PlanOptions o;
  o.gpus = 8;
  o.gpu_memory = parse_size("141GB");
  const json p = make_plan(m25_config(), nullptr, o);
  const json& tp8 = layout(p, "TP8");
  EXPECT_FALSE(tp8["valid"].get<bool>());
  ASSERT_FALSE(tp8["reasons"].empty());
  EXPECT_NE(tp8["reasons"][0].get<std::string>().find("1536/8 = 192 is not a multiple of the 128 weight block"),
            std::string::npos)
      << tp8["reasons"].dump();
  const json& ep8 = layout(p, "TP8+EP8");
  EXPECT_TRUE(ep8["valid"].get<bool>()) << ep8.dump();
  EXPECT_EQ(I(ep8["weights_bytes_per_gpu"]), 28936587136);
  EXPECT_EQ(I(ep8["reserve_bytes"]["total"]), 1572208640);
  EXPECT_EQ(I(ep8["kv_heads_per_gpu"]), 1);
  EXPECT_EQ(I(ep8["kv_bytes_per_token_per_gpu"]), 31744);
  EXPECT_EQ(I(ep8["kv_blocks_per_gpu"]), 189782);
  EXPECT_EQ(I(ep8["kv_tokens_per_replica"]), 3036512);
  EXPECT_EQ(I(ep8["max_concurrent_seqs"]), 15);
  EXPECT_EQ(ep8["flags"], "--tensor-parallel-size 8 --enable-expert-parallel");
  const json& dp2 = layout(p, "DP2xTP4+EP8");
  EXPECT_EQ(I(dp2["weights_bytes_per_gpu"]), 29585391360);
  EXPECT_EQ(I(dp2["kv_blocks_per_gpu"]), 94161);
  EXPECT_EQ(I(dp2["max_concurrent_seqs"]), 14);
  EXPECT_EQ(dp2["flags"], "--data-parallel-size 2 --tensor-parallel-size 4 --enable-expert-parallel");
  const json& dp8 = layout(p, "DP8xTP1+EP8");
  EXPECT_EQ(I(dp8["weights_bytes_per_gpu"]), 33478216704);
  EXPECT_EQ(I(dp8["kv_tokens_per_replica"]), 359136);
  EXPECT_EQ(I(dp8["max_concurrent_seqs"]), 8);
  EXPECT_EQ(p["recommended"], "TP8+EP8");

  o.kv_cache_dtype = "fp8";
  EXPECT_EQ(I(layout(make_plan(m25_config(), nullptr, o), "TP8+EP8")["kv_bytes_per_token_per_gpu"]), 15872);
}

// TP16 on 16 GPUs: more ranks than the 8 KV heads is allowed (replicated), not a reason.
TEST(PlanM25, KvHeadReplicationIsANoteNotAnError) {
  PlanOptions o;
  o.gpus = 16;
  o.gpu_memory = parse_size("80GiB");
  const json p = make_plan(m25_config(), nullptr, o);
  const json& l = layout(p, "TP16+EP16");
  EXPECT_EQ(I(l["kv_heads_per_gpu"]), 1);
  ASSERT_EQ(l["notes"].size(), 1u);
  EXPECT_NE(l["notes"][0].get<std::string>().find("replicated on 2 ranks"), std::string::npos);
  for (const auto& r : l["reasons"]) EXPECT_EQ(r.get<std::string>().find("KV heads"), std::string::npos) << r;
}

json index_for(const json& config, int64_t total, bool with_mtp) {
  json wm = json::object();
  wm["model.embed_tokens.weight"] = "a";
  for (int l = 0; l < 62; ++l) {
    wm["model.layers." + std::to_string(l) + ".self_attn.q_proj.weight"] = "a";
    wm["model.layers." + std::to_string(l) + ".self_attn.q_proj.weight_scale_inv"] = "a";
  }
  if (with_mtp) wm["model.layers.62.enorm.weight"] = "b";
  wm["model.layers.65.something"] = "b";  // beyond the 3 declared MTP modules: not MTP
  (void)config;
  return {{"metadata", {{"total_size", total}}}, {"weight_map", wm}};
}

TEST(PlanM25, IndexCrossCheckAndMtp) {
  PlanOptions o;
  o.gpus = 8;
  o.gpu_memory = parse_size("141GB");
  const json c = m25_config();
  json idx = index_for(c, 230121630720, false);
  json p = make_plan(c, &idx, o);
  EXPECT_EQ(I(p["checkpoint"]["index_total_size"]), 230121630720);
  EXPECT_EQ(I(p["checkpoint"]["index_minus_computed_bytes"]), 0);
  EXPECT_EQ(I(p["checkpoint"]["mtp"]["present_modules"]), 0);  // declared 3, absent: not counted
  EXPECT_EQ(I(p["checkpoint"]["index_fp8_scale_tensors"]), 62);
  EXPECT_TRUE(p["warnings"].empty()) << p["warnings"].dump();
  idx = index_for(c, 250000000000, true);
  p = make_plan(c, &idx, o);
  EXPECT_EQ(I(p["checkpoint"]["mtp"]["present_modules"]), 1);
  ASSERT_EQ(p["warnings"].size(), 1u);
  EXPECT_NE(p["warnings"][0].get<std::string>().find("differs from config arithmetic"), std::string::npos);
  // Weights per GPU never come from total_size: unchanged.
  EXPECT_EQ(I(layout(p, "TP8+EP8")["weights_bytes_per_gpu"]), 28936587136);
}

// A small Mixtral-style bf16 model, no quantization, tied embeddings:
// H 1024, 2 layers, 8 q / 2 kv heads x 128, 4 experts top-2 x 512, vocab 1000.
// Whole model: q/o 1024x1024x2 = 2,097,152 each, k/v 256x1024x2 = 524,288 each, norms 4,096,
//   router 4x1024x2 = 8,192 (bf16: not MiniMax), experts 4 * 3 * 512x1024x2 = 12,582,912
//   -> 17,838,080 per layer * 2 + embed 1000x1024x2 = 2,048,000 (tied: no lm_head) + 2,048
//   = 37,726,208.
// 2 GPUs x 1 GiB, utilization 0.5 -> 536,870,912 usable; overhead 64 MiB; 512 batched
// tokens, 16 seqs; max_model_len 4096 (max_position_embeddings).
// TP2: q/o 1,048,576 each, k/v one head 262,144 each, norms 4,096, router 8,192, experts
//   I/2 = 256: 4*3*256x1024x2 = 6,291,456 -> 8,925,184 * 2 + embed 500 rows 1,024,000 + 2,048
//   = 18,876,416. Reserve 67,108,864 + 512*2*(4096 + 512 + 256 + 2*3*256) = 6,553,600
//   + 16*1000*4 = 64,000 -> 73,726,464. KV 444,268,032 / (16 * 2*2*1*128*2 = 16,384)
//   = 27,115 blocks = 433,840 tokens; 4096 tokens = 256 blocks -> 105 sequences.
// DP2xTP1+EP2: weights 23,093,248 + 2,048,000 + 2,048 = 25,143,296; reserve 67,108,864
//   + 512*2*(4096 + 1024 + 512 + 2*3*512) + 64,000 = 76,085,760; KV 435,641,856 / 32,768
//   = 13,294 blocks -> 51 per replica, 102 in all. Recommended TP2.
TEST(PlanSynthetic, MixtralStyleTwoGpus) {
  const json cfg = {{"model_type", "mixtral"}, {"hidden_size", 1024}, {"num_hidden_layers", 2},
                    {"num_attention_heads", 8}, {"num_key_value_heads", 2}, {"head_dim", 128},
                    {"num_local_experts", 4}, {"num_experts_per_tok", 2}, {"intermediate_size", 512},
                    {"vocab_size", 1000}, {"tie_word_embeddings", true}, {"torch_dtype", "bfloat16"},
                    {"max_position_embeddings", 4096}};
  PlanOptions o;
  o.gpus = 2;
  o.gpu_memory = parse_size("1GiB");
  o.utilization = 0.5;
  o.overhead = 64 << 20;
  o.max_num_batched_tokens = 512;
  o.max_num_seqs = 16;
  const json p = make_plan(cfg, nullptr, o);
  EXPECT_EQ(I(p["checkpoint"]["computed_bytes"]), 37726208);
  const json& tp2 = layout(p, "TP2");
  EXPECT_EQ(I(tp2["weights_bytes_per_gpu"]), 18876416);
  EXPECT_EQ(I(tp2["reserve_bytes"]["total"]), 73726464);
  EXPECT_EQ(I(tp2["kv_blocks_per_gpu"]), 27115);
  EXPECT_EQ(I(tp2["kv_tokens_per_replica"]), 433840);
  EXPECT_EQ(I(tp2["max_concurrent_seqs"]), 105);
  EXPECT_EQ(I(layout(p, "TP2+EP2")["weights_bytes_per_gpu"]), 18876416);
  const json& dp2 = layout(p, "DP2xTP1+EP2");
  EXPECT_EQ(I(dp2["weights_bytes_per_gpu"]), 25143296);
  EXPECT_EQ(I(dp2["reserve_bytes"]["total"]), 76085760);
  EXPECT_EQ(I(dp2["kv_blocks_per_gpu"]), 13294);
  EXPECT_EQ(I(dp2["max_concurrent_seqs"]), 102);
  EXPECT_EQ(p["recommended"], "TP2");

  // 3 GPUs: 8 heads, 2 KV heads and 4 experts split by none of them.
  o.gpus = 3;
  const json p3 = make_plan(cfg, nullptr, o);
  const std::string r = layout(p3, "TP3")["reasons"].dump();
  EXPECT_NE(r.find("8 query heads do not split over TP 3"), std::string::npos) << r;
  EXPECT_NE(r.find("TP 3 is more than 2 KV heads"), std::string::npos) << r;
  EXPECT_NE(layout(p3, "TP3+EP3")["reasons"].dump().find("4 experts do not split over EP 3"), std::string::npos);
  EXPECT_TRUE(p3["recommended"].is_null());
}

TEST(PlanSynthetic, DenseModelHasNoEpLayouts) {
  const json cfg = {{"model_type", "llama"}, {"hidden_size", 512}, {"num_hidden_layers", 2},
                    {"num_attention_heads", 8}, {"intermediate_size", 1024}, {"vocab_size", 100},
                    {"max_position_embeddings", 256}};
  PlanOptions o;
  o.gpus = 2;
  o.gpu_memory = parse_size("2GiB");
  const json p = make_plan(cfg, nullptr, o);
  ASSERT_EQ(p["layouts"].size(), 1u);  // TP2 only
  // head_dim defaults to 512/8 = 64; kv heads default to 8: per token 2*2*4*64*2 = 2,048 B per GPU.
  EXPECT_EQ(I(p["layouts"][0]["kv_bytes_per_token_per_gpu"]), 2048);
  EXPECT_EQ(p["recommended"], "TP2");
}

TEST(PlanParse, SizesAndLengths) {
  EXPECT_EQ(parse_size("96GB"), 96000000000);
  EXPECT_EQ(parse_size("80GiB"), 80LL << 30);
  EXPECT_EQ(parse_size("141 gb"), 141000000000);
  EXPECT_EQ(parse_size("512MiB"), 512LL << 20);
  EXPECT_EQ(parse_size("1.5TB"), 1500000000000);
  EXPECT_EQ(parse_size("12345"), 12345);
  EXPECT_THROW(parse_size("96 parsecs"), moeserve::Error);
  EXPECT_THROW(parse_size("-5GB"), moeserve::Error);
  EXPECT_THROW(parse_size(""), moeserve::Error);
  EXPECT_EQ(parse_human_int("32k"), 32000);
  EXPECT_EQ(parse_human_int("32K"), 32768);
  EXPECT_THROW(parse_human_int("32x"), moeserve::Error);
}

TEST(PlanErrors, BadConfigsNameTheField) {
  PlanOptions o;
  o.gpus = 1;
  o.gpu_memory = 1000;
  auto msg = [&](const json& c) {
    try {
      make_plan(c, nullptr, o);
    } catch (const moeserve::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(json::object()).find("hidden_size"), std::string::npos);
  json c = m25_config();
  c["quantization_config"]["quant_method"] = "awq";
  EXPECT_NE(msg(c).find("awq"), std::string::npos);
  c = m25_config();
  c["num_experts_per_tok"] = 999;
  EXPECT_NE(msg(c).find("num_experts_per_tok"), std::string::npos);
  c = m25_config();
  c["kv_lora_rank"] = 512;  // MLA is modelled; its other dimensions are then required
  EXPECT_NE(msg(c).find("qk_nope_head_dim"), std::string::npos);
  c = m25_config();
  c["quantization_config"] = {{"quant_method", "compressed-tensors"}, {"format", "float-quantized"}};
  EXPECT_NE(msg(c).find("pack-quantized"), std::string::npos);
  EXPECT_THROW(candidate_layouts(0), moeserve::Error);
  json bad_index = {{"metadata", {{"total_size", "12x"}}}, {"weight_map", json::object()}};
  o.gpu_memory = 1000;
  try {
    make_plan(m25_config(), &bad_index, o);
    ADD_FAILURE() << "no error";
  } catch (const moeserve::Error& e) {
    EXPECT_NE(std::string(e.what()).find("total_size '12x'"), std::string::npos) << e.what();
  }
  bad_index = {{"weight_map", {1, 2}}};
  EXPECT_THROW(make_plan(m25_config(), &bad_index, o), moeserve::Error);
}

}  // namespace
