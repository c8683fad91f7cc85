#include "tools/bench_synth.h"
#include "tools/synthetic_weights.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "core/error.h"
#include "core/log.h"
#include "model/registry.h"
#include "tools/random_weights.h"

namespace moeserve::tools {

int64_t make_bench_weights(CudaBackend& b, Model& model, uint64_t seed, bool lm_head) {
  const int64_t n = make_device_synthetic_weights(b, model, seed, lm_head);
  return n >= 0 ? n : load_random_weights(model, RandomWeightOptions{seed, lm_head, b.int4_experts_packed()});
}

namespace {

// One device allocation carved into many tensors (256-byte aligned).
struct Slab {
  Tensor mem;
  size_t used = 0;
  Tensor carve(DType t, const Shape& shape) {
    Tensor v = Tensor::view(static_cast<char*>(mem.data) + used, t, shape, Device::CUDA);
    v.owner = mem.owner;
    used += (v.nbytes() + 255) / 256 * 256;
    MS_CHECK(used <= mem.nbytes(), "bench slab overflow");
    return v;
  }
};

size_t fp8_bytes(int out, int in) {
  auto pad = [](size_t n) { return (n + 255) / 256 * 256; };
  return pad(size_t(out) * in) + pad(size_t((out + 127) / 128) * ((in + 127) / 128) * 4);
}

struct Gen {
  CudaBackend& b;
  uint64_t seed;
  Tensor rand(Slab& s, DType t, const Shape& shape, float scale) {
    Tensor x = s.carve(t, shape);
    b.fill_random(x, seed += 10, scale);
    return x;
  }
  // fp8 values uniform in [-1, 1] with a constant block scale 1.7/sqrt(fan_in) (uniform(-1,1)
  // has variance 1/3): activations keep unit scale through the layer. fan_in: the global input
  // width (of a row-parallel slice: all ranks' columns); 0: `in`.
  LinearWeight fp8(Slab& s, int out, int in, int fan_in = 0) {
    LinearWeight w;
    w.weight = rand(s, DType::F8_E4M3, {out, in}, 1.f);
    w.block_out = w.block_in = 128;
    w.scale_inv = s.carve(DType::F32, {(out + 127) / 128, (in + 127) / 128});
    std::vector<float> sc(size_t(w.scale_inv.numel()), 1.7f / std::sqrt(float(fan_in > 0 ? fan_in : in)));
    b.copy_from_host(w.scale_inv, sc.data(), sc.size() * 4);
    return w;
  }
};

}  // namespace

int64_t make_synthetic_weights(CudaBackend& b, MiniMaxM2Model& model, uint64_t seed, bool lm_head) {
  const MiniMaxM2Config& c = model.config();
  const MiniMaxM2Shard& sh = model.shard();
  const int H = c.hidden_size, D = c.head_dim;
  // This rank's widths (the global ones at world 1): q/k/v are column slices, o_proj a row
  // slice [H, QW]; experts are whole (EP, E local of them) or intermediate slices I.
  const int QW = sh.q_heads * D, KW = sh.kv_heads * D, E = sh.num_experts, I = sh.expert_inter;
  const int E_all = c.num_local_experts;
  Gen g{b, seed};
  MiniMaxM2Weights w;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    // One slab per layer: projections, norms, router, and every local expert.
    const size_t bytes = fp8_bytes(QW, H) + 2 * fp8_bytes(KW, H) + fp8_bytes(H, QW) + size_t(E) * 3 * fp8_bytes(I, H) +
                         4 * size_t(H + 255) * 2 + size_t(QW + KW + 512) * 2 + size_t(E_all) * (H + 1) * 4 + 4096;
    Slab s{b.alloc(DType::U8, {int64_t(bytes)})};
    MiniMaxM2Layer L;
    L.q = g.fp8(s, QW, H);
    L.k = g.fp8(s, KW, H);
    L.v = g.fp8(s, KW, H);
    // Row-parallel layers scale by the global fan-in: the all-reduced sum keeps unit scale.
    L.o = g.fp8(s, H, QW, c.num_attention_heads * D);
    L.input_norm = g.rand(s, DType::BF16, {H}, 1.f);
    L.post_attention_norm = g.rand(s, DType::BF16, {H}, 1.f);
    L.q_norm = g.rand(s, DType::BF16, {QW}, 1.f);
    L.k_norm = g.rand(s, DType::BF16, {KW}, 1.f);
    L.moe.gate = g.rand(s, DType::F32, {E_all, H}, 0.02f);  // near-uniform routing
    L.moe.score_bias = g.rand(s, DType::F32, {E_all}, 0.001f);
    L.moe.num_experts = E_all, L.moe.top_k = c.num_experts_per_tok, L.moe.first_local_expert = sh.first_expert;
    for (int e = 0; e < E; ++e) {
      LinearWeight w1 = g.fp8(s, I, H), w3 = g.fp8(s, I, H), w2 = g.fp8(s, H, I, c.intermediate_size);
      L.moe.experts.push_back({w1, w3, w2});
    }
    w.layers.push_back(std::move(L));
  }
  const int heads = lm_head ? 2 : 1;  // embedding (+ lm_head)
  Slab top{b.alloc(DType::U8, {int64_t(heads * (size_t(c.vocab_size) * H * 2 + 256) + size_t(H) * 2 + 256)})};
  w.embed = g.rand(top, DType::BF16, {c.vocab_size, H}, 1.f);
  w.final_norm = g.rand(top, DType::BF16, {H}, 1.f);
  if (lm_head) w.lm_head.weight = g.rand(top, DType::BF16, {c.vocab_size, H}, 0.03f);
  const int64_t n = weight_bytes(w);
  model.set_weights(std::move(w));
  b.synchronize();
  return n;
}

int64_t make_device_synthetic_weights(Backend& b, Model& model, uint64_t seed, bool lm_head) {
  auto* cb = dynamic_cast<CudaBackend*>(&b);
  auto* mm = dynamic_cast<MiniMaxM2Model*>(&model);
  const auto q = model.desc().quantization;
  // The generator makes MiniMax-M2.5's layout: FP8 128x128 projections and experts.
  if (!cb || !mm || !q.enabled() || q.block_out != 128 || q.block_in != 128) return -1;
  return make_synthetic_weights(*cb, *mm, seed, lm_head);
}

int64_t weight_bytes(const MiniMaxM2Weights& w) {
  std::set<const void*> seen;
  int64_t n = 0;
  auto add = [&](const Tensor& t) {
    if (t.defined() && seen.insert(t.data).second) n += int64_t(t.nbytes());
  };
  auto lin = [&](const LinearWeight& l) {
    add(l.weight);
    add(l.scale_inv);
  };
  add(w.embed);
  add(w.final_norm);
  lin(w.lm_head);
  for (const auto& L : w.layers) {
    for (const Tensor* t : {&L.input_norm, &L.post_attention_norm, &L.q_norm, &L.k_norm, &L.moe.gate, &L.moe.score_bias})
      add(*t);
    for (const LinearWeight* l : {&L.q, &L.k, &L.v, &L.o}) lin(*l);
    for (const auto& e : L.moe.experts) {
      lin(e.w1);
      lin(e.w3);
      lin(e.w2);
    }
  }
  return n;
}

}  // namespace moeserve::tools
