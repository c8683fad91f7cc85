// CPU backend: embedding, norms, linear (all weight dtypes incl. FP8 block scales with
// partial edge blocks), row_sum_squares, qk_norm_rope and add, each against a naive
// double-precision loop written here.
#include <gtest/gtest.h>

#include "cpu_test_util.h"

using namespace moeserve;
using namespace moeserve::testing;

namespace {

std::unique_ptr<Backend> cpu() { return make_cpu_backend(); }

std::vector<double> rms_norm_ref(const std::vector<double>& x, const std::vector<double>& w, int64_t T, int64_t H,
                                 double eps) {
  std::vector<double> y(x.size());
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t j = 0; j < H; ++j) ss += x[size_t(t * H + j)] * x[size_t(t * H + j)];
    const double inv = 1.0 / std::sqrt(ss / double(H) + eps);
    for (int64_t j = 0; j < H; ++j) y[size_t(t * H + j)] = x[size_t(t * H + j)] * inv * w[size_t(j)];
  }
  return y;
}

}  // namespace

TEST(CpuBackend, Basics) {
  auto be = cpu();
  EXPECT_EQ(be->device(), Device::CPU);
  EXPECT_EQ(be->activation_dtype(), DType::F32);
  Tensor t = be->alloc(DType::F32, {3, 5});
  for (int i = 0; i < 15; ++i) EXPECT_EQ(t.ptr<float>()[i], 0.f);
  std::vector<float> src(15);
  for (int i = 0; i < 15; ++i) src[size_t(i)] = float(i) * 0.5f;
  be->copy_from_host(t, src.data(), 60);
  EXPECT_EQ(be->download_f32(t), src);
  EXPECT_THROW(be->copy_from_host(t, src.data(), 56), Error);
  Tensor b = to_dtype(src, {15}, DType::BF16);
  EXPECT_EQ(be->download_f32(be->upload(b)), src);  // k/2 values are exact in bf16
}

TEST(CpuBackend, EmbeddingAllDtypesAndBadIds) {
  auto be = cpu();
  std::mt19937 rng(1);
  const int64_t V = 50, H = 24;
  std::vector<float> table = randn(rng, size_t(V * H));
  std::vector<int32_t> ids = {0, 49, 7, 7, 23};
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    Tensor tab = to_dtype(table, {V, H}, dt);
    std::vector<float> exact = as_vec(tab);
    Tensor out = be->alloc(DType::F32, {5, H});
    be->embedding(tab, i32_tensor(ids, {5}), out);
    std::vector<float> got = as_vec(out);
    for (size_t t = 0; t < ids.size(); ++t)
      for (int64_t j = 0; j < H; ++j)
        ASSERT_EQ(got[t * H + size_t(j)], exact[size_t(ids[t]) * H + size_t(j)]) << dtype_name(dt);
  }
  Tensor tab = to_dtype(table, {V, H}, DType::F32);
  Tensor out = be->alloc(DType::F32, {1, H});
  EXPECT_THROW(be->embedding(tab, i32_tensor({50}, {1}), out), Error);
  EXPECT_THROW(be->embedding(tab, i32_tensor({-1}, {1}), out), Error);
  Tensor out2 = be->alloc(DType::F32, {2, H});
  EXPECT_THROW(be->embedding(tab, i32_tensor({1}, {1}), out2), Error);  // shape mismatch
}

TEST(CpuBackend, RmsNormAndAddRmsNorm) {
  auto be = cpu();
  std::mt19937 rng(2);
  const int64_t T = 13, H = 257;
  std::vector<float> x = randn(rng, size_t(T * H), 3.f), r = randn(rng, size_t(T * H));
  std::vector<float> w = randn(rng, size_t(H));
  Tensor wt = to_dtype(w, {H}, DType::BF16);
  std::vector<double> wd = to_double(as_vec(wt));

  Tensor out = be->alloc(DType::F32, {T, H});
  be->rms_norm(f32_tensor(x, {T, H}), wt, 1e-6f, out);
  EXPECT_LT(max_rel_err(as_vec(out), rms_norm_ref(to_double(x), wd, T, H, 1e-6), "rms_norm"), 1e-6);

  // In place (out == x) gives the same values.
  Tensor xin = f32_tensor(x, {T, H});
  be->rms_norm(xin, wt, 1e-6f, xin);
  EXPECT_EQ(as_vec(xin), as_vec(out));

  Tensor res = f32_tensor(r, {T, H});
  be->add_rms_norm(res, f32_tensor(x, {T, H}), wt, 1e-5f, out);
  std::vector<double> sum(size_t(T * H));
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = double(r[i]) + double(x[i]);
  EXPECT_LT(max_rel_err(as_vec(res), sum, "add_rms_norm residual"), 1e-7);
  EXPECT_LT(max_rel_err(as_vec(out), rms_norm_ref(sum, wd, T, H, 1e-5), "add_rms_norm out"), 1e-6);

  Tensor bad_w = to_dtype(w, {H - 1}, DType::F32);
  EXPECT_THROW(be->rms_norm(f32_tensor(x, {T, H}), bad_w, 1e-6f, out), Error);
}

