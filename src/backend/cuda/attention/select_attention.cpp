// select_attention / select_decode_attention / select_mla.
#include "backend/cuda/attention/select_attention.h"

#include <algorithm>

#include <fmt/format.h>

namespace moeserve::cuda {

const char* AttentionKernel::id_name(Id id) {
  switch (id) {
    case kUnsupported: return "unsupported";
    case kVerify: return "attn_verify";
    case kWgmma: return "attn_wgmma";
    case kPrefill: return "attn_prefill";
    case kTc: return "attn_tc";
    case kGeneric: return "attn_generic";
    case kDecode2: return "attn_decode2";
    case kDecode1: return "attn_decode1";
    case kUnfused: return "qk_norm_rope_write_kv";
  }
  return "?";
}

std::string AttentionKernel::describe() const {
  if (id == kUnfused) {
    std::string s = std::string(name()) + "+" + id_name(then);
    if (then_splits > 1) s += fmt::format("(splits {})", then_splits);
    return s;
  }
  std::string s = name();
  if (splits > 1) s += fmt::format("(splits {})", splits);
  return s;
}

std::string MlaKernel::describe() const {
  if (id != kFlash) return name();
  std::string s = name();
  if (splits > 1) s += fmt::format("(splits {})", splits);
  if (passes > 1) s += fmt::format("(chunks of {}: {} passes)", chunk, passes);
  return s;
}

namespace {
bool pow2(int v) { return v > 0 && (v & (v - 1)) == 0; }

int clamp_splits(int splits, const AttentionOpDesc& d) {
  const size_t per_split = size_t(std::max(1, d.T)) * d.Hq * (d.D + 2) * 4;
  if (d.ws.capturing) splits = int(std::min<size_t>(size_t(splits), d.ws.attn_part / per_split));
  return std::max(splits, 1);
}
}  // namespace

AttentionKernel select_attention(const AttentionOpDesc& d, const DeviceCaps& caps, const CudaTuning& t) {
  AttentionKernel k;
  if (d.v_head_dim != 0 && d.v_head_dim != d.D) {
    k.id = AttentionKernel::kUnsupported;
    return k;
  }
  // Decode and verify steps (<= 32 query rows per sequence and kv head): the tensor-core kernel
  // that reads each sequence's KV once; splits from max_context_len (fixed per captured bucket).
  if (t.use_attention_verify && (d.D == 64 || d.D == 128) && d.Hkv > 0 && d.Hq % d.Hkv == 0 &&
      d.max_query_len >= 1 && (d.Hq / d.Hkv) * d.max_query_len <= limits::kAttnVerifyMaxRows && d.block_size > 0) {
    const int groups = d.num_seqs * d.Hkv;
    const int want = 2 * caps.num_sms / std::max(1, groups);
    k.id = AttentionKernel::kVerify;
    k.splits = clamp_splits(std::max(1, std::min({want, d.max_context_len / (8 * limits::kAttnVerifyChunk), 64})), d);
    return k;
  }
  // Split the KV range when (kv heads x query tiles) alone would not fill the GPU.
  const int group = std::max(1, d.Hq / std::max(1, d.Hkv));
  const int qtile = group >= limits::kAttnGenericRows ? 1 : limits::kAttnGenericRows / group;
  const int qtiles = ceil_div_i(std::max(1, d.max_query_len), qtile);
  const int64_t base = int64_t(d.Hkv) * d.num_seqs * qtiles;
  const int sms = caps.num_sms;
  int splits = 1;
  if (base < 8 * sms && d.max_context_len > 512) {
    splits = int(std::min<int64_t>((8 * sms + base - 1) / base, std::min(32, d.max_context_len / 64)));
    splits = clamp_splits(splits, d);
  }
  k.splits = splits;
  const bool tc_shape = !d.kv_fp8 && d.D == 128 && d.max_query_len >= limits::kAttnTcQuery;
  if (t.use_attention_tc && t.use_attention_wgmma && splits == 1 && !d.kv_fp8 && d.D == 128 &&
      d.max_query_len >= limits::kAttnWgmmaRows && d.Hkv > 0 && d.Hq % d.Hkv == 0 && pow2(d.block_size) &&
      caps.attn_wgmma)
    k.id = AttentionKernel::kWgmma;
  else if (t.use_attention_tc && t.use_attention_prefill && splits == 1 && tc_shape)
    k.id = AttentionKernel::kPrefill;
  else if (t.use_attention_tc && splits == 1 && tc_shape)
    k.id = AttentionKernel::kTc;
  else
    k.id = AttentionKernel::kGeneric;
  return k;
}

AttentionKernel select_decode_attention(const DecodeAttnOpDesc& q, const DeviceCaps& caps, const CudaTuning& t) {
  const AttentionOpDesc& a = q.attn;
  AttentionKernel k;
  if (q.fast_spec && a.T > 0 && a.T <= t.attn_decode_max_tokens && a.max_query_len == 1) {
    constexpr int kD = 128;
    const bool v1 = !a.kv_fp8 && caps.code_arch >= 900 && a.num_seqs == a.T && a.D == kD && a.Hkv > 0 &&
                    a.Hq % a.Hkv == 0 && a.Hq / a.Hkv <= limits::kDecodeRows && q.act_bf16 && q.w_bf16 &&
                    q.rope_head_dim == kD && q.rotary_dim <= kD && q.rotary_dim % 2 == 0 && q.q_width == a.Hq * kD &&
                    q.k_width == a.Hkv * kD && q.qk_T == a.T;
    const int groups = a.num_seqs * a.Hkv;
    if (t.attn_decode_version == 2 && v1 && q.rotary_dim % 16 == 0 && q.q_width <= limits::kDecode2MaxQWidth &&
        q.k_width <= 8 * 32 * limits::kDecode2Warps) {
      // About one block per SM, a power of two <= max_splits, >= 16 keys per warp per block.
      const int want = std::max(1, caps.num_sms / std::max(1, groups));
      const int cap = std::min({want, t.attn_decode_max_splits, limits::kDecode2MaxSplits});
      int s = 1;
      while (s * 2 <= cap && s * 2 * limits::kDecode2Chunk * limits::kDecode2Warps <= a.max_context_len) s *= 2;
      // 16-block clusters only when all of them fit on the device at once.
      if (s == 16 && caps.max_clusters16 < groups) s = 8;
      k.id = AttentionKernel::kDecode2, k.splits = s;
      return k;
    }
    if (v1) {
      // ~2 blocks per SM, a power of two <= 8 (portable cluster size), >= 128 keys per block.
      const int want = (2 * caps.num_sms + groups - 1) / std::max(1, groups);
      int s = 1;
      while (s * 2 <= std::min(want, limits::kDecode1MaxSplits) && s * 2 * 128 <= a.max_context_len) s *= 2;
      k.id = AttentionKernel::kDecode1, k.splits = s;
      return k;
    }
  }
  const AttentionKernel then = select_attention(a, caps, t);
  k.id = AttentionKernel::kUnfused, k.then = then.id, k.then_splits = then.splits;
  return k;
}

std::string mla_dims_problem(const MlaOpDesc& d) {
  if (d.H > 0 && d.nope >= 0 && d.R > 0 && d.R % 2 == 0 && d.R <= limits::kMlaMaxR && d.V > 0 && d.C > 0 &&
      d.C <= limits::kMlaMaxC)
    return {};
  return fmt::format("MLA dims heads={} nope={} rope={} v={} kv_lora={} are outside what the CUDA kernels take "
                     "(rope even and <= 64, kv_lora_rank <= 512; every DeepSeek-V2/V3 / Kimi-K2 checkpoint has 64 / 512)",
                     d.H, d.nope, d.R, d.V, d.C);
}

size_t mla_head_bytes(int Tc, int H, int C, int R) {
  const size_t qa = size_t(Tc) * H * (C + R) * 2, ol = size_t(Tc) * H * C * 2;
  return (qa + ol + 255) / 256 * 256;
}
size_t mla_split_bytes(int Tc, int H, int C) { return size_t(Tc) * H * (C + 2) * 4; }

MlaKernel select_mla(const MlaOpDesc& d, const DeviceCaps& caps, const CudaTuning& t) {
  MlaKernel k;
  if (!mla_dims_problem(d).empty()) {
    k.id = MlaKernel::kUnsupported;
    return k;
  }
  const int64_t T = d.T;
  const int H = d.H, C = d.C, L = C + d.R;
  // Tokens per pass: q_abs [chunk, H, L] and o_lat [chunk, H, C] (bf16) within mla_chunk_bytes.
  const size_t tok_bytes = size_t(H) * (L + C) * 2;
  const int chunk = int(std::clamp<int64_t>(int64_t(t.mla_chunk_bytes / tok_bytes), 16, std::max<int64_t>(T, 16)));
  const int qmax = d.max_query_len > 0 ? std::min<int>(d.max_query_len, chunk) : std::min<int>(int(T), chunk);
  const int row_tiles = ceil_div_i(int64_t(qmax) * H, limits::kMlaRowTile);
  // Split-KV when (sequences x row tiles) is under one CTA per SM.
  int splits = 1;
  const int64_t base = int64_t(std::max(1, d.num_seqs)) * row_tiles;
  if (T <= chunk && base < caps.num_sms && d.max_context_len >= 128)
    splits = int(std::min<int64_t>({caps.num_sms / base, ceil_div_i(d.max_context_len, 64), 128}));
  const int Tc = int(std::min<int64_t>(T, chunk));
  const size_t head = mla_head_bytes(Tc, H, C, d.R), split_bytes = mla_split_bytes(Tc, H, C);
  const size_t cap = d.ws.attn_part;
  if (splits > 1 && d.ws.capturing && cap < head + split_bytes * splits)
    splits = int(std::max<size_t>(1, (cap - std::min(head, cap)) / split_bytes));
  k.splits = std::max(splits, 1);
  k.chunk = chunk;
  k.passes = T > 0 ? ceil_div_i(T, chunk) : 0;
  return k;
}

}  // namespace moeserve::cuda
