// Weight declarations and the sharded checkpoint loader.
//
// A model declares every tensor it needs under the hub's names with its global shape, the
// dtypes it accepts and a shard spec. The loader checks each declared tensor against the
// checkpoint (present, shape, dtype, FP8 scale shape) and hands a rank only its slice:
//   Replicated      whole tensor on every rank
//   ColumnParallel  rows [r*n/W, (r+1)*n/W) of dim 0 (q/k/v, w1/w3 under expert TP)
//   RowParallel     cols [r*n/W, (r+1)*n/W) of dim 1 (o_proj, w2 under expert TP)
//   ExpertOwned     the whole tensor, on the rank that owns the expert (EP); not loaded elsewhere
// FP8 weights carry `<name>_scale_inv` [ceil(out/bo), ceil(in/bi)] f32. Slicing an FP8
// weight slices its scales consistently; when a slice starts inside a block the local
// block size becomes gcd(block, offset % block), so every local block lies within one
// checkpoint block and dequantisation stays exact.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "io/safetensors.h"
#include "model/config_json.h"

namespace moeserve {

enum class ShardKind { Replicated, ColumnParallel, RowParallel, ExpertOwned };

struct ShardSpec {
  ShardKind kind = ShardKind::Replicated;
  int rank = 0;   // this rank's index in the split group
  int world = 1;  // ranks in the split group
  // ColumnParallel / RowParallel with replicate > 1: `world` ranks share world/replicate
  // distinct slices (rank r takes slice r / replicate). Used for KV heads when the TP
  // world exceeds the number of KV heads.
  int replicate = 1;
  bool owned = true;  // ExpertOwned: false on ranks that do not own the expert
};

struct WeightDecl {
  std::string name;
  Shape shape;                // global (checkpoint) shape
  std::vector<DType> dtypes;  // accepted checkpoint dtypes (F8_E4M3 implies a scale tensor)
  ShardSpec shard;
  int expert = -1;  // routed expert id for expert tensors (parameter counts), else -1
};

// A loaded tensor as this rank sees it (host memory; views into the mmap when possible).
struct LoadedTensor {
  Tensor tensor;     // local slice
  Tensor scale_inv;  // local scales (F32) when tensor is F8_E4M3; BF16 group scales when I32 (packed INT4)
  int block_out = 0, block_in = 0;  // packed INT4: 1, group
  LinearWeight linear() const { return LinearWeight{tensor, scale_inv, block_out, block_in}; }
};

std::string scale_name(const std::string& weight_name);  // x.weight -> x.weight_scale_inv

// Checks `decl` against the checkpoint and returns this rank's slice; throws naming the
// tensor on a missing tensor, wrong shape, wrong dtype, missing or misshaped scales, or a
// split that does not divide. `quant` supplies the FP8 block size, and for compressed-tensors
// the INT4 modules, whose weights are dequantised to F32 here (model/int4.h).
// int4_packed_experts: routed experts' INT4 weights stay packed (LinearWeight::int4()) for a
// backend with W4A16 kernels (Backend::int4_experts_packed).
LoadedTensor load_weight(const Checkpoint& ckpt, const WeightDecl& decl, const QuantizationConfig& quant,
                         bool int4_packed_experts = false);

// Slices an in-memory FP8/dense weight like load_weight does (exposed for tests).
LoadedTensor slice_weight(const std::string& name, const Tensor& full, const Tensor& full_scale, int block_out,
                          int block_in, const ShardSpec& shard);

// The shape of this rank's slice of `decl` (load_weight's result shape): dim 0 (ColumnParallel)
// or dim 1 (RowParallel) divided by world / replicate; the global shape otherwise. Throws naming
// the tensor when the split does not divide.
Shape local_shape(const WeightDecl& decl);

// MTP module tensors: `model.layers.{L+i}.*` for i < num_mtp_modules (vLLM/SGLang rule),
// L = num_layers of the main model.
bool is_mtp_tensor(int num_layers, int num_mtp_modules, const std::string& name);

}  // namespace moeserve
