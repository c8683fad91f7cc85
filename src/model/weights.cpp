#include "model/weights.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <numeric>

#include "core/error.h"
#include "model/int4.h"

namespace moeserve {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string dtypes_str(const std::vector<DType>& ds) {
  std::string s;
  for (DType d : ds) {
    if (!s.empty()) s += "|";
    s += std::string(dtype_name(d));
  }
  return s;
}

// Columns [begin, begin + len) of a 2-D host tensor, copied.
Tensor copy_cols(const Tensor& t, int64_t begin, int64_t len) {
  Tensor out = Tensor::host(t.dtype, {t.dim(0), len});
  size_t es = dtype_size(t.dtype), row_in = size_t(t.dim(1)) * es, row_out = size_t(len) * es;
  const auto* src = static_cast<const uint8_t*>(t.data);
  auto* dst = static_cast<uint8_t*>(out.data);
  for (int64_t r = 0; r < t.dim(0); ++r) std::memcpy(dst + r * row_out, src + r * row_in + begin * es, row_out);
  return out;
}

// Local scales for a slice [begin, begin + len) along `axis` of a weight with block size
// `block` on that axis. Returns the new scale tensor and the local block size g: local
// block k covers global indices [begin + k*g, begin + (k+1)*g), all inside checkpoint
// block (begin + k*g) / block because g divides both block and begin % block.
std::pair<Tensor, int> slice_scales(const Tensor& scales, int axis, int64_t begin, int64_t len, int block) {
  int64_t off = begin % block;
  int g = off == 0 ? block : int(std::gcd(int64_t(block), off));
  int64_t nb = ceil_div(len, g);
  int64_t rows = axis == 0 ? nb : scales.dim(0), cols = axis == 0 ? scales.dim(1) : nb;
  Tensor out = Tensor::host(DType::F32, {rows, cols});
  const float* s = scales.ptr<float>();
  float* o = out.ptr<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      int64_t gr = axis == 0 ? (begin + r * g) / block : r;
      int64_t gc = axis == 1 ? (begin + c * g) / block : c;
      o[r * cols + c] = s[gr * scales.dim(1) + gc];
    }
  return {out, g};
}

}  // namespace

std::string scale_name(const std::string& weight_name) { return weight_name + "_scale_inv"; }

bool is_mtp_tensor(int num_layers, int num_mtp_modules, const std::string& name) {
  static const std::string prefix = "model.layers.";
  if (name.rfind(prefix, 0) != 0) return false;
  size_t p = prefix.size(), q = p;
  while (q < name.size() && std::isdigit(static_cast<unsigned char>(name[q]))) ++q;
  if (q == p || q - p > 9 || q >= name.size() || name[q] != '.') return false;  // 9 digits: no overflow
  long layer = std::stol(name.substr(p, q - p));
  return layer >= num_layers && layer < num_layers + num_mtp_modules;
}

LoadedTensor slice_weight(const std::string& name, const Tensor& full, const Tensor& full_scale, int block_out,
                          int block_in, const ShardSpec& shard) {
  LoadedTensor lt;
  lt.block_out = block_out;
  lt.block_in = block_in;
  const bool fp8 = full.dtype == DType::F8_E4M3;
  if (shard.kind == ShardKind::Replicated || shard.kind == ShardKind::ExpertOwned || shard.world == 1) {
    lt.tensor = full;
    lt.scale_inv = full_scale;
    return lt;
  }
  MS_CHECK(shard.replicate >= 1 && shard.world % shard.replicate == 0,
           "{}: replicate {} does not divide world {}", name, shard.replicate, shard.world);
  const int groups = shard.world / shard.replicate, slice = shard.rank / shard.replicate;
  const int axis = shard.kind == ShardKind::ColumnParallel ? 0 : 1;
  MS_CHECK(axis < full.rank(), "{}: cannot split dim {} of shape {}", name, axis, shape_str(full.shape));
  const int64_t n = full.dim(axis);
  MS_CHECK(n % groups == 0, "{}: dim {} of size {} does not split evenly over {} ranks", name, axis, n, groups);
  const int64_t len = n / groups, begin = slice * len;
  lt.tensor = axis == 0 ? full.slice_rows(begin, begin + len) : copy_cols(full, begin, len);
  if (fp8) {
    auto [s, g] = slice_scales(full_scale, axis, begin, len, axis == 0 ? block_out : block_in);
    lt.scale_inv = s;
    (axis == 0 ? lt.block_out : lt.block_in) = g;
  }
  return lt;
}

