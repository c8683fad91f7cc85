// Internal to the CPU backend: argument checks, the fp32 dot product, and the op
// implementations as free functions (cpu_backend.cpp's class forwards to them).
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/error.h"

namespace moeserve::cpu {

// ---- argument checks (throw moeserve::Error naming the op and the argument) ----
void check_host(const Tensor& t, const char* op, const char* name);
void check_f32(const Tensor& t, const char* op, const char* name);
void check_i32(const Tensor& t, const char* op, const char* name);
// A weight-like tensor: host, a float dtype (F32/BF16/F16; F8_E4M3 only if allow_fp8).
void check_float_weight(const Tensor& t, const char* op, const char* name, bool allow_fp8);
// Rows x columns of a tensor seen as a matrix [numel / last_dim, last_dim].
int64_t rows_of(const Tensor& t);
int64_t cols_of(const Tensor& t);
bool is_float_dtype(DType t);

// Sum of a[i] * b[i] in fp32 with 16 independent partial sums (vectorisable).
float dot_f32(const float* a, const float* b, int64_t n);

// Validates a LinearWeight (dtype, rank, scale shape and block sizes).
void check_linear_weight(const LinearWeight& w, const char* op);
// Dequantises row o of W into dst[in] (exact: fp8 value * its block's scale).
void dequant_row(const LinearWeight& w, int64_t o, float* dst);
// out[T, out] = x[T, in] @ W^T, threads over blocks of output features. x and out must
// not overlap. Assumes check_linear_weight passed.
void linear_f32(const float* x, int64_t T, const LinearWeight& w, float* out);

// Bounds checks of a step's attention metadata against T tokens and a cache of nblocks blocks
// of bs slots (so no index an attention op takes from it can leave its buffer); returns each
// token's sequence.
std::vector<int32_t> check_attention_meta(const AttentionMeta& m, int64_t T, int64_t nblocks, int64_t bs,
                                          const char* op);

// ---- op implementations ----
void qk_norm_rope(const QkNormRopeArgs& args);
void write_kv(const Tensor& k, const Tensor& v, KVCacheLayer& kv, const AttentionMeta& meta);
void attention(const AttentionArgs& args);
void mla_rope_write_kv(const MlaArgs& args);
void mla_attention(const MlaArgs& args);
void moe_route(const Tensor& x, const MoeWeights& moe, MoeRouting& out);
void moe_experts(const Tensor& x, const MoeWeights& moe, const MoeRouting& routing, Tensor& out);

}  // namespace moeserve::cpu
