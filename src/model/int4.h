// compressed-tensors `pack-quantized` INT4 weights (W4A16), as Kimi-K2 / K2.5 ship their routed
// experts. A quantised linear module M (its dense weight would be `M.weight` [out, in]) is stored as
//   M.weight_packed  I32 [out, ceil(in/8)]   element (r, 8j+i) in bits [4i, 4i+3] of word (r, j), as the
//                                            unsigned nibble q + 8 (q in [-8, 7]; padding nibbles 0)
//   M.weight_scale   BF16 [out, in/group]    symmetric, no zero point: w = q * scale
//   M.weight_shape   I32|I64 [2]             the dense shape [out, in]
// config.json's quantization_config (quant_method "compressed-tensors", format "pack-quantized")
// names the quantised modules: a module is INT4 when a config_groups entry's `targets` matches it
// and no `ignore` entry does. Entries are a class name ("Linear"), an exact module name, or
// "re:REGEX" matched at the start of the name (Python re.match). Only linear weights (the ones a
// model declares as FP8-capable, and lm_head) are candidates: embeddings, norms and the router
// (not nn.Linear in DeepSeek/Kimi code) never are.
//
// The CPU reference dequantises every INT4 weight to F32 at load (exact: a 4-bit integer times a
// bf16 scale fits a float's 24-bit mantissa) and slices it like a dense weight; a split whose
// per-rank input columns cut a quantisation group is refused (packed kernels need whole groups).
// Backends without W4A16 kernels refuse INT4 checkpoints at load (Backend::int4_weights_problem).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/config_json.h"
#include "model/weights.h"

namespace moeserve {

namespace config_json {
// quantization_config with quant_method "compressed-tensors": only 4-bit symmetric int weights
// with the group strategy (any group size), no activation / KV-cache quantisation, no act-order;
// anything else fails naming the field.
QuantizationConfig parse_compressed_tensors(const json& q);
}  // namespace config_json

// "M.weight" -> "M" ("" when the name does not end in ".weight").
std::string int4_module(const std::string& weight_name);
// Group size of module `module` under `q` (0: not INT4). `linear`: the module is an nn.Linear
// (class target "Linear" matches it). Plain names also match a module that ends in "." + name
// (so "lm_head" covers Kimi-K2.5's "language_model.lm_head").
int int4_group(const QuantizationConfig& q, const std::string& module, bool linear);
// The group size of a declared weight (0 when the declaration is not an INT4 module's weight).
int int4_group(const QuantizationConfig& q, const WeightDecl& d);

// int values in [-8, 7], [rows, cols] row-major -> words [rows, ceil(cols / 8)] as above.
std::vector<int32_t> pack_int4(const int8_t* q, int64_t rows, int64_t cols);
// Element (r, c) of packed words with `words_per_row` words a row, as q in [-8, 7].
inline int int4_value(const int32_t* words, int64_t words_per_row, int64_t r, int64_t c) {
  const uint32_t w = uint32_t(words[r * words_per_row + c / 8]);
  return int((w >> (4 * (c % 8))) & 0xFu) - 8;
}

// Checks the INT4 tensors of declared weight `d` (group size `group`) against the checkpoint's
// headers: "" or the problem, naming the tensor (missing, wrong dtype, wrong shape, weight_shape
// not the declared shape, a group size that does not divide the inputs).
std::string int4_tensor_problem(const Checkpoint& ckpt, const WeightDecl& d, int group);
// Validates (throwing int4_tensor_problem's message), then dequantises this rank's slice of `d`
// to F32 (only the slice is expanded). ExpertOwned weights of other ranks: validated, empty.
// packed: this rank's slice stays packed instead (I32 words [rows, cols / 8], BF16 scales
// [rows, cols / group], block_out 1, block_in group; the slice holds whole groups).
LoadedTensor load_int4_weight(const Checkpoint& ckpt, const WeightDecl& d, int group, bool packed = false);
// "" or why one rank's slice of an INT4 weight among `decls` would cut a quantisation group
// (row-parallel splits of the input dimension into slices that are not whole groups).
std::string int4_split_problem(const std::vector<WeightDecl>& decls, const QuantizationConfig& q);
// The weight_packed name of the first INT4 weight among `decls` ("" when there is none).
// skip_experts: only among weights that are not routed experts (WeightDecl::expert < 0).
std::string first_int4_tensor(const std::vector<WeightDecl>& decls, const QuantizationConfig& q,
                              bool skip_experts = false);
// Whether checkpoint tensor `name` is the weight_packed / weight_scale / weight_shape of a
// weight "M.weight" for which `is_int4_weight("M.weight")` holds.
bool is_int4_part(const std::string& name, const std::function<bool(const std::string&)>& is_int4_weight);

}  // namespace moeserve
