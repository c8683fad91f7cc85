#include "tools/bench_step.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/registry.h"

#include <nlohmann/json.hpp>

namespace moeserve::tools {

SynthShapes shapes_of(const ModelDesc& d) {
  SynthShapes s;
  s.hidden = d.hidden_size, s.q_heads = d.num_attention_heads, s.kv_heads = d.num_key_value_heads;
  s.head_dim = d.head_dim, s.rotary_dim = d.rotary_dim, s.experts = d.num_experts;
  s.top_k = d.experts_per_token, s.intermediate = d.expert_intermediate_size, s.vocab = d.vocab_size;
  s.total_layers = d.num_layers;
  return s;
}

namespace {
// Qwen/Qwen3-30B-A3B's config.json (tests/fixtures/models/qwen3-30b-a3b) with the FP8
// checkpoint's quantization_config (Qwen/Qwen3-30B-A3B-FP8).
constexpr const char* kQwen3_30B_A3B = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": false,
  "bos_token_id": 151643, "eos_token_id": 151645, "decoder_sparse_step": 1, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
  "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
  "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0, "sliding_window": null,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]}})";
// deepseek-ai/DeepSeek-V3's config.json (tests/fixtures/models/deepseek-v3), FP8 128x128 blocks.
constexpr const char* kDeepseekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": false,
  "bos_token_id": 0, "eos_token_id": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
  "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 163840, "moe_intermediate_size": 2048,
  "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": true,
  "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61, "num_key_value_heads": 128,
  "num_nextn_predict_layers": 1, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                          "weight_block_size": [128, 128]},
  "rms_norm_eps": 1e-06, "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0,
  "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"}, "rope_theta": 10000,
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": false, "topk_group": 4,
  "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 129280})";
// --synthetic kimi-k2.5-fp8: moonshotai/Kimi-K2.5's text config (tests/fixtures/models/kimi-k2.5)
// with FP8 128x128 blocks everywhere in place of its INT4 experts: the MLA / MoE shapes on the
// FP8 kernels, to compare with the INT4 run.
constexpr const char* kKimiK25Fp8 = R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 61,
  "hidden_size": 7168, "first_k_dense_replace": 1, "intermediate_size": 18432, "n_routed_experts": 384,
  "moe_intermediate_size": 2048, "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1,
  "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true,
  "routed_scaling_factor": 2.827, "moe_layer_freq": 1, "num_attention_heads": 64, "num_key_value_heads": 64,
  "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
  "rms_norm_eps": 1e-05, "vocab_size": 163840, "max_position_embeddings": 262144, "rope_theta": 50000.0,
  "rope_scaling": {"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
  "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}, "num_nextn_predict_layers": 0,
  "attention_bias": false, "hidden_act": "silu", "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "bos_token_id": 163584, "eos_token_id": 163585, "quantization_config": {"activation_scheme": "dynamic",
  "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}})";
// moonshotai/Kimi-K2.5's text_config (the DeepSeek-V3 backbone; ../shared/reference/wave2-research.md
// section 5) with its quantization_config: compressed-tensors pack-quantized INT4 (group 32) for the
// routed experts only; attention, shared experts, the dense layer, router and lm_head are BF16.
constexpr const char* kKimiK25 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "attention_bias": false,
  "bos_token_id": 163584, "eos_token_id": 163585, "first_k_dense_replace": 1, "hidden_act": "silu",
  "hidden_size": 7168, "intermediate_size": 18432, "kv_lora_rank": 512, "max_position_embeddings": 262144,
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 384, "n_shared_experts": 1,
  "norm_topk_prob": true, "num_attention_heads": 64, "num_experts_per_tok": 8, "num_hidden_layers": 61,
  "num_key_value_heads": 64, "num_nextn_predict_layers": 0, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
  "qk_rope_head_dim": 64, "rms_norm_eps": 1e-05,
  "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 64, "mscale": 1.0, "mscale_all_dim": 1.0,
                   "original_max_position_embeddings": 4096, "type": "yarn"},
  "rope_theta": 50000, "routed_scaling_factor": 2.827, "scoring_func": "sigmoid", "tie_word_embeddings": false,
  "topk_group": 1, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "v_head_dim": 128, "vocab_size": 163840,
  "quantization_config": {"quant_method": "compressed-tensors", "format": "pack-quantized",
    "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "output_activations": null,
      "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32,
                  "dynamic": false, "observer": "minmax", "actorder": null, "block_structure": null}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": null}})";
}  // namespace

