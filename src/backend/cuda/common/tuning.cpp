// CudaTuning::validate / apply_debug_flags and the named device profiles.
#include "backend/cuda/common/tuning.h"

#include <fmt/format.h>

#include "core/debug_flags.h"
#include "core/error.h"

namespace moeserve {

std::string CudaTuning::validate() const {
  auto bad = [](const char* field, auto v, const char* why) {
    return fmt::format("CudaTuning.{} = {}: {}", field, v, why);
  };
  auto nonneg = [&](const char* field, int v) { return v < 0 ? bad(field, v, "must be >= 0") : std::string(); };
  for (auto [f, v] : {std::pair<const char*, int>{"linear_gemv_max_tokens", linear_gemv_max_tokens},
                      {"linear_gemv_narrow_n", linear_gemv_narrow_n},
                      {"linear_gemv_tc_max_tokens", linear_gemv_tc_max_tokens},
                      {"gemv_dense_max_tokens", gemv_dense_max_tokens},
                      {"moe_gemv_max_tokens", moe_gemv_max_tokens},
                      {"moe_direct_max_tokens", moe_direct_max_tokens},
                      {"router_gemm_min_tokens", router_gemm_min_tokens},
                      {"attn_decode_max_tokens", attn_decode_max_tokens}})
    if (std::string e = nonneg(f, v); !e.empty()) return e;
  if (fp8_act_min_tokens < 1) return bad("fp8_act_min_tokens", fp8_act_min_tokens, "must be >= 1");
  if (attn_decode_version != 1 && attn_decode_version != 2)
    return bad("attn_decode_version", attn_decode_version, "must be 1 (k_attn_decode.cu) or 2 (k_attn_decode2.cu)");
  if (attn_decode_max_splits < 1 || attn_decode_max_splits > 16 ||
      (attn_decode_max_splits & (attn_decode_max_splits - 1)) != 0)
    return bad("attn_decode_max_splits", attn_decode_max_splits, "must be a power of two in 1..16");
  if (route_topk_warp < 0 || route_topk_warp > 2)
    return bad("route_topk_warp", route_topk_warp, "must be 0 (generic), 1 (64-bit shuffle) or 2 (redux.sync)");
  if (mla_chunk_bytes == 0) return bad("mla_chunk_bytes", mla_chunk_bytes, "must be > 0");
  return {};
}

void CudaTuning::apply_debug_flags(const DebugFlags& f) {
  decode_mega = f.decode_mega;
  if (f.decode_off_has("router")) fuse_router = false;
  if (f.decode_off_has("moe")) moe_direct_max_tokens = 0;
  if (f.decode_off_has("qkv")) fuse_linear_multi = false;
  if (f.decode_off_has("qk_kv")) fuse_qk_write_kv = false;
  if (f.decode_off_has("attn_decode")) attn_decode_max_tokens = 0;
  if (f.decode_off_has("dense_gemv")) gemv_dense_max_tokens = 0;
  if (f.decode_off_has("dense_norm")) fuse_norm_dense = false;
  if (f.decode_off_has("route_dense")) route_norm_dense = false;
  // MOESERVE_PREFILL_OFF: accuracy narrowing (scripts/realshape_check.py); each item names the
  // fallback it runs instead in debug_flags.cpp's table.
  if (f.prefill_off_has("fp8_act")) use_fp8_act_gemm = false;
  if (f.prefill_off_has("lt")) use_lt_fp8 = false;
  if (f.prefill_off_has("attn")) use_attention_prefill = false;
  if (f.prefill_off_has("attn_wgmma")) use_attention_wgmma = false;
  if (f.prefill_off_has("gemm_wgmma")) fp8_gemm_wgmma = false;
  if (f.prefill_off_has("router")) router_gemm_min_tokens = 0;
  if (f.prefill_off_has("router_split")) router_split_bf16 = false;
  if (f.prefill_off_has("gate_cache")) gate_split_cache = false;
  if (f.prefill_off_has("moe_nq")) prefill_moe_norm_quant = false;
  if (f.prefill_off_has("moe_quant_vec")) prefill_moe_quant_vec = false;
  if (f.prefill_off_has("topk")) route_topk_warp = 0;
  if (f.prefill_off_has("topk_redux")) route_topk_warp = 1;
  if (f.prefill_off_has("norm_quant")) prefill_norm_quant = false;
  if (f.prefill_off_has("qk_rope")) qk_rope_vec = false;
  if (f.prefill_off_has("quant_vec")) prefill_quant_vec = false;
}

DeviceCaps device_profile(const std::string& name) {
  DeviceCaps c;
  c.name = name;
  if (name == "h200") {
    c.code_arch = 900, c.sm90a = true, c.cc = 90, c.num_sms = 132;
    c.attn_wgmma = true, c.fp8_wgmma = true;
    c.sample_resident = 2 * 132;
    return c;
  }
  if (name == "sm120") {
    // The default archs (80;90a) give an sm_120 card no native code: it JIT-compiles the
    // compute_80 PTX, so only the portable (sm_80) paths exist there.
    c.code_arch = 800, c.sm90a = false, c.cc = 120, c.num_sms = 188;
    c.sample_resident = 2 * 188;  // assumed: 2 blocks of 512 threads per SM
    return c;
  }
  fail("unknown device profile '{}' (known: {})", name, device_profile_names());
}

std::string device_profile_names() { return "h200, sm120"; }

}  // namespace moeserve
