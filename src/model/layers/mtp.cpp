// DecoderModel's speculative-decoding parts: hidden-state capture for draft heads and the
// DeepSeek-V3 / GLM-style MTP modules (model.h: HiddenCapture, MtpStepArgs).
//
// MTP module k (0-based) of a model with L layers lives at model.layers.{L + k}.:
//   enorm.weight [H], hnorm.weight [H], eh_proj.weight [H, 2H] (embedding half first),
//   one decoder layer of the architecture (same tensor names as a main layer),
//   shared_head.norm.weight [H]; the embedding and lm_head are the target's (a stored
//   shared_head.head / embed_tokens copy is not read).
// Its decoder layer is appended to w_.layers (index L + k) so the shared blocks run it; the
// main forward loops over desc_.num_layers only.
#include <algorithm>

#include "model/int4.h"
#include "core/error.h"
#include "core/log.h"
#include "model/layers/decoder.h"

namespace moeserve {
namespace {

const std::vector<DType> kDenseTypes{DType::BF16, DType::F16, DType::F32};

// Columns [c0, c0 + n) of a host matrix [rows, cols] as a host F32 matrix [rows, n].
Tensor host_columns(const Tensor& t, int64_t c0, int64_t n) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  std::vector<float> all(size_t(rows * cols));
  convert_to_f32(t.dtype, t.data, all.data(), all.size());
  Tensor out = Tensor::host(DType::F32, {rows, n});
  float* o = out.ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    std::copy(all.begin() + r * cols + c0, all.begin() + r * cols + c0 + n, o + r * n);
  return out;
}

}  // namespace

void DecoderModel::set_capture(const HiddenCapture& c) {
  for (int b : c.residual_taps)
    MS_CHECK(b >= 0 && b <= desc_.num_layers, "{}: hidden-state tap at layer boundary {} outside [0, {}]",
             desc_.model_type, b, desc_.num_layers);
  MS_CHECK(par_.world == 1, "{}: hidden-state capture for draft heads runs on one rank only (tensor parallel {})",
           desc_.model_type, par_.world);
  cap_ = c;
  cap_bufs_.assign(c.residual_taps.size() + (c.final_hidden ? 1 : 0), Tensor{});
  cap_views_.assign(cap_bufs_.size(), Tensor{});
}

// Grow-only [T, H] buffers and the identity row ids (device).
static Tensor& grown(Backend& be, Tensor& buf, int64_t T, int64_t H) {
  if (!buf.data || buf.dim(0) < T) buf = be.alloc(be.activation_dtype(), {std::max<int64_t>(T, 64), H});
  return buf;
}

void DecoderModel::capture_boundary(int b, StepViews& s, const Tensor& ids) {
  if (!capturing()) return;
  const int64_t T = s.T, H = desc_.hidden_size;
  for (size_t i = 0; i < cap_.residual_taps.size(); ++i) {
    if (cap_.residual_taps[i] != b) continue;
    Tensor v = grown(be_, cap_bufs_[i], T, H).slice_rows(0, T);
    if (b == 0) be_.embedding(w_.embed, ids, v);  // the residual stream entering layer 0
    else be_.add(s.residual, s.moe_out, v);     // layer b-1's output: residual + its MLP output
    cap_views_[i] = v;
  }
}

void DecoderModel::capture_final(StepViews& s) {
  if (!cap_.final_hidden) return;
  const int64_t T = s.T, H = desc_.hidden_size;
  if (!iota_.data || iota_.numel() < T) {
    Tensor h = Tensor::host(DType::I32, {std::max<int64_t>(T, 1024)});
    for (int64_t i = 0; i < h.numel(); ++i) h.ptr<int32_t>()[i] = int32_t(i);
    iota_ = be_.upload(h);
  }
  const size_t i = cap_.residual_taps.size();
  Tensor v = grown(be_, cap_bufs_[i], T, H).slice_rows(0, T);
  be_.embedding(s.x, iota_.slice_rows(0, T), v);  // s.x: the final norm's output for every row
  cap_views_[i] = v;
}

