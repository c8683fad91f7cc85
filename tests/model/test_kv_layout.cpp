// A KV layout with V head dim != K head dim on the CPU backend (the reference; CUDA refuses
// such layouts at load, attention_layout_problem): allocate_kv_cache gives K and V their own
// widths, bytes_per_block counts both, and attention over it equals attention with V
// zero-padded to the K head dim (the equal-dims path), restricted to V's columns.
#include <gtest/gtest.h>

#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/model.h"

using namespace moeserve;

namespace {
Tensor i32(std::vector<int32_t> v, Shape s) {
  Tensor t = Tensor::host(DType::I32, std::move(s));
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}
Tensor f32(const std::vector<float>& v, Shape s) {
  Tensor t = Tensor::host(DType::F32, std::move(s));
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}
}  // namespace

TEST(KvLayout, SeparateVHeadDimOnCpu) {
  auto be = make_cpu_backend();
  const int Hq = 4, Hkv = 2, DK = 16, DV = 8, bs = 4, T = 6, blocks = 3;
  const KvLayout split{1, Hkv, DK, DV}, same{1, Hkv, DK, DK};
  EXPECT_EQ(split.bytes_per_block(bs, 4), int64_t(bs) * Hkv * (DK + DV) * 4);
  auto kv = allocate_kv_cache(*be, split, blocks, bs, DType::F32);
  ASSERT_EQ(kv.size(), 1u);
  EXPECT_EQ(kv[0].k.shape, Shape({blocks, bs, Hkv, DK}));
  EXPECT_EQ(kv[0].v.shape, Shape({blocks, bs, Hkv, DV}));
  auto padded = allocate_kv_cache(*be, same, blocks, bs, DType::F32);

  std::mt19937 rng(5);
  std::normal_distribution<float> n;
  std::vector<float> q(size_t(T) * Hq * DK), k(size_t(T) * Hkv * DK), v(size_t(T) * Hkv * DV);
  for (auto* x : {&q, &k, &v})
    for (auto& e : *x) e = n(rng);
  std::vector<float> vpad(size_t(T) * Hkv * DK, 0.f);  // V in the first DV columns of each head
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < Hkv; ++h)
      for (int c = 0; c < DV; ++c) vpad[(size_t(t) * Hkv + h) * DK + c] = v[(size_t(t) * Hkv + h) * DV + c];

  // Two sequences (4 and 2 tokens, prefill) in blocks {2, 0} and {1}.
  AttentionMeta m;
  m.num_seqs = 2, m.num_tokens = T, m.block_size = bs, m.max_blocks_per_seq = 2, m.max_query_len = 4;
  m.max_context_len = 4;
  m.positions = i32({0, 1, 2, 3, 0, 1}, {T});
  m.query_start = i32({0, 4, 6}, {3});
  m.context_lens = i32({4, 2}, {2});
  m.block_tables = i32({2, 0, 1, 0}, {2, 2});
  m.slot_mapping = i32({8, 9, 10, 11, 4, 5}, {T});
  be->write_kv(f32(k, {T, Hkv * DK}), f32(v, {T, Hkv * DV}), kv[0], m);
  be->write_kv(f32(k, {T, Hkv * DK}), f32(vpad, {T, Hkv * DK}), padded[0], m);
  Tensor qt = f32(q, {T, Hq * DK});
  Tensor out = be->alloc(DType::F32, {T, Hq * DV}), ref = be->alloc(DType::F32, {T, Hq * DK});
  AttentionArgs a;
  a.q = &qt, a.meta = &m, a.num_q_heads = Hq, a.num_kv_heads = Hkv, a.head_dim = DK, a.scale = 0.25f;
  a.kv = &kv[0], a.out = &out, a.v_head_dim = DV;
  be->attention(a);
  a.kv = &padded[0], a.out = &ref, a.v_head_dim = 0;
  be->attention(a);
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < Hq; ++h)
      for (int c = 0; c < DV; ++c)
        EXPECT_NEAR(out.ptr<float>()[(t * Hq + h) * DV + c], ref.ptr<float>()[(t * Hq + h) * DK + c], 1e-6)
            << "token " << t << " head " << h << " col " << c;
}
