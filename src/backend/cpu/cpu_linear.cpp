// Argument checks, the fp32 dot product and the dequantising linear of the CPU backend.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "core/thread_pool.h"

namespace moeserve::cpu {

void check_host(const Tensor& t, const char* op, const char* name) {
  MS_CHECK(t.defined(), "{}: {} is empty", op, name);
  MS_CHECK(t.device == Device::CPU, "{}: {} is not a host tensor", op, name);
}

void check_f32(const Tensor& t, const char* op, const char* name) {
  check_host(t, op, name);
  MS_CHECK(t.dtype == DType::F32, "{}: {} must be F32, got {}", op, name, dtype_name(t.dtype));
}

void check_i32(const Tensor& t, const char* op, const char* name) {
  check_host(t, op, name);
  MS_CHECK(t.dtype == DType::I32, "{}: {} must be I32, got {}", op, name, dtype_name(t.dtype));
}

bool is_float_dtype(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8_E4M3;
}

void check_float_weight(const Tensor& t, const char* op, const char* name, bool allow_fp8) {
  check_host(t, op, name);
  MS_CHECK(is_float_dtype(t.dtype) && (allow_fp8 || t.dtype != DType::F8_E4M3),
           "{}: {} has unsupported dtype {}", op, name, dtype_name(t.dtype));
}

int64_t cols_of(const Tensor& t) { return t.shape.empty() ? 1 : t.shape.back(); }
int64_t rows_of(const Tensor& t) {
  int64_t c = cols_of(t);
  return c ? t.numel() / c : 0;
}

// Compiled twice (AVX2+FMA and baseline x86-64); the loader picks the best for the CPU.
__attribute__((target_clones("arch=x86-64-v3", "default")))
float dot_f32(const float* a, const float* b, int64_t n) {
  // 16 lanes of partial sums: the compiler turns the inner loop into vector multiply-adds
  // without needing reassociation flags, and the error grows with n/16 instead of n.
  float acc[16] = {};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; ++k) acc[k] += a[j + k] * b[j + k];
  float tail = 0.f;
  for (; j < n; ++j) tail += a[j] * b[j];
  for (int w = 8; w >= 1; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] += acc[k + w];
  return acc[0] + tail;
}

void check_linear_weight(const LinearWeight& w, const char* op) {
  check_float_weight(w.weight, op, "weight", /*allow_fp8=*/true);
  MS_CHECK(w.weight.rank() == 2, "{}: weight must be 2-D [out, in], got {}", op,
           shape_str(w.weight.shape));
  if (!w.fp8()) {
    MS_CHECK(w.scale_inv.empty(), "{}: scale_inv given for a {} weight (only F8_E4M3 uses scales)",
             op, dtype_name(w.weight.dtype));
    return;
  }
  MS_CHECK(w.block_out > 0 && w.block_in > 0, "{}: FP8 weight needs positive block sizes, got {}x{}",
           op, w.block_out, w.block_in);
  check_f32(w.scale_inv, op, "scale_inv");
  int64_t so = (w.out_features() + w.block_out - 1) / w.block_out;
  int64_t si = (w.in_features() + w.block_in - 1) / w.block_in;
  MS_CHECK(w.scale_inv.rank() == 2 && w.scale_inv.dim(0) == so && w.scale_inv.dim(1) == si,
           "{}: scale_inv shape {} does not match weight {} with blocks {}x{} (expected [{}, {}])", op,
           shape_str(w.scale_inv.shape), shape_str(w.weight.shape), w.block_out, w.block_in, so, si);
}

void dequant_row(const LinearWeight& w, int64_t o, float* dst) {
  const int64_t in = w.in_features();
  const char* row = static_cast<const char*>(w.weight.data) + size_t(o * in) * dtype_size(w.weight.dtype);
  convert_to_f32(w.weight.dtype, row, dst, size_t(in));
  if (!w.fp8()) return;
  // Row o uses scale row o / block_out; column block c covers [c*bi, min(in, (c+1)*bi)).
  const int64_t bi = w.block_in;
  const int64_t ncb = (in + bi - 1) / bi;
  const float* s = w.scale_inv.ptr<float>() + (o / w.block_out) * ncb;
  for (int64_t c = 0; c < ncb; ++c) {
    const float sc = s[c];
    const int64_t end = std::min(in, (c + 1) * bi);
    for (int64_t j = c * bi; j < end; ++j) dst[j] *= sc;
  }
}

namespace {
constexpr int64_t kRowBlock = 16;   // output features per task (rows of W dequantised together)
constexpr int64_t kTokenTile = 32;  // tokens per tile, so a tile of x stays in cache
}  // namespace

void linear_f32(const float* x, int64_t T, const LinearWeight& w, float* out) {
  const int64_t out_f = w.out_features(), in = w.in_features();
  if (T == 0 || out_f == 0) return;
  const bool direct = w.weight.dtype == DType::F32;  // rows usable in place
  const int64_t nblocks = (out_f + kRowBlock - 1) / kRowBlock;
  ThreadPool::global().parallel_for(nblocks, [&](int64_t b0, int64_t b1) {
    std::vector<float> buf(direct ? 0 : size_t(kRowBlock * in));
    const float* rows[kRowBlock];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * kRowBlock, o1 = std::min(out_f, o0 + kRowBlock);
      for (int64_t o = o0; o < o1; ++o) {
        if (direct) {
          rows[o - o0] = w.weight.ptr<float>() + o * in;
        } else {
          float* dst = buf.data() + (o - o0) * in;
          dequant_row(w, o, dst);
          rows[o - o0] = dst;
        }
      }
      for (int64_t t0 = 0; t0 < T; t0 += kTokenTile) {
        const int64_t t1 = std::min(T, t0 + kTokenTile);
        for (int64_t o = o0; o < o1; ++o) {
          const float* wr = rows[o - o0];
          for (int64_t t = t0; t < t1; ++t) out[t * out_f + o] = dot_f32(x + t * in, wr, in);
        }
      }
    }
  });
}

}  // namespace moeserve::cpu