void DecoderModel::load_mtp(const Checkpoint& ckpt, int M) {
  const int L = desc_.num_layers;
  MS_CHECK(M >= 1, "MTP: {} modules", M);
  MS_CHECK(mtp_.empty() && int(w_.layers.size()) == L, "MTP modules loaded twice or before the model");
  // The module layers' declarations: the architecture's own layer tensors at L..L+M-1.
  ModelDesc d2 = desc_;
  d2.num_layers = L + M;
  DecoderSpec sp2 = spec_;
  if (!sp2.dense_layer.empty()) sp2.dense_layer.resize(size_t(L + M), 0);  // MTP layers are MoE (DeepSeek-V3)
  std::vector<WeightDecl> all, decls;
  declare_decoder_weights(d2, sp2, names_, par_, all);
  for (auto& d : all)
    if (d.name.size() > names_.root.size() && is_mtp_tensor(L, M, d.name.substr(names_.root.size())))
      decls.push_back(d);
  const int64_t H = desc_.hidden_size;
  for (int k = 0; k < M; ++k) {
    const std::string p = names_.layer_prefix(L + k);
    decls.push_back({p + "enorm.weight", {H}, kDenseTypes, {}});
    decls.push_back({p + "hnorm.weight", {H}, kDenseTypes, {}});
    decls.push_back({p + "eh_proj.weight", {H, 2 * H}, kDenseTypes, {}});
    decls.push_back({p + "shared_head.norm.weight", {H}, kDenseTypes, {}});
  }
  std::vector<std::string> missing;
  for (const auto& d : decls)
    if (!ckpt.contains(d.name) && !(d.shard.kind == ShardKind::ExpertOwned && !d.shard.owned)) missing.push_back(d.name);
  if (!missing.empty())
    fail("--speculative-config method \"mtp\": {} declares {} MTP module(s) (model.layers.{}..{}) but its checkpoint "
         "{} lacks {} of their {} tensors (first: '{}'{}). Use an EAGLE-3 draft ({{\"method\": \"eagle3\", \"model\": "
         "DIR, ...}}) or n-gram prompt lookup ({{\"method\": \"ngram\", ...}}) instead",
         desc_.architecture, M, L, L + M - 1, ckpt.dir(), missing.size(), decls.size(), missing[0],
         missing.size() > 1 ? fmt::format(", '{}'", missing[1]) : std::string());
  if (const std::string t = first_int4_tensor(decls, desc_.quantization, be_.int4_experts_packed()); !t.empty()) {
    const std::string why = be_.int4_weights_problem(t);
    MS_CHECK(why.empty(), "checkpoint {}: {}", ckpt.dir(), why);
  }
  std::map<std::string, LoadedTensor> got;
  for (const auto& d : decls) {
    if (d.shard.kind == ShardKind::ExpertOwned && !d.shard.owned) continue;
    got[d.name] = load_weight(ckpt, d, desc_.quantization, be_.int4_experts_packed());  // throws naming shape / dtype problems
  }
  auto up = [&](const std::string& n) { return be_.upload(host_for_backend(got.at(n).tensor)); };
  for (int k = 0; k < M; ++k) {
    const std::string p = names_.layer_prefix(L + k);
    w_.layers.push_back(upload_layer(L + k, got, false));
    MtpModule m;
    m.enorm = up(p + "enorm.weight");
    m.hnorm = up(p + "hnorm.weight");
    m.shared_norm = up(p + "shared_head.norm.weight");
    const Tensor& eh = got.at(p + "eh_proj.weight").tensor;
    m.eh_e = LinearWeight{be_.upload(host_for_backend(host_columns(eh, 0, H))), {}, 0, 0};
    m.eh_h = LinearWeight{be_.upload(host_for_backend(host_columns(eh, H, H))), {}, 0, 0};
    mtp_.push_back(std::move(m));
  }
  spdlog::info("{}: loaded {} MTP module(s) (model.layers.{}..{})", desc_.model_type, M, L, L + M - 1);
}

KvLayout DecoderModel::mtp_kv_layout() const {
  KvLayout k = kv_layout();
  k.num_layers = int(mtp_.size());
  return k;
}

Tensor DecoderModel::mtp_forward(const MtpStepArgs& a) {
  MS_CHECK(a.module >= 0 && a.module < int(mtp_.size()), "MTP module {} of {}", a.module, mtp_.size());
  MS_CHECK(a.ids && a.h_prev && a.meta && a.kv && a.h_out && int(a.kv->size()) == int(mtp_.size()),
           "mtp_forward: incomplete arguments");
  const int L = desc_.num_layers, l = L + a.module;
  const int64_t T = a.meta->num_tokens, R = a.rows && a.rows->defined() ? a.rows->numel() : 0;
  const float eps = spec_.rms_norm_eps;
  const MtpModule& m = mtp_[size_t(a.module)];
  StepViews s = begin_step(T, R);
  // residual = eh_e enorm(E(ids)), moe_out = eh_h hnorm(h_prev): the layer's first fused op
  // (residual += moe_out; x = input_norm(residual)) then starts from eh_proj(cat(...)).
  be_.embedding(w_.embed, *a.ids, s.moe_out);
  be_.rms_norm(s.moe_out, m.enorm, eps, s.x);
  be_.rms_norm(*a.h_prev, m.hnorm, eps, s.o);
  be_.linear(s.x, m.eh_e, s.residual);
  be_.linear(s.o, m.eh_h, s.moe_out);
  mark("mtp_eh_proj");
  // The shared blocks index the KV cache by layer: the module's cache at index l.
  std::vector<KVCacheLayer> kv(size_t(l + 1));
  kv[size_t(l)] = (*a.kv)[size_t(a.module)];
  static const Repeat once{};
  if (spec_.mla.enabled) mla_attention_block(l, s, kv, *a.meta);
  else attention_block(l, s, kv, *a.meta, once);
  if (w_.layers[size_t(l)].dense) dense_block(l, s);
  else moe_block(l, s, once);
  // h = residual + moe_out (the module's output); x = shared_head.norm(h).
  be_.add_rms_norm(s.residual, s.moe_out, m.shared_norm, eps, s.x);
  // s.residual now holds h: copy it out (an identity gather), then the logits of `rows`.
  if (!iota_.data || iota_.numel() < T) {
    Tensor h = Tensor::host(DType::I32, {std::max<int64_t>(T, 1024)});
    for (int64_t i = 0; i < h.numel(); ++i) h.ptr<int32_t>()[i] = int32_t(i);
    iota_ = be_.upload(h);
  }
  be_.embedding(s.residual, iota_.slice_rows(0, T), *a.h_out);
  mark("mtp_layer");
  if (R == 0) return {};
  Tensor sel = ws_.sel.slice_rows(0, R);
  be_.embedding(s.x, *a.rows, sel);
  Tensor logits = ws_.logits.slice_rows(0, R);
  be_.linear(sel, w_.lm_head, logits);
  mark("mtp_lm_head");
  return logits;
}

}  // namespace moeserve
