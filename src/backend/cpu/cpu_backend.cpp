// CpuBackend: memory ops and the simple elementwise/row ops; the heavier ops live in
// cpu_linear.cpp, cpu_attention.cpp, cpu_mla.cpp and cpu_moe.cpp.
#include "backend/cpu/cpu_backend.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "core/thread_pool.h"

namespace moeserve {
namespace {

using namespace cpu;

// Rows per parallel task for cheap row-wise ops.
constexpr int64_t kRowGrain = 8;

// out = (x * (1 / sqrt(mean(x^2) + eps))) * w, in the order HF applies it in float32
// (mean of squares accumulated in double, the scale and products in fp32). x may equal out.
void rms_norm_row(const float* x, const float* w, int64_t n, float eps, float* out) {
  double ss = 0;
  for (int64_t j = 0; j < n; ++j) ss += double(x[j]) * double(x[j]);
  const float inv = 1.f / std::sqrt(float(ss / double(n)) + eps);
  for (int64_t j = 0; j < n; ++j) out[j] = w[j] * (x[j] * inv);
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::CPU; }
  std::string name() const override { return "cpu"; }
  DType activation_dtype() const override { return DType::F32; }

  Tensor alloc(DType t, const Shape& shape) override {
    for (int64_t d : shape) MS_CHECK(d >= 0, "alloc: negative dimension in {}", shape_str(shape));
    return Tensor::host(t, shape);
  }

  Tensor upload(const Tensor& host) override {
    check_host(host, "upload", "tensor");
    return host;  // already on the host: the view is the device copy
  }

  std::vector<float> download_f32(const Tensor& t) override {
    check_host(t, "download_f32", "tensor");
    return to_f32_vector(t);
  }

  void copy_from_host(Tensor& dst, const void* src, size_t bytes) override {
    check_host(dst, "copy_from_host", "dst");
    MS_CHECK(bytes == dst.nbytes(), "copy_from_host: {} bytes into a tensor of {} bytes ({} {})", bytes,
             dst.nbytes(), dtype_name(dst.dtype), shape_str(dst.shape));
    if (bytes) std::memmove(dst.data, src, bytes);
  }