struct LinearCase {
  DType dt;
  int64_t T, out, in;
  int bo, bi;
  const char* name;
};

TEST(CpuBackend, LinearAllDtypesAgainstDouble) {
  auto be = cpu();
  const LinearCase cases[] = {
      {DType::F32, 5, 70, 33, 0, 0, "linear f32 5x33->70"},
      {DType::BF16, 37, 129, 300, 0, 0, "linear bf16 37x300->129"},
      {DType::F16, 3, 64, 96, 0, 0, "linear f16 3x96->64"},
      {DType::F8_E4M3, 1, 200, 300, 128, 128, "linear fp8 1x300->200 blk128"},
      {DType::F8_E4M3, 40, 200, 300, 128, 128, "linear fp8 40x300->200 blk128"},
      {DType::F8_E4M3, 9, 77, 130, 16, 64, "linear fp8 9x130->77 blk16x64"},
  };
  std::mt19937 rng(3);
  for (const auto& c : cases) {
    LinearWeight w = make_linear(rng, c.out, c.in, c.dt, c.bo ? c.bo : 128, c.bi ? c.bi : 128);
    std::vector<float> x = randn(rng, size_t(c.T * c.in));
    Tensor out = be->alloc(DType::F32, {c.T, c.out});
    be->linear(f32_tensor(x, {c.T, c.in}), w, out);
    std::vector<double> ref = linear_ref(to_double(x), c.T, dequant_ref(w), c.out, c.in);
    EXPECT_LT(max_rel_err(as_vec(out), ref, c.name), 1e-5) << c.name;
  }
}

TEST(CpuBackend, LinearFp8EdgeScalesMatter) {
  // A scale change in the last partial block (rows 128..199, cols 256..299) must change
  // exactly the outputs of rows 128..199: catches edge blocks read with the wrong index.
  auto be = cpu();
  std::mt19937 rng(4);
  LinearWeight w = make_linear(rng, 200, 300, DType::F8_E4M3);
  std::vector<float> x = randn(rng, 300);
  Tensor out1 = be->alloc(DType::F32, {1, 200}), out2 = be->alloc(DType::F32, {1, 200});
  be->linear(f32_tensor(x, {1, 300}), w, out1);
  w.scale_inv.ptr<float>()[1 * 3 + 2] *= 2.f;
  be->linear(f32_tensor(x, {1, 300}), w, out2);
  auto a = as_vec(out1), b = as_vec(out2);
  for (int o = 0; o < 200; ++o) {
    if (o < 128) EXPECT_EQ(a[size_t(o)], b[size_t(o)]) << o;
    else EXPECT_NE(a[size_t(o)], b[size_t(o)]) << o;
  }
}

TEST(CpuBackend, LinearRejectsBadWeights) {
  auto be = cpu();
  std::mt19937 rng(5);
  LinearWeight w = make_linear(rng, 200, 300, DType::F8_E4M3);
  Tensor x = be->alloc(DType::F32, {2, 300}), out = be->alloc(DType::F32, {2, 200});
  LinearWeight bad = w;
  bad.scale_inv = Tensor::host(DType::F32, {2, 2});  // should be [2, 3]
  EXPECT_THROW(be->linear(x, bad, out), Error);
  bad = w;
  bad.block_in = 0;
  EXPECT_THROW(be->linear(x, bad, out), Error);
  bad = w;
  bad.scale_inv = Tensor();
  EXPECT_THROW(be->linear(x, bad, out), Error);
  Tensor x_wrong = be->alloc(DType::F32, {2, 299});
  EXPECT_THROW(be->linear(x_wrong, w, out), Error);
  Tensor out_wrong = be->alloc(DType::F32, {3, 200});
  EXPECT_THROW(be->linear(x, w, out_wrong), Error);
}

