// Helpers for the CUDA op tests: random host data, device upload in a given dtype, FP8
// block-scaled weights, and the normalised error ||out - ref|| / ||ref||.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/common/event_timer.h"
#include "core/dtype.h"
#include "core/error.h"

namespace moeserve::test {

#define SKIP_WITHOUT_GPU()                                          \
  do {                                                              \
    if (::moeserve::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

inline CudaBackend& gpu() {
  static std::unique_ptr<CudaBackend> b = make_cuda_backend(0);
  return *b;
}

// Median of `reps` CUDA-event timings (ms) of f on the test backend's stream, after one
// untimed warm-up call (the bench cases: old path vs new).
inline double event_median_ms(const std::function<void()>& f, int reps = 7) {
  f();
  gpu().synchronize();
  return cuda::EventTimer(gpu().stream()).median_ms(reps, f);
}

// Random normal values, rounded to bf16 when `bf16_exact` so the host reference sees the same inputs.
inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.f, bool bf16_exact = true) {
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = d(rng);
    if (bf16_exact) x = bf16_to_f32(f32_to_bf16(x));
  }
  return v;
}

inline Tensor to_device(const std::vector<float>& v, DType t, const Shape& shape) {
  Tensor h = Tensor::host(t, shape);
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t) {
      case DType::F32: h.ptr<float>()[i] = v[i]; break;
      case DType::BF16: h.ptr<uint16_t>()[i] = f32_to_bf16(v[i]); break;
      case DType::I32: h.ptr<int32_t>()[i] = int32_t(v[i]); break;
      default: ADD_FAILURE() << "to_device: unsupported dtype";
    }
  }
  return gpu().upload(h);
}
// Host tensors (inputs of the CPU reference backend).
inline Tensor host_f32(const std::vector<float>& v, const Shape& s) {
  Tensor t = Tensor::host(DType::F32, s);
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}
inline Tensor host_i32(const std::vector<int32_t>& v, const Shape& s) {
  Tensor t = Tensor::host(DType::I32, s);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}
inline Tensor ints_to_device(const std::vector<int32_t>& v, const Shape& shape) {
  Tensor h = Tensor::host(DType::I32, shape);
  std::copy(v.begin(), v.end(), h.ptr<int32_t>());
  return gpu().upload(h);
}

// A device weight [N, K] (FP8 with random block scales, or BF16) and its exact host dequantisation.
struct HostWeight {
  LinearWeight dev;
  std::vector<float> deq;  // [N, K]
};
inline HostWeight make_weight(int N, int K, bool fp8, std::mt19937& rng, int bo = 128, int bi = 128) {
  HostWeight w;
  w.deq.resize(size_t(N) * K);
  if (fp8) {
    const int so = (N + bo - 1) / bo, si = (K + bi - 1) / bi;
    std::uniform_real_distribution<float> us(0.5f, 1.5f);
    std::vector<float> scale(size_t(so) * si);
    for (auto& s : scale) s = us(rng) / 64.f;  // weights ~ N(0, 1) * 1/64
    std::normal_distribution<float> d(0.f, 1.f);
    Tensor hw = Tensor::host(DType::F8_E4M3, {N, K});
    for (int n = 0; n < N; ++n)
      for (int k = 0; k < K; ++k) {
        const uint8_t b = f32_to_fp8_e4m3(d(rng));
        hw.ptr<uint8_t>()[size_t(n) * K + k] = b;
        w.deq[size_t(n) * K + k] = fp8_e4m3_to_f32(b) * scale[size_t(n / bo) * si + k / bi];
      }
    w.dev.weight = gpu().upload(hw);
    w.dev.scale_inv = to_device(scale, DType::F32, {so, si});
    w.dev.block_out = bo;
    w.dev.block_in = bi;
  } else {
    w.deq = randn(size_t(N) * K, rng, 1.f / 64.f);
    w.dev.weight = to_device(w.deq, DType::BF16, {N, K});
  }
  return w;
}

