// CPU backend: paged write_kv + causal GQA attention against a double-precision reference,
// with ragged sequences, chunked prefill and decode equivalence, and bad metadata.
#include <gtest/gtest.h>

#include <numeric>

#include "core/fp8_e4m3.h"
#include "cpu_test_util.h"

using namespace moeserve;
using namespace moeserve::testing;

namespace {

constexpr int kHq = 6, kHkv = 2, kHd = 16, kBs = 4, kBlocks = 40;
constexpr float kScale = 0.25f;  // 1/sqrt(16)

struct Seq {
  int len = 0;
  std::vector<int32_t> blocks;  // physical block of each logical block
  std::vector<float> q, k, v;   // [len, heads * hd]
};

// Random sequences with disjoint, shuffled physical blocks.
std::vector<Seq> make_seqs(std::mt19937& rng, const std::vector<int>& lens) {
  std::vector<int32_t> phys(kBlocks);
  std::iota(phys.begin(), phys.end(), 0);
  std::shuffle(phys.begin(), phys.end(), rng);
  size_t next = 0;
  std::vector<Seq> out;
  for (int len : lens) {
    Seq s;
    s.len = len;
    for (int b = 0; b < (len + kBs - 1) / kBs; ++b) s.blocks.push_back(phys.at(next++));
    s.q = randn(rng, size_t(len * kHq * kHd));
    s.k = randn(rng, size_t(len * kHkv * kHd));
    s.v = randn(rng, size_t(len * kHkv * kHd));
    out.push_back(std::move(s));
  }
  return out;
}

// Causal attention of every token of s in double: token p attends 0..p.
std::vector<double> attention_ref(const Seq& s) {
  std::vector<double> out(size_t(s.len * kHq * kHd), 0.0);
  for (int p = 0; p < s.len; ++p)
    for (int h = 0; h < kHq; ++h) {
      const int kvh = h / (kHq / kHkv);
      std::vector<double> sc(size_t(p + 1));
      double mx = -1e300;
      for (int j = 0; j <= p; ++j) {
        double d = 0;
        for (int c = 0; c < kHd; ++c)
          d += double(s.q[size_t((p * kHq + h) * kHd + c)]) * s.k[size_t((j * kHkv + kvh) * kHd + c)];
        sc[size_t(j)] = d * kScale;
        mx = std::max(mx, sc[size_t(j)]);
      }
      double sum = 0;
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      for (int j = 0; j <= p; ++j)
        for (int c = 0; c < kHd; ++c)
          out[size_t((p * kHq + h) * kHd + c)] += sc[size_t(j)] / sum * s.v[size_t((j * kHkv + kvh) * kHd + c)];
    }
  return out;
}

struct Cache {
  KVCacheLayer kv;
  explicit Cache(Backend& be, DType dt = DType::F32, float k_scale = 1.f, float v_scale = 1.f) {
    kv.k = be.alloc(dt, {kBlocks, kBs, kHkv, kHd});
    kv.v = be.alloc(dt, {kBlocks, kBs, kHkv, kHd});
    kv.k_scale = k_scale, kv.v_scale = v_scale;
  }
};

struct Range {
  int seq, begin, end;  // query tokens [begin, end) of sequence seq
};

// Runs one step (write_kv + attention) for the given token ranges; returns [T, Hq*hd].
std::vector<float> run_step(Backend& be, Cache& cache, const std::vector<Seq>& seqs, const std::vector<Range>& rs) {
  const int S = int(rs.size());
  int maxb = 1;
  for (const auto& r : rs) maxb = std::max(maxb, int(seqs[size_t(r.seq)].blocks.size()));
  std::vector<int32_t> pos, qs = {0}, ctx, bt(size_t(S * maxb), 0), slots;
  std::vector<float> q, k, v;
  auto append = [](std::vector<float>& dst, const std::vector<float>& src, int b, int e, int w) {
    dst.insert(dst.end(), src.begin() + b * w, src.begin() + e * w);
  };
  for (int i = 0; i < S; ++i) {
    const Range& r = rs[size_t(i)];
    const Seq& s = seqs[size_t(r.seq)];
    for (int p = r.begin; p < r.end; ++p) {
      pos.push_back(p);
      slots.push_back(s.blocks[size_t(p / kBs)] * kBs + p % kBs);
    }
    qs.push_back(qs.back() + r.end - r.begin);
    ctx.push_back(r.end);
    for (size_t b = 0; b < s.blocks.size(); ++b) bt[size_t(i * maxb) + b] = s.blocks[b];
    append(q, s.q, r.begin, r.end, kHq * kHd);
    append(k, s.k, r.begin, r.end, kHkv * kHd);
    append(v, s.v, r.begin, r.end, kHkv * kHd);
  }
  const int T = qs.back();
  AttentionMeta m;
  m.num_seqs = S;
  m.num_tokens = T;
  m.block_size = kBs;
  m.max_blocks_per_seq = maxb;
  m.positions = i32_tensor(pos, {T});
  m.query_start = i32_tensor(qs, {S + 1});
  m.context_lens = i32_tensor(ctx, {S});
  m.block_tables = i32_tensor(bt, {S, maxb});
  m.slot_mapping = i32_tensor(slots, {T});
  be.write_kv(f32_tensor(k, {T, kHkv * kHd}), f32_tensor(v, {T, kHkv * kHd}), cache.kv, m);
  Tensor qt = f32_tensor(q, {T, kHq * kHd});
  Tensor out = be.alloc(DType::F32, {T, kHq * kHd});
  AttentionArgs a{&qt, &cache.kv, &m, kHq, kHkv, kHd, kScale, &out};
  be.attention(a);
  return as_vec(out);
}

// Rows of a step output belonging to range index i.
std::vector<float> rows_of_range(const std::vector<float>& out, const std::vector<Range>& rs, size_t i) {
  size_t off = 0;
  for (size_t j = 0; j < i; ++j) off += size_t(rs[j].end - rs[j].begin);
  const size_t w = kHq * kHd;
  return {out.begin() + long(off * w), out.begin() + long((off + size_t(rs[i].end - rs[i].begin)) * w)};
}

const std::vector<int> kLens = {5, 17, 1, 9};

}  // namespace