TEST(CpuBackend, RowSumSquaresAndAdd) {
  auto be = cpu();
  std::mt19937 rng(6);
  const int64_t T = 9, H = 1000;
  std::vector<float> x = randn(rng, size_t(T * H)), y = randn(rng, size_t(T * H));
  Tensor ss = be->alloc(DType::F32, {T});
  be->row_sum_squares(f32_tensor(x, {T, H}), ss);
  std::vector<double> ref(size_t(T), 0.0), sum(size_t(T * H));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < H; ++j) ref[size_t(t)] += double(x[size_t(t * H + j)]) * x[size_t(t * H + j)];
  EXPECT_LT(max_rel_err(as_vec(ss), ref, "row_sum_squares"), 1e-7);

  Tensor out = be->alloc(DType::F32, {T, H});
  be->add(f32_tensor(x, {T, H}), f32_tensor(y, {T, H}), out);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = double(x[i]) + y[i];
  EXPECT_LT(max_rel_err(as_vec(out), sum, "add"), 1e-7);
  EXPECT_THROW(be->add(f32_tensor(x, {T, H}), f32_tensor(y, {T * H}), out), Error);
}

namespace {

// Double reference of full-width RMSNorm then NeoX partial RoPE. inv_freq and the angle
// follow the HF float32 recipe (fp32 inv_freq, fp32 product) — that rounding is part of the
// spec the backend must match; cos/sin and everything else in double.
std::vector<double> qk_ref(const std::vector<float>& x, const std::vector<double>& w, const std::vector<int32_t>& pos,
                           int64_t width, int hd, int rd, float theta, double eps) {
  const int64_t T = int64_t(pos.size());
  std::vector<double> y = rms_norm_ref(to_double(x), w, T, width, eps);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h0 = 0; h0 < width; h0 += hd) {
      double* v = y.data() + t * width + h0;
      for (int i = 0; i < rd / 2; ++i) {
        const float inv_freq = 1.0f / float(std::pow(double(theta), double(float(2 * i) / float(rd))));
        const double ang = double(float(pos[size_t(t)]) * inv_freq);
        const double a = v[i], b = v[i + rd / 2];
        v[i] = a * std::cos(ang) - b * std::sin(ang);
        v[i + rd / 2] = b * std::cos(ang) + a * std::sin(ang);
      }
    }
  return y;
}

}  // namespace

TEST(CpuBackend, QkNormRopeFullWidthPartialRotary) {
  auto be = cpu();
  std::mt19937 rng(7);
  const int64_t T = 6;
  const int Hq = 4, Hkv = 2, hd = 32, rd = 16;
  const float theta = 5e6f;
  std::vector<int32_t> pos = {0, 1, 2, 17, 900, 4095};
  std::vector<float> q = randn(rng, size_t(T * Hq * hd), 2.f), k = randn(rng, size_t(T * Hkv * hd));
  Tensor wq = to_dtype(randn(rng, size_t(Hq * hd)), {Hq * hd}, DType::BF16);
  Tensor wk = to_dtype(randn(rng, size_t(Hkv * hd)), {Hkv * hd}, DType::BF16);
  Tensor qt = f32_tensor(q, {T, Hq * hd}), kt = f32_tensor(k, {T, Hkv * hd}), pt = i32_tensor(pos, {T});
  QkNormRopeArgs a;
  a.q = &qt;
  a.k = &kt;
  a.q_norm_weight = &wq;
  a.k_norm_weight = &wk;
  a.positions = &pt;
  a.rope = {hd, rd, theta};
  be->qk_norm_rope(a);
  EXPECT_LT(max_rel_err(as_vec(qt), qk_ref(q, to_double(as_vec(wq)), pos, Hq * hd, hd, rd, theta, 1e-6), "qk_norm_rope q"),
            2e-6);
  EXPECT_LT(max_rel_err(as_vec(kt), qk_ref(k, to_double(as_vec(wk)), pos, Hkv * hd, hd, rd, theta, 1e-6), "qk_norm_rope k"),
            2e-6);
  // Dims past rotary_dim of every head are only normalised: spot-check they are not rotated
  // by comparing with rotary_dim = 0.
  Tensor q0 = f32_tensor(q, {T, Hq * hd}), k0 = f32_tensor(k, {T, Hkv * hd});
  a.q = &q0;
  a.k = &k0;
  a.rope = {hd, 0, theta};
  be->qk_norm_rope(a);
  auto r = as_vec(qt), n = as_vec(q0);
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < Hq; ++h)
      for (int d = rd; d < hd; ++d) {
        const size_t i = size_t(t * Hq * hd + h * hd + d);
        ASSERT_EQ(r[i], n[i]);
      }
}