std::string synthetic_model_names() {
  return "minimax-m2.5, qwen3-30b-a3b, deepseek-v3, kimi-k2.5, kimi-k2.5-fp8, minimax-m2-tiny";
}

SyntheticModel synthetic_model(const std::string& name, int layers) {
  SyntheticModel m;
  if (name == "minimax-m2.5") {
    m.config = std::make_unique<MiniMaxM2Config>(synth_config(m.shapes, layers));  // shapes: the defaults
    return m;
  }
  if (name == "minimax-m2-tiny") {
    // MiniMax-M2's layer with tiny widths and bf16 weights (no FP8 blocks): the CPU runs and
    // their tests. 32 experts top-4, so the distinct experts of a few tokens are countable.
    SynthShapes t;
    t.hidden = 64, t.q_heads = 4, t.kv_heads = 2, t.head_dim = 32, t.rotary_dim = 16;
    t.experts = 32, t.top_k = 4, t.intermediate = 32, t.vocab = 512, t.total_layers = layers;
    MiniMaxM2Config c = synth_config(t, layers);
    c.quantization = {};
    m.shapes = t;
    m.config = std::make_unique<MiniMaxM2Config>(std::move(c));
    return m;
  }
  MS_CHECK(name == "qwen3-30b-a3b" || name == "deepseek-v3" || name == "kimi-k2.5" || name == "kimi-k2.5-fp8",
           "bench-model: unknown --synthetic '{}' (known: {})", name, synthetic_model_names());
  nlohmann::json j = nlohmann::json::parse(name == "deepseek-v3" ? kDeepseekV3
                                           : name == "kimi-k2.5"  ? kKimiK25
                                           : name == "kimi-k2.5-fp8" ? kKimiK25Fp8
                                                                 : kQwen3_30B_A3B);
  m.shapes = shapes_of(parse_config(j).config->desc());  // total_layers: the real 48
  j["num_hidden_layers"] = layers;
  m.config = parse_config(j).config;
  return m;
}

std::unique_ptr<DecoderModel> make_bench_model(const ArchConfig& cfg, Backend& b) {
  const ModelDesc d = cfg.desc();
  const ArchEntry& e = find_architecture(nlohmann::json{{"architectures", {d.architecture}}});
  std::unique_ptr<Model> m = e.create(cfg, b, ParallelConfig{}, nullptr);
  auto* dm = dynamic_cast<DecoderModel*>(m.get());
  MS_CHECK(dm, "bench-model: architecture {} is not built on the shared decoder layers", d.architecture);
  m.release();
  return std::unique_ptr<DecoderModel>(dm);
}

DecodeBytes decode_bytes(const SynthShapes& s, const MiniMaxM2Shard& shard, int world, bool expert_parallel, int B,
                         int C, int kv_elem_bytes) {
  const double H = s.hidden, D = s.head_dim, W = world;
  const double QW = double(shard.q_heads) * D, KW = double(shard.kv_heads) * D;
  auto fp8 = [](double o, double i) { return o * i + std::ceil(o / 128) * std::ceil(i / 128) * 4; };
  auto expert = [&](double inter) { return 2 * fp8(inter, H) + fp8(H, inter); };
  DecodeBytes d;
  d.attn_w = W * (fp8(QW, H) + 2 * fp8(KW, H) + fp8(H, QW));
  d.router = W * double(s.experts) * H * 4;
  d.distinct = s.experts * (1.0 - std::pow(1.0 - double(s.top_k) / s.experts, B));
  d.experts = expert_parallel ? d.distinct * expert(s.intermediate) : W * d.distinct * expert(shard.expert_inter);
  d.kv = W * double(B) * C * KW * 2 /*K,V*/ * kv_elem_bytes;
  return d;
}