Shape local_shape(const WeightDecl& d) {
  Shape s = d.shape;
  const ShardSpec& sh = d.shard;
  if ((sh.kind != ShardKind::ColumnParallel && sh.kind != ShardKind::RowParallel) || sh.world == 1) return s;
  MS_CHECK(sh.replicate >= 1 && sh.world % sh.replicate == 0, "{}: replicate {} does not divide world {}", d.name,
           sh.replicate, sh.world);
  const int groups = sh.world / sh.replicate;
  const size_t axis = sh.kind == ShardKind::ColumnParallel ? 0 : 1;
  MS_CHECK(axis < s.size() && s[axis] % groups == 0, "{}: dim {} of shape {} does not split evenly over {} ranks",
           d.name, axis, shape_str(s), groups);
  s[axis] /= groups;
  return s;
}

LoadedTensor load_weight(const Checkpoint& ckpt, const WeightDecl& decl, const QuantizationConfig& quant,
                         bool int4_packed_experts) {
  const std::string& name = decl.name;
  // compressed-tensors INT4 modules: weight_packed / weight_scale / weight_shape instead of the
  // weight, dequantised to F32 here (model/int4.h).
  if (const int group = int4_group(quant, decl); group > 0)
    return load_int4_weight(ckpt, decl, group, int4_packed_experts && decl.expert >= 0);
  MS_CHECK(ckpt.contains(name), "checkpoint {}: missing tensor '{}' (expected shape {})", ckpt.dir(), name,
           shape_str(decl.shape));
  const TensorInfo& info = ckpt.info(name);
  MS_CHECK(info.shape == decl.shape, "tensor '{}': shape {} in {}, expected {}", name, shape_str(info.shape), info.file,
           shape_str(decl.shape));
  MS_CHECK(std::find(decl.dtypes.begin(), decl.dtypes.end(), info.dtype) != decl.dtypes.end(),
           "tensor '{}': dtype {} in {}, expected one of {}", name, dtype_name(info.dtype), info.file,
           dtypes_str(decl.dtypes));
  const bool fp8 = info.dtype == DType::F8_E4M3;
  Tensor scales;
  int bo = 0, bi = 0;
  if (fp8) {
    MS_CHECK(quant.enabled() && quant.block_out > 0 && quant.block_in > 0,
             "tensor '{}' is FP8 but config.json has no quantization_config.weight_block_size", name);
    MS_CHECK(decl.shape.size() == 2, "tensor '{}': FP8 is only supported for 2-D weights", name);
    bo = quant.block_out;
    bi = quant.block_in;
    const std::string sname = scale_name(name);
    MS_CHECK(ckpt.contains(sname), "checkpoint {}: FP8 tensor '{}' has no scale tensor '{}'", ckpt.dir(), name, sname);
    const TensorInfo& si = ckpt.info(sname);
    Shape want{ceil_div(decl.shape[0], bo), ceil_div(decl.shape[1], bi)};
    MS_CHECK(si.shape == want, "tensor '{}': scale shape {}, expected {} for weight {} with blocks [{}, {}]", sname,
             shape_str(si.shape), shape_str(want), shape_str(decl.shape), bo, bi);
    MS_CHECK(si.dtype == DType::F32 || si.dtype == DType::BF16 || si.dtype == DType::F16,
             "tensor '{}': scale dtype {} (expected F32)", sname, dtype_name(si.dtype));
  }
  if (decl.shard.kind == ShardKind::ExpertOwned && !decl.shard.owned) return {};  // validated, not loaded
  Tensor full = ckpt.get(name);
  if (fp8) {
    Tensor s = ckpt.get(scale_name(name));
    if (s.dtype != DType::F32) {
      Tensor f = Tensor::host(DType::F32, s.shape);
      convert_to_f32(s.dtype, s.data, f.ptr<float>(), size_t(s.numel()));
      s = f;
    }
    scales = s;
  }
  return slice_weight(name, full, scales, bo, bi, decl.shard);
}

}  // namespace moeserve