TEST(CpuAttention, RaggedPrefillMatchesDouble) {
  auto be = make_cpu_backend();
  std::mt19937 rng(11);
  auto seqs = make_seqs(rng, kLens);
  Cache cache(*be);
  std::vector<Range> rs;
  for (int i = 0; i < int(seqs.size()); ++i) rs.push_back({i, 0, seqs[size_t(i)].len});
  auto out = run_step(*be, cache, seqs, rs);
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::string what = "attention prefill seq len " + std::to_string(seqs[i].len);
    EXPECT_LT(max_rel_err(rows_of_range(out, rs, i), attention_ref(seqs[i]), what.c_str()), 1e-5);
  }
  // The cache holds each token's K at its slot.
  const Seq& s = seqs[1];
  for (int p = 0; p < s.len; ++p) {
    const float* row = cache.kv.k.ptr<float>() + size_t((s.blocks[size_t(p / kBs)] * kBs + p % kBs) * kHkv * kHd);
    for (int c = 0; c < kHkv * kHd; ++c) ASSERT_EQ(row[c], s.k[size_t(p * kHkv * kHd + c)]);
  }
}

TEST(CpuAttention, ChunkedPrefillEqualsFullPrefill) {
  auto be = make_cpu_backend();
  std::mt19937 rng(12);
  auto seqs = make_seqs(rng, kLens);
  Cache full_cache(*be), chunk_cache(*be);
  std::vector<Range> full;
  for (int i = 0; i < int(seqs.size()); ++i) full.push_back({i, 0, seqs[size_t(i)].len});
  auto full_out = run_step(*be, full_cache, seqs, full);
  // Step 1: first chunks (seq 2 not yet scheduled); step 2: the rest, starting mid-sequence.
  std::vector<Range> c1 = {{0, 0, 2}, {1, 0, 7}, {3, 0, 4}};
  std::vector<Range> c2 = {{0, 2, 5}, {1, 7, 17}, {2, 0, 1}, {3, 4, 9}};
  auto o1 = run_step(*be, chunk_cache, seqs, c1);
  auto o2 = run_step(*be, chunk_cache, seqs, c2);
  const size_t w = kHq * kHd;
  for (size_t i = 0; i < seqs.size(); ++i) {
    auto ref = rows_of_range(full_out, full, i);
    std::vector<float> got;
    for (auto [ranges, out] : {std::pair{&c1, &o1}, std::pair{&c2, &o2}})
      for (size_t j = 0; j < ranges->size(); ++j)
        if ((*ranges)[j].seq == int(i)) {
          auto part = rows_of_range(*out, *ranges, j);
          got.insert(got.end(), part.begin(), part.end());
        }
    ASSERT_EQ(got.size(), size_t(seqs[i].len) * w);
    EXPECT_EQ(got, ref) << "sequence " << i;  // same inputs and order: bit-identical
  }
}

