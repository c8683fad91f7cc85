// --kv-cache-dtype values (serve's flag table, generate, bench-model, plan and the executor
// parse them here, so they accept the same spellings).
//
// auto: the cache in the activation dtype (bf16 on CUDA, f32 on cpu). fp8 / fp8_e4m3: K and V
// stored as OCP e4m3 with one scale per tensor per layer, as vLLM does: stored =
// e4m3(x / scale) (saturating RNE), read = e4m3 * scale (core/fp8_e4m3.h); the scales come
// from the checkpoint or are 1.0 (model/kv_scales.h). fp8_e5m2 is refused: no kernel here
// stores e5m2.
#pragma once
#include <string>
#include <vector>

#include "core/dtype.h"

namespace moeserve {

enum class KvCacheDtype { Auto, Fp8E4M3 };

// "auto" | "fp8" | "fp8_e4m3"; throws moeserve::Error naming the flag for anything else.
KvCacheDtype parse_kv_cache_dtype(const std::string& s);
// The cache tensors' dtype: `activation` for Auto, F8_E4M3 for fp8.
DType kv_cache_storage_dtype(KvCacheDtype d, DType activation);
// The accepted values, in the order --help lists them.
const std::vector<std::string>& kv_cache_dtype_values();

}  // namespace moeserve