DecodeBytes model_decode_bytes(const DecoderModel& model, int B, int C, int kv_elem_bytes) {
  const DecoderWeights& w = model.weights();
  auto t = [](const Tensor& x) { return x.defined() ? double(x.nbytes()) : 0.0; };
  auto lin = [&](const LinearWeight& l) { return t(l.weight) + t(l.scale_inv); };
  auto mlp = [&](const ExpertWeights& e) { return lin(e.w1) + lin(e.w2) + lin(e.w3); };
  DecodeBytes d;
  for (const DecoderLayer& L : w.layers) {
    d.attn_w += t(L.input_norm) + t(L.post_attention_norm) + t(L.q_norm) + t(L.k_norm);
    d.attn_w += lin(L.q) + lin(L.k) + lin(L.v) + lin(L.o);
    d.attn_w += lin(L.mla.q_a) + lin(L.mla.q_b) + lin(L.mla.kv_a) + lin(L.mla.kv_b) + t(L.mla.q_a_norm) +
                t(L.mla.kv_a_norm);
    if (L.dense) {
      d.attn_w += mlp(L.mlp);  // the dense MLP is read whole, like the projections
      continue;
    }
    d.router += t(L.moe.gate) + t(L.moe.score_bias);
    d.attn_w += mlp(L.shared);
    const double E = double(L.moe.experts.size()), K = L.moe.top_k;
    const double distinct = E > 0 ? E * (1.0 - std::pow(1.0 - K / E, B)) : 0.0;
    d.distinct = distinct;
    if (!L.moe.experts.empty()) d.experts += distinct * mlp(L.moe.experts.front());
  }
  const KvLayout kl = model.kv_layout();
  d.kv = double(kl.num_layers) * B * C * double(kl.kv_heads) * (kl.k_head_dim + kl.v_head_dim) * kv_elem_bytes;
  const double n = std::max<size_t>(1, w.layers.size());
  d.attn_w /= n, d.router /= n, d.experts /= n, d.kv /= n;  // per layer, as decode_bytes
  return d;
}

MiniMaxM2Config synth_config(const SynthShapes& s, int layers) {
  MiniMaxM2Config c;
  c.architectures = {"MiniMaxM2ForCausalLM"};
  c.model_type = "minimax_m2";
  c.hidden_size = s.hidden, c.num_hidden_layers = layers, c.num_attention_heads = s.q_heads;
  c.num_key_value_heads = s.kv_heads, c.head_dim = s.head_dim, c.rotary_dim = s.rotary_dim;
  c.rope_theta = s.theta, c.max_position_embeddings = 196608, c.intermediate_size = s.intermediate;
  c.num_local_experts = s.experts, c.num_experts_per_tok = s.top_k, c.rms_norm_eps = s.eps;
  c.vocab_size = s.vocab;
  c.quantization.quant_method = "fp8";
  c.quantization.fmt = "float8_e4m3fn";
  c.quantization.activation_scheme = "dynamic";
  c.quantization.block_out = c.quantization.block_in = 128;
  return c;
}

BenchStep::BenchStep(Backend& b, DecoderModel& model, int max_tokens, int max_seqs, int max_blocks_per_seq)
    : b_(b), model_(model), max_tokens_(max_tokens), max_seqs_(max_seqs), max_blocks_(max_blocks_per_seq) {
  const ModelDesc c = model.desc();
  const int T = max_tokens;
  ids_ = b_.alloc(DType::I32, {T});
  last_rows_ = b_.alloc(DType::I32, {std::max(max_seqs, max_tokens)});  // all tokens' rows fit (verify steps)
  meta_.positions = b_.alloc(DType::I32, {T});
  meta_.slot_mapping = b_.alloc(DType::I32, {T});
  meta_.query_start = b_.alloc(DType::I32, {max_seqs + 1});
  meta_.context_lens = b_.alloc(DType::I32, {max_seqs});
  meta_.block_tables = b_.alloc(DType::I32, {max_seqs, max_blocks_per_seq});
  // Token ids: a fixed spread over the vocabulary (embedding rows are random or real).
  std::vector<int32_t> ids(T);
  for (int i = 0; i < T; ++i) ids[i] = int32_t((int64_t(i) * 7919) % c.vocab_size);
  b_.copy_from_host(ids_, ids.data(), ids.size() * 4);
  model_.reserve_workspace(T, max_seqs);
  const DecoderShard& sh = model.shard();
  b_.reserve_workspaces(BackendWorkspaceDims{T, c.hidden_size, sh.expert_inter, c.experts_per_token, sh.num_experts,
                                             sh.q_heads, c.head_dim, false});
}

void BenchStep::alloc_kv(int blocks, int block_size, DType dtype, const std::function<void(Tensor&, uint64_t)>& fill) {
  meta_.block_size = block_size;
  kv_ = allocate_kv_cache(b_, model_.kv_layout(), blocks, block_size, dtype);
  if (!fill) return;
  for (size_t l = 0; l < kv_.size(); ++l) {
    fill(kv_[l].k, 77 + l);
    fill(kv_[l].v, 99 + l);
  }
}

