#include "tools/random_weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/int4.h"

namespace moeserve::tools {
namespace {

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t name_hash(const std::string& s) {  // FNV-1a
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

bool accepts(const WeightDecl& d, DType t) {
  for (DType x : d.dtypes)
    if (x == t) return true;
  return false;
}

// Fills n values of `t` with mean + sd * N(0,1): 64Ki-element chunks, each from its own
// splitmix64 stream (seed, chunk), so the result does not depend on the thread count.
void fill_normal(Tensor& t, uint64_t seed, float mean, float sd) {
  MS_CHECK(t.dtype == DType::F32 || t.dtype == DType::BF16 || t.dtype == DType::F16 || t.dtype == DType::F8_E4M3,
           "random weights: dtype {} is not generated", dtype_name(t.dtype));
  const int64_t n = t.numel(), chunk = int64_t(1) << 16;
  ThreadPool::global().parallel_for((n + chunk - 1) / chunk, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      uint64_t st = seed ^ (uint64_t(c) * 0xD1B54A32D192ED03ull);
      const int64_t b = c * chunk, e = std::min(n, b + chunk);
      for (int64_t i = b; i < e; i += 2) {
        // Box-Muller: two normals from two uniforms in (0, 1].
        const double u1 = (double(splitmix64(st) >> 11) + 1.0) * 0x1.0p-53;
        const double u2 = double(splitmix64(st) >> 11) * 0x1.0p-53;
        const double r = std::sqrt(-2.0 * std::log(u1));
        const float z[2] = {float(r * std::cos(2 * M_PI * u2)), float(r * std::sin(2 * M_PI * u2))};
        for (int k = 0; k < 2 && i + k < e; ++k) {
          const float v = mean + sd * z[k];
          switch (t.dtype) {
            case DType::F32: t.ptr<float>()[i + k] = v; break;
            case DType::BF16: static_cast<uint16_t*>(t.data)[i + k] = f32_to_bf16(v); break;
            case DType::F16: static_cast<uint16_t*>(t.data)[i + k] = f32_to_f16(v); break;
            case DType::F8_E4M3: static_cast<uint8_t*>(t.data)[i + k] = f32_to_fp8_e4m3(v); break;
            default: break;  // checked above
          }
        }
      }
    }
  });
}

}  // namespace

WeightSource random_weight_source(const ModelDesc& desc, const RandomWeightOptions& o) {
  const QuantizationConfig q = desc.quantization;
  return [q, o](const WeightDecl& d) -> LoadedTensor {
    LoadedTensor lt;
    if (d.name == "lm_head.weight" && !o.lm_head) return lt;
    const Shape shape = local_shape(d);
    const bool matrix = shape.size() == 2;
    const bool fp8 = matrix && q.enabled() && q.block_out > 0 && q.block_in > 0 && accepts(d, DType::F8_E4M3);
    const DType dt = fp8 ? DType::F8_E4M3 : accepts(d, DType::BF16) ? DType::BF16 : d.dtypes.at(0);
    const uint64_t seed = o.seed ^ name_hash(d.name) ^ (uint64_t(d.shard.rank / std::max(1, d.shard.replicate)) << 48);
    if (!(o.int4_packed_experts && d.expert >= 0 && int4_group(q, d) > 0)) lt.tensor = Tensor::host(dt, shape);
    const bool norm = d.name.find("norm") != std::string::npos;
    const bool embed = d.name.find("embed_tokens") != std::string::npos;
    // Global fan-in (dim 1 of the declared shape): row-parallel slices sum to unit scale.
    const float sd = !matrix ? (norm ? 0.1f : 0.01f) : embed ? 1.f : 1.f / std::sqrt(float(d.shape.at(1)));
    if (const int group = o.int4_packed_experts && d.expert >= 0 ? int4_group(q, d) : 0; group > 0) {
      // Packed INT4 (model/int4.h layout): random 32-bit words = 8 uniform nibbles each.
      lt.tensor = Tensor::host(DType::I32, {shape[0], shape[1] / 8});
      const int64_t n = lt.tensor.numel(), chunk = int64_t(1) << 16;
      uint32_t* w = static_cast<uint32_t*>(lt.tensor.data);
      ThreadPool::global().parallel_for((n + chunk - 1) / chunk, [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          uint64_t st = seed ^ (uint64_t(c) * 0xD1B54A32D192ED03ull);
          for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) w[i] = uint32_t(splitmix64(st));
        }
      });
      lt.scale_inv = Tensor::host(DType::BF16, {shape[0], shape[1] / group});
      const uint16_t s = f32_to_bf16(sd / std::sqrt(5.25f));
      std::fill_n(static_cast<uint16_t*>(lt.scale_inv.data), lt.scale_inv.numel(), s);
      lt.block_out = 1, lt.block_in = group;
    } else if (fp8) {
      // N(0,1) in E4M3 (|z| < 448), the 1/sqrt(fan-in) in the block scales.
      fill_normal(lt.tensor, seed, 0.f, 1.f);
      lt.block_out = q.block_out;
      lt.block_in = q.block_in;
      lt.scale_inv = Tensor::host(DType::F32, {(shape[0] + q.block_out - 1) / q.block_out,
                                               (shape[1] + q.block_in - 1) / q.block_in});
      float* s = lt.scale_inv.ptr<float>();
      for (int64_t i = 0; i < lt.scale_inv.numel(); ++i) s[i] = sd;
    } else {
      fill_normal(lt.tensor, seed, !matrix && norm ? 1.f : 0.f, sd);
    }
    return lt;
  };
}

int64_t load_random_weights(Model& model, const RandomWeightOptions& o) {
  std::atomic<int64_t> bytes{0};
  const WeightSource gen = random_weight_source(model.desc(), o);
  model.load_from([&](const WeightDecl& d) {
    LoadedTensor t = gen(d);
    if (t.tensor.defined()) bytes += int64_t(t.tensor.nbytes());
    if (t.scale_inv.defined()) bytes += int64_t(t.scale_inv.nbytes());
    return t;
  });
  return bytes.load();
}

}  // namespace moeserve::tools