  void copy_from_host_2d(Tensor& dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                         size_t rows) override {
    check_host(dst, "copy_from_host_2d", "dst");
    check_copy_2d(dst, dst_pitch, src_pitch, row_bytes, rows);
    for (size_t r = 0; r < rows && row_bytes; ++r)
      std::memmove(static_cast<char*>(dst.data) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch,
                   row_bytes);
  }

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override {
    check_float_weight(table, "embedding", "table", /*allow_fp8=*/false);
    check_i32(ids, "embedding", "ids");
    check_f32(out, "embedding", "out");
    MS_CHECK(table.rank() == 2, "embedding: table must be [V, H], got {}", shape_str(table.shape));
    const int64_t V = table.dim(0), H = table.dim(1), T = ids.numel();
    MS_CHECK(rows_of(out) == T && cols_of(out) == H, "embedding: out {} must be [{}, {}]",
             shape_str(out.shape), T, H);
    const int32_t* id = ids.ptr<int32_t>();
    for (int64_t t = 0; t < T; ++t)
      MS_CHECK(id[t] >= 0 && id[t] < V, "embedding: token id {} at position {} is outside the vocabulary [0, {})",
               id[t], t, V);
    const size_t row_bytes = size_t(H) * dtype_size(table.dtype);
    ThreadPool::global().parallel_for(T, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t)
        convert_to_f32(table.dtype, static_cast<const char*>(table.data) + size_t(id[t]) * row_bytes,
                       out.ptr<float>() + t * H, size_t(H));
    }, kRowGrain);
  }

  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    check_f32(x, "rms_norm", "x");
    check_f32(out, "rms_norm", "out");
    const int64_t H = cols_of(x), T = rows_of(x);
    const std::vector<float> w = norm_weight(weight, H, "rms_norm");
    MS_CHECK(out.numel() == x.numel() && cols_of(out) == H, "rms_norm: out {} does not match x {}",
             shape_str(out.shape), shape_str(x.shape));
    const float* xp = x.ptr<float>();
    float* op = out.ptr<float>();
    ThreadPool::global().parallel_for(T, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) rms_norm_row(xp + t * H, w.data(), H, eps, op + t * H);
    }, kRowGrain);
  }

  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out) override {
    check_f32(residual, "add_rms_norm", "residual");
    check_f32(x, "add_rms_norm", "x");
    check_f32(out, "add_rms_norm", "out");
    const int64_t H = cols_of(residual), T = rows_of(residual);
    const std::vector<float> w = norm_weight(weight, H, "add_rms_norm");
    MS_CHECK(x.numel() == residual.numel() && cols_of(x) == H && out.numel() == residual.numel() &&
                 cols_of(out) == H,
             "add_rms_norm: residual {}, x {} and out {} must have the same shape",
             shape_str(residual.shape), shape_str(x.shape), shape_str(out.shape));
    float* rp = residual.ptr<float>();
    const float* xp = x.ptr<float>();
    float* op = out.ptr<float>();
    ThreadPool::global().parallel_for(T, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        float* r = rp + t * H;
        const float* xr = xp + t * H;
        for (int64_t j = 0; j < H; ++j) r[j] += xr[j];
        rms_norm_row(r, w.data(), H, eps, op + t * H);
      }
    }, kRowGrain);
  }

  void linear(const Tensor& x, const LinearWeight& w, Tensor& out) override {
    check_f32(x, "linear", "x");
    check_f32(out, "linear", "out");
    check_linear_weight(w, "linear");
    const int64_t in = w.in_features(), out_f = w.out_features();
    MS_CHECK(cols_of(x) == in, "linear: x {} has {} features, weight {} expects {}", shape_str(x.shape),
             cols_of(x), shape_str(w.weight.shape), in);
    const int64_t T = rows_of(x);
    MS_CHECK(rows_of(out) == T && cols_of(out) == out_f, "linear: out {} must be [{}, {}]",
             shape_str(out.shape), T, out_f);
    const char* xb = static_cast<const char*>(x.data);
    const char* ob = static_cast<const char*>(out.data);
    MS_CHECK(xb + x.nbytes() <= ob || ob + out.nbytes() <= xb, "linear: x and out overlap");
    linear_f32(x.ptr<float>(), T, w, out.ptr<float>());
  }

  void row_sum_squares(const Tensor& x, Tensor& out) override {
    check_f32(x, "row_sum_squares", "x");
    check_f32(out, "row_sum_squares", "out");
    const int64_t H = cols_of(x), T = rows_of(x);
    MS_CHECK(out.numel() == T, "row_sum_squares: out {} must have {} elements", shape_str(out.shape), T);
    const float* xp = x.ptr<float>();
    float* op = out.ptr<float>();
    ThreadPool::global().parallel_for(T, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        double ss = 0;
        for (int64_t j = 0; j < H; ++j) ss += double(xp[t * H + j]) * double(xp[t * H + j]);
        op[t] = float(ss);
      }
    }, kRowGrain);
  }

  void qk_norm_rope(const QkNormRopeArgs& args) override { cpu::qk_norm_rope(args); }
  void write_kv(const Tensor& k, const Tensor& v, KVCacheLayer& kv, const AttentionMeta& meta) override {
    cpu::write_kv(k, v, kv, meta);
  }
  void attention(const AttentionArgs& args) override { cpu::attention(args); }
  void mla_rope_write_kv(const MlaArgs& args) override { cpu::mla_rope_write_kv(args); }
  void mla_attention(const MlaArgs& args) override { cpu::mla_attention(args); }
  void moe_route(const Tensor& x, const MoeWeights& moe, MoeRouting& out) override {
    cpu::moe_route(x, moe, out);
  }
  void moe_experts(const Tensor& x, const MoeWeights& moe, const MoeRouting& routing, Tensor& out) override {
    cpu::moe_experts(x, moe, routing, out);
  }

  void add(const Tensor& a, const Tensor& b, Tensor& out) override {
    check_f32(a, "add", "a");
    check_f32(b, "add", "b");
    check_f32(out, "add", "out");
    MS_CHECK(a.shape == b.shape && a.shape == out.shape, "add: shapes {}, {} and {} differ", shape_str(a.shape),
             shape_str(b.shape), shape_str(out.shape));
    const float* ap = a.ptr<float>();
    const float* bp = b.ptr<float>();
    float* op = out.ptr<float>();
    ThreadPool::global().parallel_for(a.numel(), [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) op[i] = ap[i] + bp[i];
    }, 1 << 14);
  }

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    check_f32(gate, "silu_mul", "gate");
    check_f32(up, "silu_mul", "up");
    check_f32(out, "silu_mul", "out");
    MS_CHECK(gate.shape == up.shape && gate.shape == out.shape, "silu_mul: shapes {}, {} and {} differ",
             shape_str(gate.shape), shape_str(up.shape), shape_str(out.shape));
    const float* g = gate.ptr<float>();
    const float* u = up.ptr<float>();
    float* op = out.ptr<float>();
    ThreadPool::global().parallel_for(gate.numel(), [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) op[i] = g[i] / (1.f + std::exp(-g[i])) * u[i];
    }, 1 << 14);
  }

 private:
  // A norm weight [H] of any float dtype as f32.
  static std::vector<float> norm_weight(const Tensor& weight, int64_t H, const char* op) {
    check_float_weight(weight, op, "weight", /*allow_fp8=*/false);
    MS_CHECK(weight.numel() == H, "{}: weight {} must have {} elements", op, shape_str(weight.shape), H);
    return to_f32_vector(weight);
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace moeserve
