#include "model/minimax_m2.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>

#include "core/error.h"
#include "core/log.h"

namespace moeserve {
namespace {

const std::vector<DType> kDense{DType::BF16, DType::F16, DType::F32};
const std::vector<DType> kLinear{DType::BF16, DType::F16, DType::F32, DType::F8_E4M3};

std::string layer_prefix(int l) { return "model.layers." + std::to_string(l) + "."; }
std::string expert_prefix(int l, int e) {
  return layer_prefix(l) + "block_sparse_moe.experts." + std::to_string(e) + ".";
}

// Host f32 copy (for small tensors the backend contract wants in f32, e.g. the router bias).
Tensor to_f32_host(const Tensor& t) {
  if (t.dtype == DType::F32) return t;
  Tensor f = Tensor::host(DType::F32, t.shape);
  convert_to_f32(t.dtype, t.data, f.ptr<float>(), size_t(t.numel()));
  return f;
}

// Host BF16 copy of a F16/F32 tensor. A bf16-activation backend (CUDA) runs its GEMMs on
// BF16 or FP8 weights only, so F16 tensors and F32 matrices are rounded to BF16 on the way
// (relative rounding <= 2^-9, inside the bf16 tolerance the CUDA golden check holds).
Tensor to_bf16_host(const Tensor& t) {
  std::vector<float> f(size_t(t.numel()));
  convert_to_f32(t.dtype, t.data, f.data(), f.size());
  Tensor b = Tensor::host(DType::BF16, t.shape);
  auto* out = b.ptr<uint16_t>();
  for (size_t i = 0; i < f.size(); ++i) out[i] = f32_to_bf16(f[i]);
  return b;
}

// Timing diagnostics (never set in serving): MOESERVE_OP_REPEAT=op:n,... runs a layer op n
// times (0: skipped; its output is then stale, so only the time means anything). ops: qkv,
// qknorm, attn, oproj, route, experts. Measures what one op costs inside the whole graph
// (PDL overlap and dependency waits included), which an isolated kernel timing does not.
int op_repeat(const char* op) {
  static const char* env = std::getenv("MOESERVE_OP_REPEAT");
  if (!env) return 1;
  const size_t n = std::strlen(op);
  for (const char* s = env; (s = std::strstr(s, op)) != nullptr; s += n)
    if ((s == env || s[-1] == ',') && s[n] == ':') return std::atoi(s + n + 1);
  return 1;
}

}  // namespace

MiniMaxM2Shard plan_shard(const MiniMaxM2Config& cfg, const ParallelConfig& par) {
  MS_CHECK(par.world >= 1 && par.rank >= 0 && par.rank < par.world, "invalid parallel rank {} of {}", par.rank,
           par.world);
  MiniMaxM2Shard s;
  const int W = par.world;
  MS_CHECK(cfg.num_attention_heads % W == 0, "num_attention_heads {} does not split over {} tensor-parallel ranks",
           cfg.num_attention_heads, W);
  s.q_heads = cfg.num_attention_heads / W;
  if (cfg.num_key_value_heads >= W) {
    MS_CHECK(cfg.num_key_value_heads % W == 0, "num_key_value_heads {} does not split over {} ranks",
             cfg.num_key_value_heads, W);
    s.kv_heads = cfg.num_key_value_heads / W;
  } else {
    // More ranks than KV heads: each KV head is replicated on W / Hkv ranks.
    MS_CHECK(W % cfg.num_key_value_heads == 0, "{} ranks is not a multiple of num_key_value_heads {}", W,
             cfg.num_key_value_heads);
    s.kv_heads = 1;
    s.kv_replicate = W / cfg.num_key_value_heads;
  }
  if (par.expert_parallel) {
    MS_CHECK(cfg.num_local_experts % W == 0, "num_local_experts {} does not split over {} expert-parallel ranks",
             cfg.num_local_experts, W);
    s.num_experts = cfg.num_local_experts / W;
    s.first_expert = par.rank * s.num_experts;
    s.expert_inter = cfg.intermediate_size;
  } else {
    MS_CHECK(cfg.intermediate_size % W == 0, "intermediate_size {} does not split over {} tensor-parallel ranks",
             cfg.intermediate_size, W);
    s.num_experts = cfg.num_local_experts;
    s.expert_inter = cfg.intermediate_size / W;
  }
  return s;
}

std::string fp8_split_problem(const MiniMaxM2Config& cfg, const ParallelConfig& par) {
  if (!cfg.quantization.enabled() || par.world == 1) return "";
  const MiniMaxM2Shard s = plan_shard(cfg, par);
  const int bo = cfg.quantization.block_out, bi = cfg.quantization.block_in;
  const int64_t D = cfg.head_dim;
  auto bad = [&](const char* what, int64_t full, int64_t local, int block, const char* hint) {
    return fmt::format(
        "{} ({} split over {} ranks = {} per rank) is not a multiple of the FP8 weight block {}: {}", what, full,
        par.world, local, block, hint);
  };
  const char* tp_hint = "choose a tensor-parallel size that keeps whole blocks";
  if ((int64_t(s.q_heads) * D) % bo) return bad("q_proj rows", cfg.num_attention_heads * D, s.q_heads * D, bo, tp_hint);
  if ((int64_t(s.q_heads) * D) % bi) return bad("o_proj columns", cfg.num_attention_heads * D, s.q_heads * D, bi, tp_hint);
  if ((int64_t(s.kv_heads) * D) % bo)
    return bad("k_proj/v_proj rows", cfg.num_key_value_heads * D, s.kv_heads * D, bo, tp_hint);
  if (!par.expert_parallel) {
    const char* ep_hint = "use --enable-expert-parallel (whole experts per rank) or a smaller tensor-parallel size";
    if (s.expert_inter % bo) return bad("expert intermediate_size (w1/w3 rows)", cfg.intermediate_size, s.expert_inter, bo, ep_hint);
    if (s.expert_inter % bi) return bad("expert intermediate_size (w2 columns)", cfg.intermediate_size, s.expert_inter, bi, ep_hint);
  }
  return "";
}

std::vector<WeightDecl> declare_minimax_m2_weights(const MiniMaxM2Config& cfg, const ParallelConfig& par) {
  const MiniMaxM2Shard s = plan_shard(cfg, par);
  const int64_t H = cfg.hidden_size, D = cfg.head_dim, I = cfg.intermediate_size, E = cfg.num_local_experts;
  const int64_t Hq = int64_t(cfg.num_attention_heads) * D, Hkv = int64_t(cfg.num_key_value_heads) * D;
  const ShardSpec rep{};
  const ShardSpec col{ShardKind::ColumnParallel, par.rank, par.world};
  const ShardSpec row{ShardKind::RowParallel, par.rank, par.world};
  const ShardSpec kv_col{ShardKind::ColumnParallel, par.rank, par.world, s.kv_replicate};
  std::vector<WeightDecl> d;
  d.push_back({"model.embed_tokens.weight", {cfg.vocab_size, H}, kDense, rep});
  for (int l = 0; l < cfg.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    d.push_back({p + "input_layernorm.weight", {H}, kDense, rep});
    d.push_back({p + "post_attention_layernorm.weight", {H}, kDense, rep});
    d.push_back({p + "self_attn.q_proj.weight", {Hq, H}, kLinear, col});
    d.push_back({p + "self_attn.k_proj.weight", {Hkv, H}, kLinear, kv_col});
    d.push_back({p + "self_attn.v_proj.weight", {Hkv, H}, kLinear, kv_col});
    d.push_back({p + "self_attn.o_proj.weight", {H, Hq}, kLinear, row});
    d.push_back({p + "self_attn.q_norm.weight", {Hq}, kDense, col});
    d.push_back({p + "self_attn.k_norm.weight", {Hkv}, kDense, kv_col});
    d.push_back({p + "block_sparse_moe.gate.weight", {E, H}, kDense, rep});
    if (cfg.use_routing_bias) d.push_back({p + "block_sparse_moe.e_score_correction_bias", {E}, kDense, rep});
    for (int e = 0; e < E; ++e) {
      const std::string q = expert_prefix(l, e);
      if (par.expert_parallel) {
        ShardSpec own{ShardKind::ExpertOwned, par.rank, par.world};
        own.owned = e >= s.first_expert && e < s.first_expert + s.num_experts;
        d.push_back({q + "w1.weight", {I, H}, kLinear, own});
        d.push_back({q + "w3.weight", {I, H}, kLinear, own});
        d.push_back({q + "w2.weight", {H, I}, kLinear, own});
      } else {
        d.push_back({q + "w1.weight", {I, H}, kLinear, col});
        d.push_back({q + "w3.weight", {I, H}, kLinear, col});
        d.push_back({q + "w2.weight", {H, I}, kLinear, row});
      }
    }
  }
  d.push_back({"model.norm.weight", {H}, kDense, rep});
  // Tied embeddings (HF semantics): the output projection is embed_tokens; a stored
  // lm_head.weight is not used.
  if (!cfg.tie_word_embeddings) d.push_back({"lm_head.weight", {cfg.vocab_size, H}, kDense, rep});
  return d;
}

MiniMaxM2Model::MiniMaxM2Model(MiniMaxM2Config cfg, Backend& backend, ParallelConfig par, AllReduceFn all_reduce)
    : cfg_(std::move(cfg)), be_(backend), par_(par), all_reduce_(std::move(all_reduce)) {
  MS_CHECK(cfg_.use_qk_norm, "minimax_m2 without QK-norm (use_qk_norm false) is not supported");
  MS_CHECK(cfg_.routed_scaling_factor == 1.0, "routed_scaling_factor {} is not supported (MiniMax-M2 uses 1.0)",
           cfg_.routed_scaling_factor);
  MS_CHECK(par_.world == 1 || all_reduce_, "{} ranks need an all-reduce", par_.world);
  shard_ = plan_shard(cfg_, par_);
}

void MiniMaxM2Model::all_reduce(Tensor& t) {
  if (par_.world > 1) all_reduce_(t);
}

void MiniMaxM2Model::load(const Checkpoint& ckpt) {
  const auto decls = declare_minimax_m2_weights(cfg_, par_);
  std::map<std::string, LoadedTensor> got;
  for (const auto& d : decls) got[d.name] = load_weight(ckpt, d, cfg_.quantization);

  // Tensors that are neither declared, nor scales of declared FP8 weights, nor MTP modules.
  int mtp = 0, unexpected = 0;
  for (const auto& n : ckpt.names()) {
    if (got.count(n)) continue;
    if (n.size() > 10 && n.compare(n.size() - 10, 10, "_scale_inv") == 0 && got.count(n.substr(0, n.size() - 10)))
      continue;
    if (is_mtp_tensor(cfg_, n)) {
      ++mtp;
      continue;
    }
    if (unexpected++ < 8) spdlog::warn("checkpoint {}: unexpected tensor '{}' ignored", ckpt.dir(), n);
  }
  if (mtp) spdlog::info("checkpoint {}: skipped {} MTP tensors", ckpt.dir(), mtp);
  if (unexpected > 8) spdlog::warn("checkpoint {}: {} unexpected tensors ignored in all", ckpt.dir(), unexpected);

  // What the backend computes in: on a bf16-activation backend every F16/F32 tensor except
  // the router (gate and bias, uploaded as exact F32 below) becomes BF16, so matrices run on
  // the bf16/FP8 GEMMs and norm weights match the bf16 activations they scale.
  const bool bf16_backend = be_.activation_dtype() == DType::BF16;
  auto host_for_backend = [&](const Tensor& t) {
    if (bf16_backend && (t.dtype == DType::F16 || t.dtype == DType::F32)) return to_bf16_host(t);
    return t;
  };
  auto up = [&](const std::string& name) { return be_.upload(host_for_backend(got.at(name).tensor)); };
  auto up_lin = [&](const std::string& name) {
    LinearWeight w = got.at(name).linear();
    w.weight = be_.upload(host_for_backend(w.weight));
    if (w.fp8()) w.scale_inv = be_.upload(w.scale_inv);
    return w;
  };
  w_ = MiniMaxM2Weights{};
  w_.embed = be_.upload(host_for_backend(got.at("model.embed_tokens.weight").tensor));
  for (int l = 0; l < cfg_.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    MiniMaxM2Layer L;
    L.input_norm = up(p + "input_layernorm.weight");
    L.post_attention_norm = up(p + "post_attention_layernorm.weight");
    L.q = up_lin(p + "self_attn.q_proj.weight");
    L.k = up_lin(p + "self_attn.k_proj.weight");
    L.v = up_lin(p + "self_attn.v_proj.weight");
    L.o = up_lin(p + "self_attn.o_proj.weight");
    L.q_norm = up(p + "self_attn.q_norm.weight");
    L.k_norm = up(p + "self_attn.k_norm.weight");
    L.moe.gate = be_.upload(to_f32_host(got.at(p + "block_sparse_moe.gate.weight").tensor));  // exact
    if (cfg_.use_routing_bias)
      L.moe.score_bias = be_.upload(to_f32_host(got.at(p + "block_sparse_moe.e_score_correction_bias").tensor));
    L.moe.num_experts = cfg_.num_local_experts;
    L.moe.top_k = cfg_.num_experts_per_tok;
    L.moe.first_local_expert = shard_.first_expert;
    if (be_.device() == Device::CUDA) {
      // The layer's experts in one device allocation: a separate allocation per matrix is
      // rounded up to 2 MiB, which wastes a third of a 4.5 MiB M2.5 expert matrix.
      std::vector<LinearWeight> lin;
      for (int e = shard_.first_expert; e < shard_.first_expert + shard_.num_experts; ++e)
        for (const char* m : {"w1.weight", "w3.weight", "w2.weight"})
          lin.push_back(got.at(expert_prefix(l, e) + m).linear());
      for (auto& w : lin)
        if (!w.fp8()) w.weight = host_for_backend(w.weight);
      auto pad = [](size_t n) { return (n + 255) / 256 * 256; };
      size_t bytes = 0;
      for (const auto& w : lin) bytes += pad(w.weight.nbytes()) + (w.fp8() ? pad(w.scale_inv.nbytes()) : 0);
      Tensor slab = be_.alloc(DType::U8, {int64_t(std::max<size_t>(bytes, 1))});
      size_t at = 0;
      auto put = [&](Tensor& t) {
        Tensor v = Tensor::view(static_cast<char*>(slab.data) + at, t.dtype, t.shape, Device::CUDA);
        v.owner = slab.owner;
        if (t.nbytes()) be_.copy_from_host(v, t.data, t.nbytes());
        at += pad(t.nbytes());
        t = v;
      };
      for (auto& w : lin) {
        put(w.weight);
        if (w.fp8()) put(w.scale_inv);
      }
      for (size_t i = 0; i + 2 < lin.size(); i += 3) L.moe.experts.push_back({lin[i], lin[i + 1], lin[i + 2]});
    } else {
      for (int e = shard_.first_expert; e < shard_.first_expert + shard_.num_experts; ++e) {
        const std::string q = expert_prefix(l, e);
        L.moe.experts.push_back({up_lin(q + "w1.weight"), up_lin(q + "w3.weight"), up_lin(q + "w2.weight")});
      }
    }
    w_.layers.push_back(std::move(L));
  }
  w_.final_norm = up("model.norm.weight");
  if (cfg_.tie_word_embeddings) {
    w_.lm_head = LinearWeight{w_.embed, Tensor{}, 0, 0};
  } else {
    w_.lm_head = up_lin("lm_head.weight");
  }
}

std::vector<KVCacheLayer> MiniMaxM2Model::allocate_kv_cache(int num_blocks, int block_size, DType dtype) const {
  std::vector<KVCacheLayer> kv(size_t(cfg_.num_hidden_layers));
  Shape s{num_blocks, block_size, shard_.kv_heads, cfg_.head_dim};
  for (auto& layer : kv) {
    layer.k = be_.alloc(dtype, s);
    layer.v = be_.alloc(dtype, s);
  }
  return kv;
}

void MiniMaxM2Model::reserve_workspace(int64_t max_tokens, int64_t max_rows) {
  max_tokens = std::max<int64_t>({max_tokens, ws_.max_tokens, 1});
  max_rows = std::max<int64_t>({max_rows, ws_.max_rows, 1});
  if (max_tokens == ws_.max_tokens && max_rows == ws_.max_rows) return;
  const int64_t T = max_tokens, H = cfg_.hidden_size, D = cfg_.head_dim, K = cfg_.num_experts_per_tok;
  const int64_t qw = int64_t(shard_.q_heads) * D, kw = int64_t(shard_.kv_heads) * D;
  const DType act = be_.activation_dtype();
  MiniMaxM2Workspace w;  // built whole, then swapped in (the old buffers are freed after)
  w.max_tokens = T;
  w.max_rows = max_rows;
  w.residual = be_.alloc(act, {T, H});
  w.x = be_.alloc(act, {T, H});
  w.o = be_.alloc(act, {T, H});
  w.moe_out = be_.alloc(act, {T, H});
  w.q = be_.alloc(act, {T, qw});
  w.attn = be_.alloc(act, {T, qw});
  w.k = be_.alloc(act, {T, kw});
  w.v = be_.alloc(act, {T, kw});
  w.expert_ids = be_.alloc(DType::I32, {T, K});
  w.expert_w = be_.alloc(DType::F32, {T, K});
  if (par_.world > 1) {
    w.qk_ss = be_.alloc(DType::F32, {2 * T});
  }
  w.sel = be_.alloc(act, {max_rows, H});
  w.logits = be_.alloc(act, {max_rows, cfg_.vocab_size});
  ws_ = std::move(w);
  ++ws_epoch_;
  spdlog::debug("minimax_m2: step workspace for {} tokens / {} logits rows ({:.1f} MiB)", T, max_rows,
                workspace_bytes() / 1048576.0);
}

int64_t MiniMaxM2Model::workspace_bytes() const {
  int64_t n = 0;
  for (const Tensor* t : {&ws_.residual, &ws_.x, &ws_.o, &ws_.moe_out, &ws_.q, &ws_.attn, &ws_.k, &ws_.v,
                          &ws_.expert_ids, &ws_.expert_w, &ws_.qk_ss, &ws_.sel, &ws_.logits})
    n += int64_t(t->nbytes());
  return n;
}

Tensor MiniMaxM2Model::forward(const Tensor& ids, const AttentionMeta& meta, std::vector<KVCacheLayer>& kv,
                               const Tensor& rows) {
  MS_CHECK(!w_.layers.empty(), "MiniMaxM2Model::forward before load");
  MS_CHECK(int(kv.size()) == cfg_.num_hidden_layers, "KV cache has {} layers, model {}", kv.size(),
           cfg_.num_hidden_layers);
  const int64_t T = meta.num_tokens, D = cfg_.head_dim;
  const float eps = float(cfg_.rms_norm_eps);
  const int64_t R = rows.defined() ? rows.numel() : 0;
  if (T > ws_.max_tokens || R > ws_.max_rows)
    reserve_workspace(std::max(T, ws_.max_tokens), std::max(R, ws_.max_rows));
  auto first = [T](const Tensor& t) { return t.slice_rows(0, T); };
  Tensor residual = first(ws_.residual), x = first(ws_.x), q = first(ws_.q), k = first(ws_.k), v = first(ws_.v);
  Tensor attn = first(ws_.attn), o = first(ws_.o), moe_out = first(ws_.moe_out);
  MoeRouting routing{first(ws_.expert_ids), first(ws_.expert_w)};
  // QK-norm statistics of q and k in one contiguous [2T] buffer: one all-reduce per layer, not
  // two (decode all-reduces are latency-bound). q's sums are [0, T), k's [T, 2T).
  Tensor qk_ss, q_ss, k_ss;
  if (par_.world > 1) {
    qk_ss = ws_.qk_ss.slice_rows(0, 2 * T);
    q_ss = qk_ss.slice_rows(0, T);
    k_ss = qk_ss.slice_rows(T, 2 * T);
  }

  be_.embedding(w_.embed, ids, residual);
  mark("embedding");
  be_.rms_norm(residual, w_.layers[0].input_norm, eps, x);
  mark("norm");
  static const int rep_qkv = op_repeat("qkv"), rep_qknorm = op_repeat("qknorm"), rep_attn = op_repeat("attn"),
                   rep_oproj = op_repeat("oproj"), rep_route = op_repeat("route"), rep_experts = op_repeat("experts");
  // Single-rank steps run each layer as Backend::decode_layer; the op-repeat diagnostics, the
  // per-op profile (op hook) and tensor parallelism (all-reduces between the ops) keep the
  // separate ops.
  static const bool any_repeat = std::getenv("MOESERVE_OP_REPEAT") != nullptr;
  const bool single_layer_op = par_.world == 1 && !any_repeat && !op_hook_;
  std::vector<DecodeLayerArgs> layer_ops;  // all layers, handed over at once (one kernel on CUDA at batch 1)
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    MiniMaxM2Layer& L = w_.layers[l];
    QkNormRopeArgs qa;
    qa.q = &q;
    qa.k = &k;
    qa.q_norm_weight = &L.q_norm;
    qa.k_norm_weight = &L.k_norm;
    qa.positions = &meta.positions;
    qa.rope = RopeParams{cfg_.head_dim, cfg_.rotary_dim, float(cfg_.rope_theta)};
    qa.eps = eps;
    AttentionArgs aa;
    aa.q = &q;
    aa.kv = &kv[l];
    aa.meta = &meta;
    aa.num_q_heads = shard_.q_heads;
    aa.num_kv_heads = shard_.kv_heads;
    aa.head_dim = cfg_.head_dim;
    aa.scale = float(1.0 / std::sqrt(double(cfg_.head_dim)));
    aa.out = &attn;
    aa.prefetch[0] = &L.o.weight;  // read next (o_proj), by the router, and first in the next layer
    aa.prefetch[1] = &L.moe.gate;
    if (l + 1 < w_.layers.size()) {
      aa.prefetch[2] = &w_.layers[l + 1].q.weight;
      aa.prefetch[3] = &w_.layers[l + 1].k.weight;
      aa.prefetch[4] = &w_.layers[l + 1].v.weight;
    }
    if (single_layer_op) {
      // The whole layer as one backend op (decode_layers after the loop).
      DecodeLayerArgs da;
      da.first = l == 0;
      da.residual = &residual, da.moe_out = &moe_out;
      da.x = &x, da.q = &q, da.k = &k, da.v = &v, da.attn = &attn, da.o = &o;
      da.input_norm = &L.input_norm, da.post_attention_norm = &L.post_attention_norm, da.eps = eps;
      da.wq = &L.q, da.wk = &L.k, da.wv = &L.v, da.wo = &L.o;
      da.moe = &L.moe, da.routing = &routing;
      da.qk = qa, da.attn_args = aa, da.kv = &kv[l], da.meta = &meta;
      layer_ops.push_back(da);
      continue;
    }
    // Attention block.
    const LinearWeight* qkv_w[3] = {&L.q, &L.k, &L.v};  // -> q [T, Hq_local*D], k/v [T, Hkv_local*D]
    Tensor* qkv_out[3] = {&q, &k, &v};
    for (int r = 0; r < rep_qkv; ++r) {
      if (l == 0)
        be_.linear_multi(x, qkv_w, qkv_out, 3);
      else  // the previous layer's residual add + this layer's input norm, fused into q/k/v
        be_.add_rms_norm_linear_multi(residual, moe_out, L.input_norm, eps, x, qkv_w, qkv_out, 3);
    }
    mark(l == 0 ? "qkv_proj" : "norm_qkv_proj");
    if (par_.world > 1) {
      // Full-width QK-norm: the mean of squares covers every rank's heads. A KV head held
      // by `kv_replicate` ranks is counted that many times, so the width is scaled to match.
      be_.row_sum_squares(q, q_ss);
      be_.row_sum_squares(k, k_ss);
      all_reduce(qk_ss);
      qa.q_sum_squares = &q_ss;
      qa.k_sum_squares = &k_ss;
      qa.q_full_width = int64_t(cfg_.num_attention_heads) * D;
      qa.k_full_width = int64_t(cfg_.num_key_value_heads) * D * shard_.kv_replicate;
    }
    if (rep_qknorm == 1) {
      // QK-norm + RoPE, the KV write and attention (one kernel on CUDA at decode).
      for (int r = 0; r < rep_attn; ++r) be_.qk_norm_rope_attention(qa, v, kv[l], meta, aa);
    } else {
      for (int r = 0; r < rep_qknorm; ++r) be_.qk_norm_rope_write_kv(qa, v, kv[l], meta);
      for (int r = 0; r < rep_attn; ++r) be_.attention(aa);
    }
    mark("qk_norm_rope_attention");
    for (int r = 0; r < rep_oproj; ++r) be_.linear(attn, L.o, o);  // row-parallel: partial sums per rank
    mark("o_proj");
    all_reduce(o);
    // MoE block (the post-attention norm and the router: one kernel on CUDA at decode).
    for (int r = 0; r < rep_route; ++r) be_.add_rms_norm_route(residual, o, L.post_attention_norm, eps, x, L.moe, routing);
    mark("norm_route");
    for (int r = 0; r < rep_experts; ++r) be_.moe_experts(x, L.moe, routing, moe_out);  // this rank's experts
    mark("moe_experts");
    all_reduce(moe_out);
  }
  if (!layer_ops.empty()) be_.decode_layers(layer_ops.data(), int(layer_ops.size()));
  be_.add_rms_norm(residual, moe_out, w_.final_norm, eps, x);
  mark("norm");
  if (R == 0) return {};
  Tensor sel = ws_.sel.slice_rows(0, R);
  be_.embedding(x, rows, sel);  // gather the rows that need logits
  Tensor logits = ws_.logits.slice_rows(0, R);
  be_.linear(sel, w_.lm_head, logits);
  mark("lm_head");
  return logits;
}

}  // namespace moeserve
