#include "model/layers/decoder.h"

#include "model/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "model/int4.h"

namespace moeserve {
namespace {

const std::vector<DType> kDense{DType::BF16, DType::F16, DType::F32};
const std::vector<DType> kLinear{DType::BF16, DType::F16, DType::F32, DType::F8_E4M3};

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

}  // namespace

DecoderShard plan_decoder_shard(const ModelDesc& d, const ParallelConfig& par) {
  MS_CHECK(par.world >= 1 && par.rank >= 0 && par.rank < par.world, "invalid parallel rank {} of {}", par.rank,
           par.world);
  DecoderShard s;
  const int W = par.world;
  MS_CHECK(d.num_attention_heads % W == 0, "num_attention_heads {} does not split over {} tensor-parallel ranks",
           d.num_attention_heads, W);
  s.q_heads = d.num_attention_heads / W;
  if (d.num_key_value_heads >= W) {
    MS_CHECK(d.num_key_value_heads % W == 0, "num_key_value_heads {} does not split over {} ranks",
             d.num_key_value_heads, W);
    s.kv_heads = d.num_key_value_heads / W;
  } else {
    // More ranks than KV heads: each KV head is replicated on W / Hkv ranks.
    MS_CHECK(W % d.num_key_value_heads == 0, "{} ranks is not a multiple of num_key_value_heads {}", W,
             d.num_key_value_heads);
    s.kv_heads = 1;
    s.kv_replicate = W / d.num_key_value_heads;
  }
  if (d.num_experts > 0) {
    if (par.expert_parallel) {
      MS_CHECK(d.num_experts % W == 0, "num_local_experts {} does not split over {} expert-parallel ranks",
               d.num_experts, W);
      s.num_experts = d.num_experts / W;
      s.first_expert = par.rank * s.num_experts;
      s.expert_inter = d.expert_intermediate_size;
    } else {
      MS_CHECK(d.expert_intermediate_size % W == 0,
               "intermediate_size {} does not split over {} tensor-parallel ranks", d.expert_intermediate_size, W);
      s.num_experts = d.num_experts;
      s.expert_inter = d.expert_intermediate_size / W;
    }
  }
  if (d.num_dense_layers > 0) {
    MS_CHECK(d.dense_intermediate_size % W == 0,
             "dense intermediate_size {} does not split over {} tensor-parallel ranks", d.dense_intermediate_size, W);
    s.dense_inter = d.dense_intermediate_size / W;
  }
  if (d.num_shared_experts > 0) {
    MS_CHECK(d.shared_expert_intermediate_size % W == 0,
             "shared-expert intermediate size {} does not split over {} tensor-parallel ranks",
             d.shared_expert_intermediate_size, W);
    s.shared_inter = d.shared_expert_intermediate_size / W;
  }
  return s;
}

std::string decoder_shard_problem(const ModelDesc& d, const ParallelConfig& par) {
  try {
    plan_decoder_shard(d, par);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

std::string decoder_fp8_split_problem(const ModelDesc& d, const ParallelConfig& par, const DecoderSpec* spec) {
  if (!d.quantization.fp8() || par.world == 1) return "";
  const DecoderShard s = plan_decoder_shard(d, par);
  const int bo = d.quantization.block_out, bi = d.quantization.block_in;
  const int64_t D = d.head_dim;
  auto bad = [&](const char* what, int64_t full, int64_t local, int block, const char* hint) {
    return fmt::format(
        "{} ({} split over {} ranks = {} per rank) is not a multiple of the FP8 weight block {}: {}", what, full,
        par.world, local, block, hint);
  };
  const char* tp_hint = "choose a tensor-parallel size that keeps whole blocks";
  if (spec && spec->mla.enabled) {
    // MLA: q (q_b_proj / q_proj) and kv_b_proj rows and o_proj columns follow the heads.
    const MlaSpec& m = spec->mla;
    const int64_t Hg = d.num_attention_heads, Hl = s.q_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
    const int64_t kvw = m.qk_nope_head_dim + m.v_head_dim;
    if ((Hl * qk) % bo) return bad(m.q_lora_rank ? "q_b_proj rows" : "q_proj rows", Hg * qk, Hl * qk, bo, tp_hint);
    if ((Hl * kvw) % bo) return bad("kv_b_proj rows", Hg * kvw, Hl * kvw, bo, tp_hint);
    if ((Hl * m.v_head_dim) % bi)
      return bad("o_proj columns", Hg * m.v_head_dim, Hl * m.v_head_dim, bi, tp_hint);
  } else {
    if ((int64_t(s.q_heads) * D) % bo) return bad("q_proj rows", d.num_attention_heads * D, s.q_heads * D, bo, tp_hint);
    if ((int64_t(s.q_heads) * D) % bi)
      return bad("o_proj columns", d.num_attention_heads * D, s.q_heads * D, bi, tp_hint);
    if ((int64_t(s.kv_heads) * D) % bo)
      return bad("k_proj/v_proj rows", d.num_key_value_heads * D, s.kv_heads * D, bo, tp_hint);
  }
  if (s.shared_inter > 0 && (s.shared_inter % bo || s.shared_inter % bi))
    return bad("shared-expert intermediate size", d.shared_expert_intermediate_size, s.shared_inter,
               s.shared_inter % bo ? bo : bi, tp_hint);
  if (d.num_experts > 0 && !par.expert_parallel) {
    const char* ep_hint = "use --enable-expert-parallel (whole experts per rank) or a smaller tensor-parallel size";
    if (s.expert_inter % bo)
      return bad("expert intermediate_size (w1/w3 rows)", d.expert_intermediate_size, s.expert_inter, bo, ep_hint);
    if (s.expert_inter % bi)
      return bad("expert intermediate_size (w2 columns)", d.expert_intermediate_size, s.expert_inter, bi, ep_hint);
  }
  if (d.num_dense_layers > 0 && (s.dense_inter % bo || s.dense_inter % bi))
    return bad("dense MLP intermediate_size", d.dense_intermediate_size, s.dense_inter, s.dense_inter % bo ? bo : bi,
               tp_hint);
  return "";
}

void declare_decoder_weights(const ModelDesc& d, const DecoderSpec& spec, const DecoderNames& n,
                             const ParallelConfig& par, std::vector<WeightDecl>& out) {
  const DecoderShard s = plan_decoder_shard(d, par);
  const int64_t H = d.hidden_size, D = d.head_dim, I = d.expert_intermediate_size, E = d.num_experts;
  const int64_t Hq = int64_t(d.num_attention_heads) * D, Hkv = int64_t(d.num_key_value_heads) * D;
  const ShardSpec rep{};
  const ShardSpec col{ShardKind::ColumnParallel, par.rank, par.world};
  const ShardSpec row{ShardKind::RowParallel, par.rank, par.world};
  const ShardSpec kv_col{ShardKind::ColumnParallel, par.rank, par.world, s.kv_replicate};
  out.push_back({n.root + "model.embed_tokens.weight", {d.vocab_size, H}, kDense, rep});
  for (int l = 0; l < d.num_layers; ++l) {
    const std::string p = n.layer_prefix(l);
    const bool dense = !spec.dense_layer.empty() && spec.dense_layer[size_t(l)];
    out.push_back({p + n.input_norm, {H}, kDense, rep});
    out.push_back({p + n.post_norm, {H}, kDense, rep});
    if (spec.mla.enabled) {
      declare_mla_weights(d, spec.mla, n, par, p, out);
    } else {
      out.push_back({p + n.q, {Hq, H}, kLinear, col});
      out.push_back({p + n.k, {Hkv, H}, kLinear, kv_col});
      out.push_back({p + n.v, {Hkv, H}, kLinear, kv_col});
      out.push_back({p + n.o, {H, Hq}, kLinear, row});
    }
    if (spec.mla.enabled) {
      // MLA has no QK-norm (its latent norm is declared with the MLA tensors).
    } else if (spec.qk_norm == QkNormMode::FullWidth) {
      out.push_back({p + n.q_norm, {Hq}, kDense, col});
      out.push_back({p + n.k_norm, {Hkv}, kDense, kv_col});
    } else if (spec.qk_norm == QkNormMode::PerHead) {
      out.push_back({p + n.q_norm, {D}, kDense, rep});
      out.push_back({p + n.k_norm, {D}, kDense, rep});
    }
    if (dense) {
      const int64_t ID = d.dense_intermediate_size;
      out.push_back({p + n.dense + n.w1, {ID, H}, kLinear, col});
      out.push_back({p + n.dense + n.w3, {ID, H}, kLinear, col});
      out.push_back({p + n.dense + n.w2, {H, ID}, kLinear, row});
      continue;
    }
    out.push_back({p + n.router, {E, H}, kDense, rep});
    if (spec.routing_bias) out.push_back({p + n.router_bias, {E}, kDense, rep});
    if (spec.shared_experts) {
      // Sliced along its intermediate size on every rank, EP or not: the all-reduce of the
      // MoE output then sums its slices once.
      const int64_t IS = d.shared_expert_intermediate_size;
      out.push_back({p + n.shared + n.w1, {IS, H}, kLinear, col});
      out.push_back({p + n.shared + n.w3, {IS, H}, kLinear, col});
      out.push_back({p + n.shared + n.w2, {H, IS}, kLinear, row});
    }
    for (int e = 0; e < E; ++e) {
      const std::string q = p + n.experts + std::to_string(e) + ".";
      if (par.expert_parallel) {
        ShardSpec own{ShardKind::ExpertOwned, par.rank, par.world};
        own.owned = e >= s.first_expert && e < s.first_expert + s.num_experts;
        out.push_back({q + n.w1, {I, H}, kLinear, own, e});
        out.push_back({q + n.w3, {I, H}, kLinear, own, e});
        out.push_back({q + n.w2, {H, I}, kLinear, own, e});
      } else {
        out.push_back({q + n.w1, {I, H}, kLinear, col, e});
        out.push_back({q + n.w3, {I, H}, kLinear, col, e});
        out.push_back({q + n.w2, {H, I}, kLinear, row, e});
      }
    }
  }
  out.push_back({n.root + "model.norm.weight", {H}, kDense, rep});
  // Tied embeddings (HF semantics): the output projection is embed_tokens; a stored
  // lm_head.weight is not used.
  if (!d.tie_word_embeddings) out.push_back({n.root + "lm_head.weight", {d.vocab_size, H}, kDense, rep});
}

DecoderModel::DecoderModel(const ModelDesc& desc, DecoderSpec spec, DecoderNames names, Backend& backend,
                           ParallelConfig par, AllReduceFn all_reduce)
    : desc_(desc), spec_(std::move(spec)), names_(std::move(names)), be_(backend), par_(par),
      all_reduce_(std::move(all_reduce)) {
  MS_CHECK(par_.world == 1 || all_reduce_, "{} ranks need an all-reduce", par_.world);
  MS_CHECK(spec_.dense_layer.empty() || int(spec_.dense_layer.size()) == desc_.num_layers,
           "dense-layer list has {} entries for {} layers", spec_.dense_layer.size(), desc_.num_layers);
  shard_ = plan_decoder_shard(desc_, par_);
}

void DecoderModel::all_reduce(Tensor& t) {
  if (par_.world > 1) all_reduce_(t);
}

void DecoderModel::load_decoder(const Checkpoint& ckpt, const std::vector<WeightDecl>& decls,
                                const std::function<bool(const std::string&)>& skipped) {
  // INT4 weights on a backend without W4A16 kernels: refused before anything is read.
  if (const std::string t = first_int4_tensor(decls, desc_.quantization, be_.int4_experts_packed()); !t.empty()) {
    const std::string why = be_.int4_weights_problem(t);
    MS_CHECK(why.empty(), "checkpoint {}: {}", ckpt.dir(), why);
  }
  std::map<std::string, LoadedTensor> got;
  for (const auto& d : decls) got[d.name] = load_weight(ckpt, d, desc_.quantization, be_.int4_experts_packed());

  // Tensors that are neither declared, nor scales of declared FP8 weights, nor the parts of
  // declared INT4 weights, nor skipped.
  int skip = 0, unexpected = 0;
  for (const auto& n : ckpt.names()) {
    if (got.count(n)) continue;
    if (n.size() > 10 && n.compare(n.size() - 10, 10, "_scale_inv") == 0 && got.count(n.substr(0, n.size() - 10)))
      continue;
    if (desc_.quantization.int4() && is_int4_part(n, [&](const std::string& w) { return got.count(w) != 0; }))
      continue;
    if (is_kv_scale_tensor(n)) continue;  // FP8 KV scales: read by the executor (model/kv_scales.h)
    if (skipped && skipped(n)) {
      ++skip;
      continue;
    }
    if (unexpected++ < 8) spdlog::warn("checkpoint {}: unexpected tensor '{}' ignored", ckpt.dir(), n);
  }
  if (skip) spdlog::info("checkpoint {}: skipped {} tensors the model does not use (MTP modules{})", ckpt.dir(), skip,
                         spec_.mla.enabled ? ", vision tower" : "");
  if (unexpected > 8) spdlog::warn("checkpoint {}: {} unexpected tensors ignored in all", ckpt.dir(), unexpected);
  upload_decoder(got);
}

void DecoderModel::load_from(const WeightSource& source) {
  auto ceil_div = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  std::map<std::string, LoadedTensor> got;
  for (const WeightDecl& d : config().weights(par_)) {
    LoadedTensor& t = got[d.name];
    if (d.shard.kind == ShardKind::ExpertOwned && !d.shard.owned) continue;  // another rank's expert
    t = source(d);
    if (!t.tensor.defined()) {
      MS_CHECK(d.name == names_.root + "lm_head.weight", "weight source: no tensor for '{}'", d.name);
      continue;
    }
    const Shape want = local_shape(d);
    if (t.tensor.dtype == DType::I32 && d.expert >= 0 && be_.int4_experts_packed()) {
      // A packed INT4 routed expert (random_weight_source's int4_packed_experts).
      MS_CHECK(t.block_out == 1 && t.block_in > 0 &&
                   want[1] % t.block_in == 0 && t.tensor.shape == Shape({want[0], want[1] / 8}) &&
                   t.scale_inv.dtype == DType::BF16 && t.scale_inv.shape == Shape({want[0], want[1] / t.block_in}),
               "weight source: packed INT4 '{}' needs I32 [{}, {}] and BF16 scales [{}, {} / group] on a backend that "
               "takes packed routed experts",
               d.name, want[0], want[1] / 8, want[0], want[1]);
      continue;
    }
    MS_CHECK(t.tensor.shape == want, "weight source: '{}' has shape {}, expected {}", d.name,
             shape_str(t.tensor.shape), shape_str(want));
    MS_CHECK(std::find(d.dtypes.begin(), d.dtypes.end(), t.tensor.dtype) != d.dtypes.end(),
             "weight source: '{}' is {}, not an accepted dtype", d.name, dtype_name(t.tensor.dtype));
    if (t.tensor.dtype == DType::F8_E4M3) {
      MS_CHECK(t.block_out > 0 && t.block_in > 0 && t.scale_inv.defined() && t.scale_inv.dtype == DType::F32 &&
                   t.scale_inv.shape == Shape({ceil_div(want[0], t.block_out), ceil_div(want[1], t.block_in)}),
               "weight source: FP8 '{}' needs F32 scales [{}, {}] for blocks [{}, {}]", d.name,
               t.block_out ? ceil_div(want[0], t.block_out) : 0, t.block_in ? ceil_div(want[1], t.block_in) : 0,
               t.block_out, t.block_in);
    }
  }
  upload_decoder(got);
}

Tensor DecoderModel::host_for_backend(const Tensor& t) const {
  // What the backend computes in: on a bf16-activation backend every F16/F32 tensor except
  // the router (gate and bias, uploaded as exact F32) becomes BF16, so matrices run on the
  // bf16/FP8 GEMMs and norm weights match the bf16 activations they scale.
  if (be_.activation_dtype() == DType::BF16 && (t.dtype == DType::F16 || t.dtype == DType::F32)) return to_bf16_host(t);
  return t;
}

DecoderLayer DecoderModel::upload_layer(int l, const std::map<std::string, LoadedTensor>& got, bool dense) {
  auto up = [&](const std::string& name) { return be_.upload(host_for_backend(got.at(name).tensor)); };
  auto up_lin = [&](const std::string& name) {
    LinearWeight w = got.at(name).linear();
    w.weight = be_.upload(host_for_backend(w.weight));
    if (w.fp8() || w.int4()) w.scale_inv = be_.upload(w.scale_inv);  // INT4: packed words + BF16 scales as loaded
    return w;
  };
  const DecoderNames& nm = names_;
  const std::string p = nm.layer_prefix(l);
  DecoderLayer L;
  L.input_norm = up(p + nm.input_norm);
  L.post_attention_norm = up(p + nm.post_norm);
  if (spec_.mla.enabled) {
    if (spec_.mla.q_lora_rank > 0) {
      L.mla.q_a = up_lin(p + nm.q_a);
      L.mla.q_a_norm = up(p + nm.q_a_norm);
      L.mla.q_b = up_lin(p + nm.q_b);
    } else {
      L.mla.q_b = up_lin(p + nm.q);
    }
    L.mla.kv_a = up_lin(p + nm.kv_a);
    L.mla.kv_a_norm = up(p + nm.kv_a_norm);
    L.mla.kv_b = up_lin(p + nm.kv_b);
    L.o = up_lin(p + nm.o);
  } else {
    L.q = up_lin(p + nm.q);
    L.k = up_lin(p + nm.k);
    L.v = up_lin(p + nm.v);
    L.o = up_lin(p + nm.o);
  }
  if (spec_.qk_norm != QkNormMode::None && !spec_.mla.enabled) {
    L.q_norm = up(p + nm.q_norm);
    L.k_norm = up(p + nm.k_norm);
  }
  L.dense = dense;
  if (L.dense) {
    L.mlp = {up_lin(p + nm.dense + nm.w1), up_lin(p + nm.dense + nm.w3), up_lin(p + nm.dense + nm.w2)};
    return L;
  }
  L.moe.gate = be_.upload(to_f32_host(got.at(p + nm.router).tensor));  // exact
  if (spec_.routing_bias) L.moe.score_bias = be_.upload(to_f32_host(got.at(p + nm.router_bias).tensor));
  if (spec_.shared_experts)
    L.shared = {up_lin(p + nm.shared + nm.w1), up_lin(p + nm.shared + nm.w3), up_lin(p + nm.shared + nm.w2)};
  L.moe.num_experts = desc_.num_experts;
  L.moe.top_k = desc_.experts_per_token;
  L.moe.first_local_expert = shard_.first_expert;
  L.moe.route = spec_.route;
  auto expert = [&](int e) { return p + nm.experts + std::to_string(e) + "."; };
  if (be_.device() == Device::CUDA) {
    // The layer's experts in one device allocation: a separate allocation per matrix is
    // rounded up to 2 MiB, which wastes a third of a 4.5 MiB M2.5 expert matrix.
    std::vector<LinearWeight> lin;
    for (int e = shard_.first_expert; e < shard_.first_expert + shard_.num_experts; ++e)
      for (const std::string* m : {&nm.w1, &nm.w3, &nm.w2}) lin.push_back(got.at(expert(e) + *m).linear());
    for (auto& w : lin)
      if (!w.fp8()) w.weight = host_for_backend(w.weight);
    auto pad = [](size_t n) { return (n + 255) / 256 * 256; };
    size_t bytes = 0;
    // FP8: + the F32 block scales; INT4 (packed): + the BF16 group scales.
    for (const auto& w : lin) bytes += pad(w.weight.nbytes()) + (w.fp8() || w.int4() ? pad(w.scale_inv.nbytes()) : 0);
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
      if (w.fp8() || w.int4()) put(w.scale_inv);
    }
    for (size_t i = 0; i + 2 < lin.size(); i += 3) L.moe.experts.push_back({lin[i], lin[i + 1], lin[i + 2]});
  } else {
    for (int e = shard_.first_expert; e < shard_.first_expert + shard_.num_experts; ++e)
      L.moe.experts.push_back({up_lin(expert(e) + nm.w1), up_lin(expert(e) + nm.w3), up_lin(expert(e) + nm.w2)});
  }
  return L;
}

void DecoderModel::upload_decoder(const std::map<std::string, LoadedTensor>& got) {
  auto up = [&](const std::string& name) { return be_.upload(host_for_backend(got.at(name).tensor)); };
  auto up_lin = [&](const std::string& name) {
    LinearWeight w = got.at(name).linear();
    w.weight = be_.upload(host_for_backend(w.weight));
    if (w.fp8()) w.scale_inv = be_.upload(w.scale_inv);
    return w;
  };
  const DecoderNames& nm = names_;
  w_ = DecoderWeights{};
  w_.embed = be_.upload(host_for_backend(got.at(nm.root + "model.embed_tokens.weight").tensor));
  for (int l = 0; l < desc_.num_layers; ++l)
    w_.layers.push_back(upload_layer(l, got, !spec_.dense_layer.empty() && spec_.dense_layer[size_t(l)]));
  w_.final_norm = up(nm.root + "model.norm.weight");
  if (desc_.tie_word_embeddings) {
    w_.lm_head = LinearWeight{w_.embed, Tensor{}, 0, 0};
  } else if (got.at(nm.root + "lm_head.weight").tensor.defined()) {
    w_.lm_head = up_lin(nm.root + "lm_head.weight");
  }  // else: a rank without logits (load_from's source made no lm_head)
}

KvLayout DecoderModel::kv_layout() const {
  // MLA: one latent "head" of kv_lora_rank + qk_rope_head_dim values per token, no V.
  if (spec_.mla.enabled)
    return KvLayout{desc_.num_layers, 1, spec_.mla.kv_lora_rank + spec_.mla.qk_rope_head_dim, 0};
  return KvLayout{desc_.num_layers, shard_.kv_heads, desc_.head_dim, desc_.v_head_dim > 0 ? desc_.v_head_dim : desc_.head_dim};
}

BackendWorkspaceDims DecoderModel::backend_workspace_dims(int max_tokens) const {
  return BackendWorkspaceDims{max_tokens,          desc_.hidden_size, shard_.expert_inter, desc_.experts_per_token,
                              shard_.num_experts,  shard_.q_heads,    desc_.head_dim,      desc_.quantization.fp8()};
}

void DecoderModel::reserve_workspace(int64_t max_tokens, int64_t max_rows) {
  max_tokens = std::max<int64_t>({max_tokens, ws_.max_tokens, 1});
  max_rows = std::max<int64_t>({max_rows, ws_.max_rows, 1});
  if (max_tokens == ws_.max_tokens && max_rows == ws_.max_rows) return;
  const int64_t T = max_tokens, H = desc_.hidden_size, D = desc_.head_dim, K = std::max(1, desc_.experts_per_token);
  const int64_t qw = int64_t(shard_.q_heads) * D, kw = int64_t(shard_.kv_heads) * D;
  const DType act = be_.activation_dtype();
  DecoderWorkspace w;  // built whole, then swapped in (the old buffers are freed after)
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
  if (par_.world > 1 && spec_.qk_norm == QkNormMode::FullWidth) w.qk_ss = be_.alloc(DType::F32, {2 * T});
  if (shard_.dense_inter > 0) {
    w.mlp_gate = be_.alloc(act, {T, shard_.dense_inter});
    w.mlp_up = be_.alloc(act, {T, shard_.dense_inter});
  }
  if (shard_.shared_inter > 0) {
    w.sh_gate = be_.alloc(act, {T, shard_.shared_inter});
    w.sh_up = be_.alloc(act, {T, shard_.shared_inter});
    w.sh_out = be_.alloc(act, {T, H});
  }
  if (spec_.mla.enabled) {
    const MlaSpec& m = spec_.mla;
    MS_CHECK(int64_t(shard_.q_heads) * m.v_head_dim <= qw, "MLA: v_head_dim {} above the q/k head dim {}", m.v_head_dim,
             D);
    if (m.q_lora_rank > 0) {
      w.q_a = be_.alloc(act, {T, m.q_lora_rank});
      w.q_an = be_.alloc(act, {T, m.q_lora_rank});
    }
    w.latent = be_.alloc(act, {T, m.kv_lora_rank + m.qk_rope_head_dim});
  }
  w.sel = be_.alloc(act, {max_rows, H});
  w.logits = be_.alloc(act, {max_rows, desc_.vocab_size});
  ws_ = std::move(w);
  ++ws_epoch_;
  spdlog::debug("{}: step workspace for {} tokens / {} logits rows ({:.1f} MiB)", desc_.model_type, T, max_rows,
                workspace_bytes() / 1048576.0);
}

int64_t DecoderModel::workspace_bytes() const {
  int64_t n = 0;
  for (const Tensor* t : {&ws_.residual, &ws_.x, &ws_.o, &ws_.moe_out, &ws_.q, &ws_.attn, &ws_.k, &ws_.v,
                          &ws_.expert_ids, &ws_.expert_w, &ws_.qk_ss, &ws_.mlp_gate, &ws_.mlp_up, &ws_.sh_gate,
                          &ws_.sh_up, &ws_.sh_out, &ws_.q_a, &ws_.q_an, &ws_.latent, &ws_.sel, &ws_.logits})
    n += int64_t(t->nbytes());
  return n;
}

StepViews DecoderModel::begin_step(int64_t T, int64_t R) {
  MS_CHECK(!w_.layers.empty(), "{}: forward before load", desc_.model_type);
  if (T > ws_.max_tokens || R > ws_.max_rows)
    reserve_workspace(std::max(T, ws_.max_tokens), std::max(R, ws_.max_rows));
  auto first = [T](const Tensor& t) { return t.slice_rows(0, T); };
  StepViews s;
  s.T = T;
  s.residual = first(ws_.residual), s.x = first(ws_.x), s.q = first(ws_.q), s.k = first(ws_.k), s.v = first(ws_.v);
  s.attn = first(ws_.attn), s.o = first(ws_.o), s.moe_out = first(ws_.moe_out);
  s.routing = MoeRouting{first(ws_.expert_ids), first(ws_.expert_w)};
  // QK-norm statistics of q and k in one contiguous [2T] buffer: one all-reduce per layer, not
  // two (decode all-reduces are latency-bound). q's sums are [0, T), k's [T, 2T).
  if (ws_.qk_ss.defined() && ws_.qk_ss.data) {
    s.qk_ss = ws_.qk_ss.slice_rows(0, 2 * T);
    s.q_ss = s.qk_ss.slice_rows(0, T);
    s.k_ss = s.qk_ss.slice_rows(T, 2 * T);
  }
  if (shard_.dense_inter > 0) s.mlp_gate = first(ws_.mlp_gate), s.mlp_up = first(ws_.mlp_up);
  if (shard_.shared_inter > 0) s.sh_gate = first(ws_.sh_gate), s.sh_up = first(ws_.sh_up), s.sh_out = first(ws_.sh_out);
  if (spec_.mla.enabled) {
    if (spec_.mla.q_lora_rank > 0) s.q_a = first(ws_.q_a), s.q_an = first(ws_.q_an);
    s.latent = first(ws_.latent);
    // [T, Hq_local * v] over the first T * Hq_local * v values of attn (v <= the q/k head dim).
    s.mla_out = Tensor::view(ws_.attn.data, ws_.attn.dtype, {T, int64_t(shard_.q_heads) * spec_.mla.v_head_dim},
                             ws_.attn.device);
    s.mla_out.owner = ws_.attn.owner;
  }
  return s;
}

void DecoderModel::embed(const Tensor& ids, StepViews& s) {
  be_.embedding(w_.embed, ids, s.residual);
  mark("embedding");
  be_.rms_norm(s.residual, w_.layers[0].input_norm, spec_.rms_norm_eps, s.x);
  mark("norm");
}

QkNormRopeArgs DecoderModel::qk_args(int l, StepViews& s, const AttentionMeta& meta) {
  DecoderLayer& L = w_.layers[size_t(l)];
  QkNormRopeArgs qa;
  qa.q = &s.q;
  qa.k = &s.k;
  qa.q_norm_weight = &L.q_norm;
  qa.k_norm_weight = &L.k_norm;
  qa.positions = &meta.positions;
  qa.rope = spec_.rope;
  qa.eps = spec_.rms_norm_eps;
  qa.norm = spec_.qk_norm;
  return qa;
}

AttentionArgs DecoderModel::attention_args(int l, StepViews& s, std::vector<KVCacheLayer>& kv,
                                           const AttentionMeta& meta) {
  DecoderLayer& L = w_.layers[size_t(l)];
  AttentionArgs aa;
  aa.q = &s.q;
  aa.kv = &kv[size_t(l)];
  aa.meta = &meta;
  aa.num_q_heads = shard_.q_heads;
  aa.num_kv_heads = shard_.kv_heads;
  aa.head_dim = desc_.head_dim;
  aa.scale = float(1.0 / std::sqrt(double(desc_.head_dim)));
  aa.out = &s.attn;
  aa.prefetch[0] = &L.o.weight;  // read next (o_proj), by the router, and first in the next layer
  aa.prefetch[1] = L.dense ? &L.mlp.w1.weight : &L.moe.gate;
  if (size_t(l) + 1 < w_.layers.size()) {
    aa.prefetch[2] = &w_.layers[size_t(l) + 1].q.weight;
    aa.prefetch[3] = &w_.layers[size_t(l) + 1].k.weight;
    aa.prefetch[4] = &w_.layers[size_t(l) + 1].v.weight;
  }
  return aa;
}

void DecoderModel::attention_block(int l, StepViews& s, std::vector<KVCacheLayer>& kv, const AttentionMeta& meta,
                                   const Repeat& rep) {
  DecoderLayer& L = w_.layers[size_t(l)];
  const float eps = spec_.rms_norm_eps;
  const int64_t D = desc_.head_dim;
  QkNormRopeArgs qa = qk_args(l, s, meta);
  const AttentionArgs aa = attention_args(l, s, kv, meta);
  const LinearWeight* qkv_w[3] = {&L.q, &L.k, &L.v};  // -> q [T, Hq_local*D], k/v [T, Hkv_local*D]
  Tensor* qkv_out[3] = {&s.q, &s.k, &s.v};
  for (int r = 0; r < rep.qkv; ++r) {
    if (l == 0)
      be_.linear_multi(s.x, qkv_w, qkv_out, 3);
    else  // the previous layer's residual add + this layer's input norm, fused into q/k/v
      be_.add_rms_norm_linear_multi(s.residual, s.moe_out, L.input_norm, eps, s.x, qkv_w, qkv_out, 3);
  }
  mark(l == 0 ? "qkv_proj" : "norm_qkv_proj");
  if (par_.world > 1 && spec_.qk_norm == QkNormMode::FullWidth) {
    // Full-width QK-norm: the mean of squares covers every rank's heads. A KV head held
    // by `kv_replicate` ranks is counted that many times, so the width is scaled to match.
    be_.row_sum_squares(s.q, s.q_ss);
    be_.row_sum_squares(s.k, s.k_ss);
    all_reduce(s.qk_ss);
    qa.q_sum_squares = &s.q_ss;
    qa.k_sum_squares = &s.k_ss;
    qa.q_full_width = int64_t(desc_.num_attention_heads) * D;
    qa.k_full_width = int64_t(desc_.num_key_value_heads) * D * shard_.kv_replicate;
  }
  if (rep.qknorm == 1) {
    // QK-norm + RoPE, the KV write and attention (one kernel on CUDA at decode).
    for (int r = 0; r < rep.attn; ++r) be_.qk_norm_rope_attention(qa, s.v, kv[size_t(l)], meta, aa);
  } else {
    for (int r = 0; r < rep.qknorm; ++r) be_.qk_norm_rope_write_kv(qa, s.v, kv[size_t(l)], meta);
    for (int r = 0; r < rep.attn; ++r) be_.attention(aa);
  }
  mark("qk_norm_rope_attention");
  for (int r = 0; r < rep.oproj; ++r) be_.linear(s.attn, L.o, s.o);  // row-parallel: partial sums per rank
  mark("o_proj");
  all_reduce(s.o);
}

void DecoderModel::moe_block(int l, StepViews& s, const Repeat& rep) {
  DecoderLayer& L = w_.layers[size_t(l)];
  // The post-attention norm and the router: one kernel on CUDA at decode.
  for (int r = 0; r < rep.route; ++r)
    be_.add_rms_norm_route(s.residual, s.o, L.post_attention_norm, spec_.rms_norm_eps, s.x, L.moe, s.routing);
  mark("norm_route");
  MoeRouting routing = s.routing;
  if (size_t(l) < routing_override_.size()) routing.expert_ids = routing_override_[size_t(l)].slice_rows(0, s.T);
  for (int r = 0; r < rep.experts; ++r) be_.moe_experts(s.x, L.moe, routing, s.moe_out);  // this rank's experts
  mark("moe_experts");
  if (spec_.shared_experts) {
    be_.dense_mlp(s.x, L.shared, s.sh_gate, s.sh_up, s.sh_out);  // this rank's slice of the shared expert
    be_.add(s.moe_out, s.sh_out, s.moe_out);                     // routed + shared, as HF
    mark("shared_expert");
  }
  all_reduce(s.moe_out);
}

void DecoderModel::dense_block(int l, StepViews& s) {
  DecoderLayer& L = w_.layers[size_t(l)];
  be_.add_rms_norm(s.residual, s.o, L.post_attention_norm, spec_.rms_norm_eps, s.x);
  mark("norm");
  be_.dense_mlp(s.x, L.mlp, s.mlp_gate, s.mlp_up, s.moe_out);  // column/row-parallel slices
  mark("dense_mlp");
  all_reduce(s.moe_out);
}

Tensor DecoderModel::final_logits(StepViews& s, const Tensor& rows) {
  be_.add_rms_norm(s.residual, s.moe_out, w_.final_norm, spec_.rms_norm_eps, s.x);
  mark("norm");
  const int64_t R = rows.defined() ? rows.numel() : 0;
  if (R == 0) return {};
  Tensor sel = ws_.sel.slice_rows(0, R);
  be_.embedding(s.x, rows, sel);  // gather the rows that need logits
  Tensor logits = ws_.logits.slice_rows(0, R);
  be_.linear(sel, w_.lm_head, logits);
  mark("lm_head");
  return logits;
}

std::vector<KVCacheLayer> allocate_kv_cache(Backend& be, const KvLayout& layout, int num_blocks, int block_size,
                                            DType dtype) {
  std::vector<KVCacheLayer> kv(size_t(layout.num_layers));
  for (auto& layer : kv) {
    layer.k = be.alloc(dtype, {num_blocks, block_size, layout.kv_heads, layout.k_head_dim});
    layer.v = be.alloc(dtype, {num_blocks, block_size, layout.kv_heads, layout.v_head_dim});
  }
  return kv;
}

}  // namespace moeserve
