// MiniMax-M2: its decoder spec, tensor names, shard checks and forward (the shared blocks of
// model/layers/decoder.h, or one fused Backend::decode_layers call for a single rank).
#include "model/arch/minimax_m2.h"

#include <cstdlib>
#include <cstring>

#include "backend/decode_layer_op.h"
#include "core/debug_flags.h"
#include "core/error.h"
#include "model/registry.h"

namespace moeserve {
namespace {

// Timing diagnostics (never set in serving): MOESERVE_OP_REPEAT=op:n,... runs a layer op n
// times (0: skipped; its output is then stale, so only the time means anything). ops: qkv,
// qknorm, attn, oproj, route, experts. Measures what one op costs inside the whole graph
// (PDL overlap and dependency waits included), which an isolated kernel timing does not.
// Diagnostic build only (core/debug_flags.h refuses it elsewhere).
int op_repeat(const char* op) { return debug_flags().op_repeat_count(op); }

}  // namespace

ModelDesc MiniMaxM2Config::desc() const {
  ModelDesc d;
  d.architecture = architectures.empty() ? "MiniMaxM2ForCausalLM" : architectures[0];
  d.model_type = model_type.empty() ? "minimax_m2" : model_type;
  d.hidden_size = hidden_size;
  d.num_layers = num_hidden_layers;
  d.num_attention_heads = num_attention_heads;
  d.num_key_value_heads = num_key_value_heads;
  d.head_dim = d.v_head_dim = head_dim;
  d.rotary_dim = rotary_dim;
  d.num_experts = num_local_experts;
  d.experts_per_token = num_experts_per_tok;
  d.expert_intermediate_size = intermediate_size;
  d.vocab_size = vocab_size;
  d.max_position_embeddings = max_position_embeddings;
  d.tie_word_embeddings = tie_word_embeddings;
  d.bos_token_id = bos_token_id;
  d.eos_token_id = eos_token_id;
  d.quantization = quantization;
  d.num_mtp_modules = num_mtp_modules;
  d.use_mtp = use_mtp;
  return d;
}

DecoderSpec MiniMaxM2Config::decoder_spec() const {
  DecoderSpec s;
  s.qk_norm = QkNormMode::FullWidth;
  s.rope = RopeSpec{head_dim, rotary_dim, float(rope_theta)};
  s.route = RoutingSpec{RouteScoring::Sigmoid, 1, 1, /*renormalize=*/true, float(routed_scaling_factor)};
  s.routing_bias = use_routing_bias;
  s.rms_norm_eps = float(rms_norm_eps);
  return s;
}

DecoderNames minimax_m2_names() {
  DecoderNames n;
  n.router = "block_sparse_moe.gate.weight";
  n.router_bias = "block_sparse_moe.e_score_correction_bias";
  n.experts = "block_sparse_moe.experts.";
  n.w1 = "w1.weight", n.w3 = "w3.weight", n.w2 = "w2.weight";
  return n;
}

std::vector<WeightDecl> MiniMaxM2Config::weights(const ParallelConfig& par) const {
  std::vector<WeightDecl> d;
  declare_decoder_weights(desc(), decoder_spec(), minimax_m2_names(), par, d);
  return d;
}

std::string MiniMaxM2Config::shard_problem(const ParallelConfig& par) const {
  try {
    plan_shard(*this, par);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string MiniMaxM2Config::fp8_split_problem(const ParallelConfig& par) const {
  return decoder_fp8_split_problem(desc(), par);
}

bool MiniMaxM2Config::is_skipped_tensor(const std::string& name) const {
  return is_mtp_tensor(num_hidden_layers, num_mtp_modules, name);
}

MiniMaxM2Shard plan_shard(const MiniMaxM2Config& cfg, const ParallelConfig& par) {
  return plan_decoder_shard(cfg.desc(), par);
}

std::string fp8_split_problem(const MiniMaxM2Config& cfg, const ParallelConfig& par) {
  return cfg.fp8_split_problem(par);
}

std::vector<WeightDecl> declare_minimax_m2_weights(const MiniMaxM2Config& cfg, const ParallelConfig& par) {
  return cfg.weights(par);
}

namespace {
const MiniMaxM2Config& checked(const MiniMaxM2Config& cfg) {
  MS_CHECK(cfg.use_qk_norm, "minimax_m2 without QK-norm (use_qk_norm false) is not supported");
  MS_CHECK(cfg.routed_scaling_factor == 1.0, "routed_scaling_factor {} is not supported (MiniMax-M2 uses 1.0)",
           cfg.routed_scaling_factor);
  return cfg;
}
}  // namespace

MiniMaxM2Model::MiniMaxM2Model(MiniMaxM2Config cfg, Backend& backend, ParallelConfig par, AllReduceFn all_reduce)
    : DecoderModel(checked(cfg).desc(), cfg.decoder_spec(), minimax_m2_names(), backend, par, std::move(all_reduce)),
      cfg_(std::move(cfg)) {}

void MiniMaxM2Model::load(const Checkpoint& ckpt) {
  load_decoder(ckpt, cfg_.weights(par_), [this](const std::string& n) { return cfg_.is_skipped_tensor(n); });
}

Tensor MiniMaxM2Model::forward(const Tensor& ids, const AttentionMeta& meta, std::vector<KVCacheLayer>& kv,
                               const Tensor& rows) {
  MS_CHECK(!w_.layers.empty(), "MiniMaxM2Model::forward before load");
  MS_CHECK(int(kv.size()) == cfg_.num_hidden_layers, "KV cache has {} layers, model {}", kv.size(),
           cfg_.num_hidden_layers);
  StepViews s = begin_step(meta.num_tokens, rows.defined() ? rows.numel() : 0);
  embed(ids, s);
  static const Repeat rep{op_repeat("qkv"),   op_repeat("qknorm"), op_repeat("attn"),
                          op_repeat("oproj"), op_repeat("route"),  op_repeat("experts")};
  // Single-rank steps run each layer as Backend::decode_layer; the op-repeat diagnostics, the
  // per-op profile (op hook) and tensor parallelism (all-reduces between the ops) keep the
  // separate ops.
  static const bool any_repeat = !debug_flags().op_repeat.empty();
  // Capturing hidden states for a draft head needs the layer boundaries, and bench-model's
  // routing override the MoE block's own experts call: separate ops too.
  const bool single_layer_op = par_.world == 1 && !any_repeat && !op_hook_ && !capturing() && !routing_overridden();
  if (single_layer_op) {
    std::vector<DecodeLayerArgs> layer_ops;  // all layers, handed over at once (one kernel on CUDA at batch 1)
    layer_ops.reserve(size_t(desc_.num_layers));
    for (int l = 0; l < desc_.num_layers; ++l) {
      DecoderLayer& L = w_.layers[size_t(l)];
      DecodeLayerArgs da;
      da.first = l == 0;
      da.residual = &s.residual, da.moe_out = &s.moe_out;
      da.x = &s.x, da.q = &s.q, da.k = &s.k, da.v = &s.v, da.attn = &s.attn, da.o = &s.o;
      da.input_norm = &L.input_norm, da.post_attention_norm = &L.post_attention_norm, da.eps = spec_.rms_norm_eps;
      da.wq = &L.q, da.wk = &L.k, da.wv = &L.v, da.wo = &L.o;
      da.moe = &L.moe, da.routing = &s.routing;
      da.qk = qk_args(l, s, meta), da.attn_args = attention_args(l, s, kv, meta), da.kv = &kv[size_t(l)];
      da.meta = &meta;
      layer_ops.push_back(da);
    }
    be_.decode_layers(layer_ops.data(), int(layer_ops.size()));
  } else {
    for (int l = 0; l < desc_.num_layers; ++l) {
      capture_boundary(l, s, ids);  // draft-head taps (no-op unless set_capture asked)
      attention_block(l, s, kv, meta, rep);
      moe_block(l, s, rep);
    }
    capture_boundary(desc_.num_layers, s, ids);
  }
  Tensor logits = final_logits(s, rows);
  capture_final(s);
  return logits;
}

// The registry entry (model/registry.cpp lists it).
ArchEntry minimax_m2_arch() {
  ArchEntry e;
  e.architecture = "MiniMaxM2ForCausalLM";
  e.model_types = {"minimax_m2", "minimax_m2_5"};
  e.parse = [](const nlohmann::json& j) -> std::unique_ptr<ArchConfig> {
    return std::make_unique<MiniMaxM2Config>(MiniMaxM2Config::from_json(j));
  };
  e.create = [](const ArchConfig& c, Backend& b, ParallelConfig p, AllReduceFn ar) -> std::unique_ptr<Model> {
    return std::make_unique<MiniMaxM2Model>(static_cast<const MiniMaxM2Config&>(c), b, p, std::move(ar));
  };
  return e;
}

}  // namespace moeserve