// E random FP8 experts (w1, w3 [I, H], w2 [H, I], 128 x 128 blocks) appended to `dev` (device)
// and to `host` as f32 copies of their exact dequantisation (the CPU op's weights).
inline void add_random_experts(int E, int H, int I, std::mt19937& rng, MoeWeights& dev, MoeWeights& host) {
  auto host_copy = [](const HostWeight& hw, int N, int K) {
    LinearWeight h;
    h.weight = Tensor::host(DType::F32, {N, K});
    std::copy(hw.deq.begin(), hw.deq.end(), h.weight.ptr<float>());
    return h;
  };
  for (int e = 0; e < E; ++e) {
    const HostWeight w1 = make_weight(I, H, true, rng), w3 = make_weight(I, H, true, rng), w2 = make_weight(H, I, true, rng);
    dev.experts.push_back({w1.dev, w3.dev, w2.dev});
    host.experts.push_back({host_copy(w1, I, H), host_copy(w3, I, H), host_copy(w2, H, I)});
  }
}

// A device-random FP8 weight [N, K] with 128 x 128 block scales (the benches: values unchecked).
inline LinearWeight rand_fp8(int N, int K, uint64_t seed) {
  LinearWeight w;
  w.weight = gpu().alloc(DType::F8_E4M3, {N, K});
  w.scale_inv = gpu().alloc(DType::F32, {(N + 127) / 128, (K + 127) / 128});
  gpu().fill_random(w.weight, seed, 1.f);
  gpu().fill_random(w.scale_inv, seed + 1, 1.f / 64);
  w.block_out = w.block_in = 128;
  return w;
}

// One causal prefill of T tokens (the benches): device-random q [T, Hq * D] and a paged bf16
// KV cache of `bs`-token blocks in shuffled order holding the T keys.
struct PagedPrefill {
  Tensor q;
  KVCacheLayer kv;
  AttentionMeta meta;
};
inline PagedPrefill make_paged_prefill(int T, int Hq, int Hkv, int D, int bs) {
  CudaBackend& b = gpu();
  const int nb = (T + bs - 1) / bs;
  PagedPrefill r;
  r.q = b.alloc(DType::BF16, {T, Hq * D});
  b.fill_random(r.q, 31, 1.f);
  r.kv = {b.alloc(DType::BF16, {nb, bs, Hkv, D}), b.alloc(DType::BF16, {nb, bs, Hkv, D})};
  b.fill_random(r.kv.k, 32, 1.f);
  b.fill_random(r.kv.v, 33, 1.f);
  std::vector<int32_t> table(nb);
  for (int i = 0; i < nb; ++i) table[i] = i;
  std::shuffle(table.begin(), table.end(), std::mt19937(1));
  AttentionMeta& m = r.meta;
  m.num_seqs = 1, m.num_tokens = T, m.block_size = bs, m.max_blocks_per_seq = nb;
  m.max_query_len = T, m.max_context_len = T;
  m.query_start = ints_to_device({0, T}, {2});
  m.context_lens = ints_to_device({T}, {1});
  m.block_tables = ints_to_device(table, {1, nb});
  return r;
}

inline double rel_err(const std::vector<float>& out, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(out[i]) - ref[i];
    if (!std::isfinite(out[i])) return INFINITY;
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// Host reference y [T, N] = x [T, K] @ W^T.
inline std::vector<float> ref_linear(const std::vector<float>& x, const std::vector<float>& w, int T, int N, int K) {
  std::vector<float> y(size_t(T) * N);
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double acc = 0;
      const float* xr = &x[size_t(t) * K];
      const float* wr = &w[size_t(n) * K];
      for (int k = 0; k < K; ++k) acc += double(xr[k]) * wr[k];
      y[size_t(t) * N + n] = float(acc);
    }
  return y;
}

}  // namespace moeserve::test
