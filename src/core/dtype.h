// Element types and exact scalar conversions.
// bf16/f16/fp8 values are stored as raw bit patterns (uint16_t / uint8_t); conversions
// to f32 are exact; conversions from f32 round to nearest, ties to even.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace moeserve {

enum class DType : uint8_t { F32, F16, BF16, F8_E4M3, I32, I64, U8, BOOL };

size_t dtype_size(DType t);
// Name as safetensors writes it ("F32", "BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype name; returns false for unknown names.
bool parse_dtype(std::string_view name, DType* out);

float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float x);  // RNE; NaN stays NaN (quiet), Inf stays Inf
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float x);  // RNE, overflow to Inf
// OCP FP8 E4M3 ("e4m3fn"): bias 7, no infinities, S.1111.111 is NaN, max finite 448.
float fp8_e4m3_to_f32(uint8_t bits);
// RNE with saturation to +-448 (what FP8 quantisers do); NaN -> 0x7F.
uint8_t f32_to_fp8_e4m3(float x);

// Converts n elements of type `src_type` at `src` to f32.
void convert_to_f32(DType src_type, const void* src, float* dst, size_t n);

}  // namespace moeserve