TEST(CpuAttention, DecodeEqualsPrefill) {
  auto be = make_cpu_backend();
  std::mt19937 rng(13);
  auto seqs = make_seqs(rng, kLens);
  Cache full_cache(*be), dec_cache(*be);
  std::vector<Range> full;
  for (int i = 0; i < int(seqs.size()); ++i) full.push_back({i, 0, seqs[size_t(i)].len});
  auto full_out = run_step(*be, full_cache, seqs, full);
  // Prefill one token of every sequence, then decode one token per sequence per step for
  // the sequences that still have tokens (a ragged, shrinking decode batch).
  std::vector<std::vector<float>> got(seqs.size());
  for (int p = 0; p < 17; ++p) {
    std::vector<Range> rs;
    for (int i = 0; i < int(seqs.size()); ++i)
      if (p < seqs[size_t(i)].len) rs.push_back({i, p, p + 1});
    auto out = run_step(*be, dec_cache, seqs, rs);
    for (size_t j = 0; j < rs.size(); ++j) {
      auto row = rows_of_range(out, rs, j);
      got[size_t(rs[j].seq)].insert(got[size_t(rs[j].seq)].end(), row.begin(), row.end());
    }
  }
  for (size_t i = 0; i < seqs.size(); ++i) EXPECT_EQ(got[i], rows_of_range(full_out, full, i)) << "sequence " << i;
}

TEST(CpuAttention, RejectsBadMetadata) {
  auto be = make_cpu_backend();
  std::mt19937 rng(14);
  auto seqs = make_seqs(rng, {6});
  Cache cache(*be);
  run_step(*be, cache, seqs, {{0, 0, 6}});
  Tensor q = be->alloc(DType::F32, {1, kHq * kHd}), out = be->alloc(DType::F32, {1, kHq * kHd});
  auto meta = [&](int pos, int ctx, int block0) {
    AttentionMeta m;
    m.num_seqs = 1;
    m.num_tokens = 1;
    m.block_size = kBs;
    m.max_blocks_per_seq = 2;
    m.positions = i32_tensor({pos}, {1});
    m.query_start = i32_tensor({0, 1}, {2});
    m.context_lens = i32_tensor({ctx}, {1});
    m.block_tables = i32_tensor({block0, seqs[0].blocks[1]}, {1, 2});
    m.slot_mapping = i32_tensor({block0 * kBs}, {1});
    return m;
  };
  AttentionMeta ok = meta(5, 6, seqs[0].blocks[0]);
  AttentionArgs a{&q, &cache.kv, &ok, kHq, kHkv, kHd, kScale, &out};
  EXPECT_NO_THROW(be->attention(a));
  AttentionMeta pos_past_ctx = meta(6, 6, seqs[0].blocks[0]);
  a.meta = &pos_past_ctx;
  EXPECT_THROW(be->attention(a), Error);
  AttentionMeta ctx_past_table = meta(5, 9, seqs[0].blocks[0]);
  a.meta = &ctx_past_table;
  EXPECT_THROW(be->attention(a), Error);
  AttentionMeta bad_block = meta(5, 6, kBlocks);
  a.meta = &bad_block;
  EXPECT_THROW(be->attention(a), Error);
  a.meta = &ok;
  a.num_q_heads = 5;  // not a multiple of the kv heads
  EXPECT_THROW(be->attention(a), Error);
  // write_kv with a slot outside the cache.
  Tensor kv_row = be->alloc(DType::F32, {1, kHkv * kHd});
  AttentionMeta bad_slot = meta(5, 6, seqs[0].blocks[0]);
  bad_slot.slot_mapping = i32_tensor({kBlocks * kBs}, {1});
  EXPECT_THROW(be->write_kv(kv_row, kv_row, cache.kv, bad_slot), Error);
}

