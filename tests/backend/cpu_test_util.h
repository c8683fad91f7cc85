// Helpers for the CPU backend tests: seeded random tensors in every weight dtype, an
// independent double-precision dequantiser, and error metrics.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"

namespace moeserve::testing {

inline Tensor f32_tensor(const std::vector<float>& v, Shape shape) {
  Tensor t = Tensor::host(DType::F32, std::move(shape));
  EXPECT_EQ(size_t(t.numel()), v.size());
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}

inline Tensor i32_tensor(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::host(DType::I32, std::move(shape));
  EXPECT_EQ(size_t(t.numel()), v.size());
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}

inline std::vector<float> randn(std::mt19937& rng, size_t n, float stddev = 1.f) {
  std::normal_distribution<float> d(0.f, stddev);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> as_vec(const Tensor& t) { return to_f32_vector(t); }

// Converts f32 values into a BF16 or F16 tensor (rounded); values() then reads back the
// exact stored values, which is what a reference must use.
inline Tensor to_dtype(const std::vector<float>& v, Shape shape, DType dt) {
  Tensor t = Tensor::host(dt, std::move(shape));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (dt) {
      case DType::F32: t.ptr<float>()[i] = v[i]; break;
      case DType::BF16: t.ptr<uint16_t>()[i] = f32_to_bf16(v[i]); break;
      case DType::F16: t.ptr<uint16_t>()[i] = f32_to_f16(v[i]); break;
      default: ADD_FAILURE() << "to_dtype: unsupported";
    }
  }
  return t;
}

// A LinearWeight [out, in] in dtype dt; FP8 uses random per-block scales of the given block
// sizes (edge blocks partial when the sizes do not divide).
inline LinearWeight make_linear(std::mt19937& rng, int64_t out, int64_t in, DType dt, int bo = 128,
                                int bi = 128) {
  std::vector<float> w = randn(rng, size_t(out * in), 1.f / std::sqrt(float(in)));
  LinearWeight lw;
  if (dt != DType::F8_E4M3) {
    lw.weight = to_dtype(w, {out, in}, dt);
    return lw;
  }
  const int64_t so = (out + bo - 1) / bo, si = (in + bi - 1) / bi;
  std::uniform_real_distribution<float> sd(0.5f, 2.f);
  lw.scale_inv = Tensor::host(DType::F32, {so, si});
  for (int64_t i = 0; i < so * si; ++i) lw.scale_inv.ptr<float>()[i] = sd(rng) * 0.01f;
  lw.weight = Tensor::host(DType::F8_E4M3, {out, in});
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < in; ++j) {
      const float s = lw.scale_inv.ptr<float>()[(o / bo) * si + j / bi];
      lw.weight.ptr<uint8_t>()[o * in + j] = f32_to_fp8_e4m3(w[size_t(o * in + j)] / s);
    }
  lw.block_out = bo;
  lw.block_in = bi;
  return lw;
}

// Reference dequantisation in double, written from the format definition.
inline std::vector<double> dequant_ref(const LinearWeight& lw) {
  const int64_t out = lw.weight.dim(0), in = lw.weight.dim(1);
  std::vector<double> w(size_t(out * in));
  for (int64_t o = 0; o < out; ++o)
    for (int64_t j = 0; j < in; ++j) {
      const size_t i = size_t(o * in + j);
      double v = 0;
      switch (lw.weight.dtype) {
        case DType::F32: v = lw.weight.ptr<float>()[i]; break;
        case DType::BF16: v = bf16_to_f32(lw.weight.ptr<uint16_t>()[i]); break;
        case DType::F16: v = f16_to_f32(lw.weight.ptr<uint16_t>()[i]); break;
        case DType::F8_E4M3: {
          const int64_t si = lw.scale_inv.dim(1);
          v = double(fp8_e4m3_to_f32(lw.weight.ptr<uint8_t>()[i])) *
              double(lw.scale_inv.ptr<float>()[(o / lw.block_out) * si + j / lw.block_in]);
          break;
        }
        default: ADD_FAILURE() << "dequant_ref: unsupported";
      }
      w[i] = v;
    }
  return w;
}

// y[T, out] = x[T, in] @ W^T in double.
inline std::vector<double> linear_ref(const std::vector<double>& x, int64_t T, const std::vector<double>& w,
                                      int64_t out, int64_t in) {
  std::vector<double> y(size_t(T * out), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t j = 0; j < in; ++j) s += x[size_t(t * in + j)] * w[size_t(o * in + j)];
      y[size_t(t * out + o)] = s;
    }
  return y;
}

inline std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Normwise relative error: max |got - ref| / max |ref|. Records it on the test and prints it.
inline double max_rel_err(const std::vector<float>& got, const std::vector<double>& ref, const char* what) {
  EXPECT_EQ(got.size(), ref.size()) << what;
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < std::min(got.size(), ref.size()); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - ref[i]));
    max_ref = std::max(max_ref, std::fabs(ref[i]));
  }
  const double rel = max_diff / std::max(max_ref, 1e-30);
  std::printf("  [max rel err] %-40s %.3e\n", what, rel);
  ::testing::Test::RecordProperty(what, std::to_string(rel));
  return rel;
}

inline double max_rel_err(const std::vector<float>& got, const std::vector<float>& ref, const char* what) {
  return max_rel_err(got, to_double(ref), what);
}

}  // namespace moeserve::testing