TEST(CpuBackend, QkNormRopeTensorParallelStatistic) {
  // Two "ranks" each hold half the heads; with all-reduced sums of squares and the full
  // widths their outputs concatenated equal the single-rank result.
  auto be = cpu();
  std::mt19937 rng(8);
  const int64_t T = 5;
  const int Hq = 4, Hkv = 2, hd = 16, rd = 8;
  std::vector<int32_t> pos = {3, 4, 5, 6, 100};
  std::vector<float> q = randn(rng, size_t(T * Hq * hd)), k = randn(rng, size_t(T * Hkv * hd));
  std::vector<float> wqv = randn(rng, size_t(Hq * hd)), wkv = randn(rng, size_t(Hkv * hd));
  Tensor pt = i32_tensor(pos, {T});
  Tensor wq = f32_tensor(wqv, {Hq * hd}), wk = f32_tensor(wkv, {Hkv * hd});
  Tensor qf = f32_tensor(q, {T, Hq * hd}), kf = f32_tensor(k, {T, Hkv * hd});
  QkNormRopeArgs full{&qf, &kf, &wq, &wk, &pt, {hd, rd, 1e4f}};
  be->qk_norm_rope(full);

  auto half_cols = [&](const std::vector<float>& src, int64_t width, int r) {
    std::vector<float> out;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < width / 2; ++j) out.push_back(src[size_t(t * width + r * width / 2 + j)]);
    return out;
  };
  std::vector<Tensor> qr(2), kr(2), wqr(2), wkr(2), qss(2), kss(2);
  for (int r = 0; r < 2; ++r) {
    qr[r] = f32_tensor(half_cols(q, Hq * hd, r), {T, Hq * hd / 2});
    kr[r] = f32_tensor(half_cols(k, Hkv * hd, r), {T, Hkv * hd / 2});
    wqr[r] = f32_tensor(std::vector<float>(wqv.begin() + r * Hq * hd / 2, wqv.begin() + (r + 1) * Hq * hd / 2), {Hq * hd / 2});
    wkr[r] = f32_tensor(std::vector<float>(wkv.begin() + r * Hkv * hd / 2, wkv.begin() + (r + 1) * Hkv * hd / 2), {Hkv * hd / 2});
    qss[r] = be->alloc(DType::F32, {T});
    kss[r] = be->alloc(DType::F32, {T});
    be->row_sum_squares(qr[r], qss[r]);
    be->row_sum_squares(kr[r], kss[r]);
  }
  Tensor qsum = be->alloc(DType::F32, {T}), ksum = be->alloc(DType::F32, {T});
  be->add(qss[0], qss[1], qsum);
  be->add(kss[0], kss[1], ksum);
  for (int r = 0; r < 2; ++r) {
    QkNormRopeArgs a{&qr[r], &kr[r], &wqr[r], &wkr[r], &pt, {hd, rd, 1e4f}};
    a.q_sum_squares = &qsum;
    a.k_sum_squares = &ksum;
    a.q_full_width = Hq * hd;
    a.k_full_width = Hkv * hd;
    be->qk_norm_rope(a);
  }
  std::vector<double> qcat(size_t(T * Hq * hd)), kcat(size_t(T * Hkv * hd));
  for (int r = 0; r < 2; ++r) {
    auto qv = as_vec(qr[r]), kv = as_vec(kr[r]);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < Hq * hd / 2; ++j) qcat[size_t(t * Hq * hd + r * Hq * hd / 2 + j)] = qv[size_t(t * Hq * hd / 2 + j)];
      for (int64_t j = 0; j < Hkv * hd / 2; ++j) kcat[size_t(t * Hkv * hd + r * Hkv * hd / 2 + j)] = kv[size_t(t * Hkv * hd / 2 + j)];
    }
  }
  EXPECT_LT(max_rel_err(as_vec(qf), qcat, "qk_norm_rope TP2 vs TP1 q"), 1e-6);
  EXPECT_LT(max_rel_err(as_vec(kf), kcat, "qk_norm_rope TP2 vs TP1 k"), 1e-6);

  // Bad arguments: a sum-of-squares tensor of the wrong length; rotary_dim > head_dim.
  Tensor short_ss = be->alloc(DType::F32, {T - 1});
  QkNormRopeArgs bad{&qr[0], &kr[0], &wqr[0], &wkr[0], &pt, {hd, rd, 1e4f}};
  bad.q_sum_squares = &short_ss;
  EXPECT_THROW(be->qk_norm_rope(bad), Error);
  QkNormRopeArgs bad2{&qf, &kf, &wq, &wk, &pt, {hd, hd + 2, 1e4f}};
  EXPECT_THROW(be->qk_norm_rope(bad2), Error);
}