// --kv-cache-dtype fp8: write_kv stores e4m3(x / scale) (core/fp8_e4m3.h), attention reads
// e4m3 * scale. Against the double reference over the dequantised K/V it is as exact as the
// f32 cache; against the unquantised K/V the error is e4m3's.
TEST(CpuAttention, Fp8KvCacheStoresE4m3AndReadsScaled) {
  auto be = make_cpu_backend();
  std::mt19937 rng(21);
  auto seqs = make_seqs(rng, kLens);
  const float ks = 0.37f, vs = 1.9f;
  Cache cache(*be, DType::F8_E4M3, ks, vs);
  std::vector<Range> rs;
  for (int i = 0; i < int(seqs.size()); ++i) rs.push_back({i, 0, seqs[size_t(i)].len});
  auto out = run_step(*be, cache, seqs, rs);
  double worst = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    Seq dq = seqs[i];
    for (auto& x : dq.k) x = fp8::kv_load(fp8::kv_store(x, ks), ks);
    for (auto& x : dq.v) x = fp8::kv_load(fp8::kv_store(x, vs), vs);
    const auto got = rows_of_range(out, rs, i);
    EXPECT_LT(max_rel_err(got, attention_ref(dq), "fp8 attention vs dequantised reference"), 1e-5);
    worst = std::max(worst, max_rel_err(got, attention_ref(seqs[i]), "fp8 attention vs unquantised"));
  }
  std::printf("[fp8-kv] CPU attention, FP8 cache vs unquantised K/V: max rel err %.3g\n", worst);
  EXPECT_LT(worst, 1.0 / 16);  // e4m3's unit roundoff
  EXPECT_GT(worst, 0.0);
  const Seq& s = seqs[1];
  for (int p = 0; p < s.len; ++p) {
    const int64_t slot = s.blocks[size_t(p / kBs)] * kBs + p % kBs;
    const uint8_t* kr = cache.kv.k.ptr<uint8_t>() + slot * kHkv * kHd;
    const uint8_t* vr = cache.kv.v.ptr<uint8_t>() + slot * kHkv * kHd;
    for (int c = 0; c < kHkv * kHd; ++c) {
      ASSERT_EQ(kr[c], fp8::kv_store(s.k[size_t(p * kHkv * kHd + c)], ks));
      ASSERT_EQ(vr[c], fp8::kv_store(s.v[size_t(p * kHkv * kHd + c)], vs));
    }
  }
}

// Decode one token at a time over an FP8 cache = one prefill over it (same bytes cached).
TEST(CpuAttention, Fp8KvDecodeEqualsPrefill) {
  auto be = make_cpu_backend();
  std::mt19937 rng(22);
  auto seqs = make_seqs(rng, {13});
  Cache full(*be, DType::F8_E4M3, 0.5f, 0.5f), step(*be, DType::F8_E4M3, 0.5f, 0.5f);
  const auto ref = run_step(*be, full, seqs, {{0, 0, 13}});
  const size_t w = kHq * kHd;
  for (int p = 0; p < 13; ++p) {
    const auto o = run_step(*be, step, seqs, {{0, p, p + 1}});
    const std::vector<float> want(ref.begin() + long(p * w), ref.begin() + long((p + 1) * w));
    EXPECT_LT(max_rel_err(o, want, "fp8 decode vs prefill"), 1e-6) << p;
  }
}

TEST(CpuAttention, MixedKvDtypesRefused) {
  auto be = make_cpu_backend();
  std::mt19937 rng(23);
  auto seqs = make_seqs(rng, {3});
  Cache c(*be, DType::F8_E4M3);
  c.kv.v = be->alloc(DType::F32, {kBlocks, kBs, kHkv, kHd});
  EXPECT_THROW(run_step(*be, c, seqs, {{0, 0, 3}}), Error);
}
