#include "tools/bench_synth.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/log.h"

namespace moeserve::tools {

Tensor SynthModel::rand(DType t, const Shape& shape, uint64_t seed, float scale) {
  Tensor x = b_.alloc(t, shape);
  b_.fill_random(x, seed, scale);
  weight_bytes_ += int64_t(x.nbytes());
  return x;
}

Tensor SynthModel::carve(Slab& slab, DType t, const Shape& shape) {
  Tensor v = Tensor::view(static_cast<char*>(slab.mem.data) + slab.used, t, shape, Device::CUDA);
  v.owner = slab.mem.owner;
  slab.used += (v.nbytes() + 255) / 256 * 256;
  MS_CHECK(slab.used <= slab.mem.nbytes(), "bench slab overflow");
  return v;
}

LinearWeight SynthModel::fp8_linear(int out, int in, uint64_t seed, Slab* w_slab, Slab* s_slab) {
  LinearWeight w;
  // fp8 values uniform in [-1, 1] scaled by ~1/sqrt(in): activations keep unit scale.
  if (w_slab) {
    w.weight = carve(*w_slab, DType::F8_E4M3, {out, in});
    b_.fill_random(w.weight, seed, 1.f);
    weight_bytes_ += int64_t(w.weight.nbytes());
  } else {
    w.weight = rand(DType::F8_E4M3, {out, in}, seed, 1.f);
  }
  w.block_out = w.block_in = 128;
  const Shape ss{(out + 127) / 128, (in + 127) / 128};
  w.scale_inv = s_slab ? carve(*s_slab, DType::F32, ss) : b_.alloc(DType::F32, ss);
  // Constant positive scale 1.7/sqrt(in): uniform(-1,1) has variance 1/3.
  std::vector<float> sc(size_t(w.scale_inv.numel()), 1.7f / std::sqrt(float(in)));
  b_.copy_from_host(w.scale_inv, sc.data(), sc.size() * 4);
  weight_bytes_ += int64_t(w.scale_inv.nbytes());
  return w;
}

SynthModel::SynthModel(CudaBackend& b, const SynthShapes& s, int layers, int max_tokens, int max_seqs,
                       int max_blocks_per_seq)
    : b_(b), s_(s), max_tokens_(max_tokens), max_seqs_(max_seqs), max_blocks_(max_blocks_per_seq) {
  const int H = s.hidden, QW = s.q_heads * s.head_dim, KW = s.kv_heads * s.head_dim;
  uint64_t seed = 1000;
  for (int l = 0; l < layers; ++l) {
    SynthLayer L;
    L.q = fp8_linear(QW, H, seed += 10);
    L.k = fp8_linear(KW, H, seed += 10);
    L.v = fp8_linear(KW, H, seed += 10);
    L.o = fp8_linear(H, QW, seed += 10);
    L.in_norm = rand(DType::BF16, {H}, seed += 10, 1.f);
    L.post_norm = rand(DType::BF16, {H}, seed += 10, 1.f);
    L.q_norm = rand(DType::BF16, {QW}, seed += 10, 1.f);
    L.k_norm = rand(DType::BF16, {KW}, seed += 10, 1.f);
    L.moe.gate = rand(DType::F32, {s.experts, H}, seed += 10, 0.02f);  // near-uniform routing
    L.moe.score_bias = rand(DType::F32, {s.experts}, seed += 10, 0.001f);
    L.moe.num_experts = s.experts, L.moe.top_k = s.top_k, L.moe.first_local_expert = 0;
    // All experts of the layer in two slabs (weights, scales).
    const size_t per_w = (size_t(s.intermediate) * H + 255) / 256 * 256;
    const size_t per_s = (size_t((s.intermediate + 127) / 128) * ((H + 127) / 128) * 4 + 255) / 256 * 256;
    Slab ws{b_.alloc(DType::U8, {int64_t(per_w * 3 * s.experts)})};
    Slab ss{b_.alloc(DType::U8, {int64_t(per_s * 3 * s.experts)})};
    for (int e = 0; e < s.experts; ++e) {
      LinearWeight w1 = fp8_linear(s.intermediate, H, seed += 10, &ws, &ss);
      LinearWeight w3 = fp8_linear(s.intermediate, H, seed += 10, &ws, &ss);
      LinearWeight w2 = fp8_linear(H, s.intermediate, seed += 10, &ws, &ss);
      L.moe.experts.push_back({w1, w3, w2});
    }
    layers_.push_back(std::move(L));
  }
  embed_ = rand(DType::BF16, {s.vocab, H}, seed += 10, 1.f);
  final_norm_ = rand(DType::BF16, {H}, seed += 10, 1.f);
  lm_head_.weight = rand(DType::BF16, {s.vocab, H}, seed += 10, 0.03f);
  const int T = max_tokens;
  ids_ = b_.alloc(DType::I32, {T});
  h_ = b_.alloc(DType::BF16, {T, H});
  xn_ = b_.alloc(DType::BF16, {T, H});
  q_ = b_.alloc(DType::BF16, {T, QW});
  k_ = b_.alloc(DType::BF16, {T, KW});
  v_ = b_.alloc(DType::BF16, {T, KW});
  attn_ = b_.alloc(DType::BF16, {T, QW});
  o_ = b_.alloc(DType::BF16, {T, H});
  moe_out_ = b_.alloc(DType::BF16, {T, H});
  last_x_ = b_.alloc(DType::BF16, {max_seqs, H});
  logits_ = b_.alloc(DType::F32, {max_seqs, s.vocab});
  routing_ = {b_.alloc(DType::I32, {T, s.top_k}), b_.alloc(DType::F32, {T, s.top_k})};
  meta_.positions = b_.alloc(DType::I32, {T});
  meta_.slot_mapping = b_.alloc(DType::I32, {T});
  meta_.query_start = b_.alloc(DType::I32, {max_seqs + 1});
  meta_.context_lens = b_.alloc(DType::I32, {max_seqs});
  meta_.block_tables = b_.alloc(DType::I32, {max_seqs, max_blocks_per_seq});
  last_rows_ = b_.alloc(DType::I32, {max_seqs});
  // Random token ids (a fixed pattern is fine: embedding rows are random).
  std::vector<int32_t> ids(T);
  for (int i = 0; i < T; ++i) ids[i] = int32_t((int64_t(i) * 7919) % s.vocab);
  b_.copy_from_host(ids_, ids.data(), ids.size() * 4);
  WorkspacePlan wp{T, H, s.intermediate, s.top_k, s.experts, s.q_heads, s.head_dim};
  b_.reserve(wp);
}

void SynthModel::alloc_kv(int blocks_per_layer, int block_size) {
  meta_.block_size = block_size;
  for (size_t l = 0; l < layers_.size(); ++l) {
    auto& L = layers_[l];
    L.kv.k = b_.alloc(DType::BF16, {blocks_per_layer, block_size, s_.kv_heads, s_.head_dim});
    L.kv.v = b_.alloc(DType::BF16, {blocks_per_layer, block_size, s_.kv_heads, s_.head_dim});
    b_.fill_random(L.kv.k, 77 + l, 1.f);
    b_.fill_random(L.kv.v, 99 + l, 1.f);
  }
}

void SynthModel::plan(const std::vector<int>& qlens, const std::vector<int>& ctxs) {
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
  MS_CHECK(T_ <= max_tokens_, "bench plan: {} tokens > {}", T_, max_tokens_);
  MS_CHECK(int64_t(S) * stride <= layers_[0].kv.k.dim(0), "bench plan: KV pool too small");
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

void SynthModel::forward(const std::function<void(const char*)>& mark) {
  auto m = [&](const char* op) {
    if (mark) mark(op);
  };
  const int T = T_;
  auto rows = [&](Tensor& t) { return t.slice_rows(0, T); };
  Tensor ids = ids_.slice_rows(0, T), h = rows(h_), xn = rows(xn_), q = rows(q_), k = rows(k_), v = rows(v_),
         attn = rows(attn_), o = rows(o_), mo = rows(moe_out_);
  MoeRouting r{routing_.expert_ids.slice_rows(0, T), routing_.weights.slice_rows(0, T)};
  Tensor positions = meta_.positions.slice_rows(0, T);
  b_.embedding(embed_, ids, h);
  m("embedding");
  for (size_t l = 0; l < layers_.size(); ++l) {
    SynthLayer& L = layers_[l];
    const LinearWeight* qkv_w[3] = {&L.q, &L.k, &L.v};
    Tensor* qkv_out[3] = {&q, &k, &v};
    if (l == 0) {
      b_.rms_norm(h, L.in_norm, s_.eps, xn);
      b_.linear_multi(xn, qkv_w, qkv_out, 3);
    } else {
      b_.add_rms_norm_linear_multi(h, mo, L.in_norm, s_.eps, xn, qkv_w, qkv_out, 3);
    }
    m("norm_qkv_proj");
    QkNormRopeArgs qa;
    qa.q = &q, qa.k = &k, qa.q_norm_weight = &L.q_norm, qa.k_norm_weight = &L.k_norm, qa.positions = &positions;
    qa.rope = {s_.head_dim, s_.rotary_dim, s_.theta};
    qa.eps = s_.eps;
    b_.qk_norm_rope_write_kv(qa, v, L.kv, meta_);
    m("qk_norm_rope_write_kv");
    AttentionArgs aa{&q, &L.kv, &meta_, s_.q_heads, s_.kv_heads, s_.head_dim, 1.f / std::sqrt(float(s_.head_dim)), &attn};
    b_.attention(aa);
    m("attention");
    b_.linear(attn, L.o, o);
    m("o_proj");
    b_.add_rms_norm_route(h, o, L.post_norm, s_.eps, xn, L.moe, r);
    m("norm_route");
    b_.moe_experts(xn, L.moe, r, mo);
    m("moe_experts");
  }
  b_.add_rms_norm(h, mo, final_norm_, s_.eps, xn);
  m("norm");
  // Last token of each sequence -> [S, H] (an embedding gather over the normed rows), then lm_head.
  Tensor last_x = last_x_.slice_rows(0, S_), logits = logits_.slice_rows(0, S_);
  b_.embedding(xn, last_rows_.slice_rows(0, S_), last_x);
  b_.linear(last_x, lm_head_, logits);
  m("lm_head");
}

std::vector<float> SynthModel::routing_ids() { return b_.download_f32(routing_.expert_ids.slice_rows(0, T_)); }

}  // namespace moeserve::tools