void BenchStep::plan(const std::vector<int>& qlens, const std::vector<int>& ctxs) {
  const int S = int(qlens.size()), bs = meta_.block_size;
  MS_CHECK(S <= max_seqs_, "bench plan: {} sequences > {}", S, max_seqs_);
  std::vector<int32_t> pos, slots, qstart{0}, ctx(ctxs.begin(), ctxs.end()), table(size_t(S) * max_blocks_), last(S);
  int max_q = 0, max_ctx = 0;
  // Sequences own consecutive runs of `stride` blocks (the longest context of this step), so
  // the pool need only hold S * stride blocks, not S * max_blocks_per_seq.
  int stride = 1;
  for (int c : ctxs) stride = std::max(stride, (c + bs - 1) / bs);
  for (int s = 0; s < S; ++s) {
    MS_CHECK((ctxs[s] + bs - 1) / bs <= max_blocks_, "bench plan: context {} needs more than {} blocks", ctxs[s],
             max_blocks_);
    for (int b = 0; b < max_blocks_; ++b) table[size_t(s) * max_blocks_ + b] = s * stride + std::min(b, stride - 1);
    for (int i = 0; i < qlens[s]; ++i) {
      const int p = ctxs[s] - qlens[s] + i;
      pos.push_back(p);
      slots.push_back((s * stride + p / bs) * bs + p % bs);
    }
    qstart.push_back(qstart.back() + qlens[s]);
    last[s] = qstart.back() - 1;
    max_q = std::max(max_q, qlens[s]);
    max_ctx = std::max(max_ctx, ctxs[s]);
  }
  T_ = qstart.back();
  S_ = S;
  if (logits_all_) {  // every query token's row
    last.resize(size_t(T_));
    for (int t = 0; t < T_; ++t) last[size_t(t)] = t;
  }
  R_ = int(last.size());
  MS_CHECK(T_ <= max_tokens_, "bench plan: {} tokens > {}", T_, max_tokens_);
  MS_CHECK(int64_t(S) * stride <= kv_blocks(), "bench plan: KV pool too small");
  meta_.num_seqs = S, meta_.num_tokens = T_, meta_.max_blocks_per_seq = max_blocks_;
  meta_.max_query_len = max_q, meta_.max_context_len = max_ctx;
  auto put = [&](Tensor& t, const std::vector<int32_t>& v) {
    Tensor view = t.reshaped({t.numel()}).slice_rows(0, int64_t(v.size()));
    b_.copy_from_host(view, v.data(), v.size() * 4);
  };
  put(meta_.positions, pos);
  put(meta_.slot_mapping, slots);
  put(meta_.query_start, qstart);
  put(meta_.context_lens, ctx);
  put(meta_.block_tables, table);
  put(last_rows_, last);
}

void BenchStep::set_ids(const std::vector<int32_t>& ids) {
  MS_CHECK(int(ids.size()) <= max_tokens_, "bench step: {} ids > {} tokens", ids.size(), max_tokens_);
  Tensor view = ids_.slice_rows(0, int64_t(ids.size()));
  b_.copy_from_host(view, ids.data(), ids.size() * 4);
}

Tensor BenchStep::forward() {
  // The step's views: T tokens and S sequences of the fixed buffers.
  AttentionMeta m = meta_;
  m.positions = meta_.positions.slice_rows(0, T_);
  m.slot_mapping = meta_.slot_mapping.slice_rows(0, T_);
  m.query_start = meta_.query_start.slice_rows(0, S_ + 1);
  m.context_lens = meta_.context_lens.slice_rows(0, S_);
  m.block_tables = meta_.block_tables.slice_rows(0, S_);
  return model_.forward(ids_.slice_rows(0, T_), m, kv_, logits_ ? last_rows_.slice_rows(0, R_) : Tensor{});
}

std::vector<float> BenchStep::routing_ids() {
  // The workspace keeps the routing of the last layer of the last step.
  return b_.download_f32(model_.workspace().expert_ids.slice_rows(0, T_));
}

SyntheticModel bench_model_config(const std::string& checkpoint, const std::string& synthetic, int layers) {
  if (checkpoint.empty()) return synthetic_model(synthetic, layers > 0 ? layers : 4);
  SyntheticModel m;
  LoadedConfig lc = load_model_config(checkpoint);
  m.shapes = shapes_of(lc.config->desc());
  if (layers > 0 && layers < m.shapes.total_layers)
    lc = load_model_config(checkpoint, nlohmann::json{{"num_hidden_layers", layers}}.dump());
  m.config = std::move(lc.config);
  return m;
}

}  // namespace moeserve::tools
