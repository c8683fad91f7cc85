// CUDA ops against the CPU reference backend (backend/cpu) on identical bf16-exact inputs:
// one M2.5-shaped decoder step (FP8 q/k/v/o with partial scale blocks absent at these
// shapes, full-width QK-norm + RoPE, paged attention over a chunked-prefill + decode batch,
// router and experts). Thresholds as in the per-op tests: 1e-2 (linear, norm, attention),
// 2e-2 (experts); router ids equal except near-ties.
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

// Host copy of a CUDA weight for the CPU backend (same bytes).
LinearWeight host_weight(const LinearWeight& d) {
  LinearWeight h = d;
  std::vector<uint8_t> raw(d.weight.nbytes());
  cudaMemcpy(raw.data(), d.weight.data, raw.size(), cudaMemcpyDeviceToHost);
  h.weight = Tensor::host(d.weight.dtype, d.weight.shape);
  std::copy(raw.begin(), raw.end(), static_cast<uint8_t*>(h.weight.data));
  if (d.fp8()) h.scale_inv = host_f32(gpu().download_f32(d.scale_inv), d.scale_inv.shape);
  return h;
}

TEST(CudaVsCpu, DecoderStep) {
  SKIP_WITHOUT_GPU();
  auto cpu = make_cpu_backend();
  std::mt19937 rng(21);
  const int H = 3072, Hq = 48, Hkv = 8, D = 128, E = 16, K = 8, I = 1536, bs = 16;
  // Batch: sequence 0 prefills 5 new tokens after 20 cached ones; sequence 1 decodes at 40.
  const std::vector<int> qlen = {5, 1}, ctx = {25, 40};
  const int T = 6, S = 2, maxb = 3;
  std::vector<int32_t> qstart = {0, 5, 6}, ctxv = {25, 40}, table = {4, 0, 2, 1, 5, 3}, pos, slots;
  for (int s = 0; s < S; ++s)
    for (int i = 0; i < qlen[s]; ++i) {
      const int p = ctx[s] - qlen[s] + i;
      pos.push_back(p);
      slots.push_back(table[s * maxb + p / bs] * bs + p % bs);
    }
  auto x = randn(size_t(T) * H, rng);
  HostWeight wq = make_weight(Hq * D, H, true, rng), wk = make_weight(Hkv * D, H, true, rng),
             wo = make_weight(H, Hq * D, true, rng);
  auto qn = randn(Hq * D, rng, 0.5f), kn = randn(Hkv * D, rng, 0.5f);
  auto kc = randn(size_t(6) * bs * Hkv * D, rng), vc = randn(size_t(6) * bs * Hkv * D, rng);

  // ---- q/k projections, QK-norm + RoPE, KV write, attention, o_proj on both backends ----
  auto run = [&](Backend& b, bool on_gpu) {
    auto T_ = [&](const std::vector<float>& v, const Shape& s) {
      return on_gpu ? to_device(v, DType::BF16, s) : host_f32(v, s);
    };
    auto I_ = [&](const std::vector<int32_t>& v, const Shape& s) { return on_gpu ? ints_to_device(v, s) : host_i32(v, s); };
    const DType act = b.activation_dtype();
    Tensor dx = T_(x, {T, H});
    LinearWeight q_w = on_gpu ? wq.dev : host_weight(wq.dev), k_w = on_gpu ? wk.dev : host_weight(wk.dev),
                 o_w = on_gpu ? wo.dev : host_weight(wo.dev);
    Tensor q = b.alloc(act, {T, Hq * D}), k = b.alloc(act, {T, Hkv * D}), v = b.alloc(act, {T, Hkv * D});
    b.linear(dx, q_w, q);
    b.linear(dx, k_w, k);
    b.linear(dx, k_w, v);
    Tensor tqn = T_(qn, {Hq * D}), tkn = T_(kn, {Hkv * D}), tpos = I_(pos, {T});
    QkNormRopeArgs qa;
    qa.q = &q, qa.k = &k, qa.q_norm_weight = &tqn, qa.k_norm_weight = &tkn, qa.positions = &tpos;
    qa.rope = {D, 64, 5e6f};
    b.qk_norm_rope(qa);
    KVCacheLayer kv{T_(kc, {6, bs, Hkv, D}), T_(vc, {6, bs, Hkv, D})};
    AttentionMeta m;
    m.num_seqs = S, m.num_tokens = T, m.block_size = bs, m.max_blocks_per_seq = maxb, m.max_query_len = 5;
    m.max_context_len = 40;
    m.positions = tpos, m.query_start = I_(qstart, {S + 1}), m.context_lens = I_(ctxv, {S});
    m.block_tables = I_(table, {S, maxb}), m.slot_mapping = I_(slots, {T});
    b.write_kv(k, v, kv, m);
    Tensor att = b.alloc(act, {T, Hq * D});
    AttentionArgs aa{&q, &kv, &m, Hq, Hkv, D, 1.f / std::sqrt(float(D)), &att};
    b.attention(aa);
    Tensor o = b.alloc(act, {T, H});
    b.linear(att, o_w, o);
    return std::vector<std::vector<float>>{b.download_f32(q), b.download_f32(att), b.download_f32(o)};
  };
  auto g = run(gpu(), true);
  auto c = run(*cpu, false);
  EXPECT_LT(rel_err(g[0], c[0]), 1e-2) << "q after norm+rope";
  EXPECT_LT(rel_err(g[1], c[1]), 2e-2) << "attention";
  EXPECT_LT(rel_err(g[2], c[2]), 2e-2) << "o_proj";

  // ---- router + experts ----
  MoeWeights gm, cm;
  auto gate = randn(size_t(E) * H, rng, 0.02f, false), bias = randn(E, rng, 0.01f, false);
  gm.gate = to_device(gate, DType::F32, {E, H}), cm.gate = host_f32(gate, {E, H});
  gm.score_bias = to_device(bias, DType::F32, {E}), cm.score_bias = host_f32(bias, {E});
  gm.num_experts = cm.num_experts = E, gm.top_k = cm.top_k = K;
  std::vector<HostWeight> keep;
  for (int e = 0; e < E; ++e) {
    keep.push_back(make_weight(I, H, true, rng));
    keep.push_back(make_weight(I, H, true, rng));
    keep.push_back(make_weight(H, I, true, rng));
    const size_t n = keep.size();
    gm.experts.push_back({keep[n - 3].dev, keep[n - 2].dev, keep[n - 1].dev});
    cm.experts.push_back({host_weight(keep[n - 3].dev), host_weight(keep[n - 2].dev), host_weight(keep[n - 1].dev)});
  }
  MoeRouting gr, cr;
  gr.expert_ids = gpu().alloc(DType::I32, {T, K}), gr.weights = gpu().alloc(DType::F32, {T, K});
  cr.expert_ids = cpu->alloc(DType::I32, {T, K}), cr.weights = cpu->alloc(DType::F32, {T, K});
  Tensor gx = to_device(x, DType::BF16, {T, H}), cx = host_f32(x, {T, H});
  gpu().moe_route(gx, gm, gr);
  cpu->moe_route(cx, cm, cr);
  auto gids = gpu().download_f32(gr.expert_ids), cids = cpu->download_f32(cr.expert_ids);
  int same = 0;
  for (size_t i = 0; i < gids.size(); ++i) same += gids[i] == cids[i];
  EXPECT_GE(same, int(gids.size()) - 2) << "router choices differ beyond near-ties";
  EXPECT_LT(rel_err(gpu().download_f32(gr.weights), cpu->download_f32(cr.weights)), 1e-3);
  // Experts with the CPU's routing on both sides.
  MoeRouting shared{ints_to_device(std::vector<int32_t>(cids.begin(), cids.end()), {T, K}),
                    to_device(cpu->download_f32(cr.weights), DType::F32, {T, K})};
  Tensor gy = gpu().alloc(DType::BF16, {T, H}), cy = cpu->alloc(DType::F32, {T, H});
  gpu().moe_experts(gx, gm, shared, gy);
  cpu->moe_experts(cx, cm, cr, cy);
  EXPECT_LT(rel_err(gpu().download_f32(gy), cpu->download_f32(cy)), 2e-2);
}

}  // namespace
}  // namespace moeserve::test
