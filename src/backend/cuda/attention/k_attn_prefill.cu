// Pipelined tensor-core causal attention for prefill, head_dim 128 (replaces k_attn_tc.cu on
// the prefill path; that kernel stays as the fallback / comparison).
//
// Block = (query head, tile of 64 query tokens of one sequence); 4 warps, each owning 16 query
// rows. Keys are walked in tiles of 64. Differences from k_attn_tc.cu:
// - K and V tiles travel global -> shared with cp.async, double-buffered: the next tile's
//   copy overlaps this tile's math (the old kernel loaded, waited, then computed).
// - V stays in its natural [key][dim] layout; the P.V B-operand fragments come from
//   ldmatrix.x4.trans (the old kernel transposed V with 2-byte shared stores).
// - Rows are padded to 136 bf16 (272 B): the 32-bit K fragment loads and the 16-byte
//   ldmatrix rows of each phase hit distinct banks.
// - Grid order: heads fastest (the 6 query heads of one KV head run side by side and share
//   K/V through L2), query tiles last-first (the causal diagonal makes late tiles longest).
// Math per tile as before: S = Q K^T (scale * log2 e folded into Q), online softmax in base 2,
// O += P V with P re-packed from the S accumulators as the A operand.
#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/linear/mma_bf16.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kD = 128, kQ = 64, kK = 64, kWarps = 4, kThreads = kWarps * 32;
constexpr int kLd = kD + 8;                     // bf16 per shared row
constexpr int kTileElems = kK * kLd;            // one K or V tile
constexpr int kSmemBytes = 2 * 2 * kTileElems * 2;  // 2 stages x (K, V) = 69,632 B


__global__ void __launch_bounds__(kThreads) attn_prefill_kernel(AttnParams p, int qtiles) {
  extern __shared__ __align__(16) bf16 smem[];
  const int h = blockIdx.x;
  const int tile_id = blockIdx.y;
  const int seq = tile_id / qtiles, qt = qtiles - 1 - tile_id % qtiles;
  const int q0 = p.query_start[seq], qlen = p.query_start[seq + 1] - q0;
  if (qt * kQ >= qlen) return;
  const int ctx = p.context_lens[seq];
  const int kvh = h / (p.Hq / p.Hkv);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tig = lane & 3;
  const float qscale = p.scale * 1.4426950408889634f;

  const int tok_lo = qt * kQ + warp * 16 + g, tok_hi = tok_lo + 8;
  const int pos_lo = tok_lo < qlen ? ctx - qlen + tok_lo : -1;
  const int pos_hi = tok_hi < qlen ? ctx - qlen + tok_hi : -1;

  uint32_t qa[kD / 16][4];
  {
    const bf16* qb = static_cast<const bf16*>(p.q);
    auto ld = [&](int tok, int col) -> uint32_t {
      if (tok >= qlen) return 0u;
      const uint32_t raw = *reinterpret_cast<const uint32_t*>(qb + (int64_t(q0 + tok) * p.Hq + h) * kD + col);
      const float2 f = bf16x2_to_f2(raw);
      return pack2(f.x * qscale, f.y * qscale);
    };
#pragma unroll
    for (int s = 0; s < kD / 16; ++s) {
      qa[s][0] = ld(tok_lo, s * 16 + tig * 2);
      qa[s][1] = ld(tok_hi, s * 16 + tig * 2);
      qa[s][2] = ld(tok_lo, s * 16 + tig * 2 + 8);
      qa[s][3] = ld(tok_hi, s * 16 + tig * 2 + 8);
    }
  }

  float o[kD / 8][4];
#pragma unroll
  for (int i = 0; i < kD / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;

  const int last_tok = min(qlen, (qt + 1) * kQ) - 1;
  const int kend = ctx - qlen + last_tok + 1;  // keys [0, kend) are visible to some row
  const int ntiles = (kend + kK - 1) / kK;
  const int row_stride = p.Hkv * kD;
  const bf16* kc = static_cast<const bf16*>(p.k_cache) + kvh * kD;
  const bf16* vc = static_cast<const bf16*>(p.v_cache) + kvh * kD;
  const int32_t* table = p.block_tables + int64_t(seq) * p.max_blocks_per_seq;
  // Copy assignment: chunk (key, 16-byte column c) = (tid / 16 + 8 j, tid % 16), j = 0..7.
  const int c16 = (tid & 15) * 8;
  auto load_tile = [&](int stage, int k0) {
    bf16* ks = smem + stage * 2 * kTileElems;
    bf16* vs = ks + kTileElems;
#pragma unroll
    for (int j = 0; j < kK / 8; ++j) {
      const int kk = (tid >> 4) + 8 * j, key = k0 + kk;
      const bool ok = key < kend;
      int64_t off = 0;
      if (ok) off = (int64_t(table[key / p.block_size]) * p.block_size + key % p.block_size) * row_stride + c16;
      cp_async16(ks + kk * kLd + c16, kc + off, ok);
      cp_async16(vs + kk * kLd + c16, vc + off, ok);
    }
  };

  const int warp_max_pos = __reduce_max_sync(0xffffffffu, max(pos_lo, pos_hi));
  load_tile(0, 0);
  asm volatile("cp.async.commit_group;\n" ::);
  for (int t = 0; t < ntiles; ++t) {
    const int k0 = t * kK;
    if (t + 1 < ntiles) load_tile((t + 1) & 1, k0 + kK);
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 1;\n" ::);
    __syncthreads();
    const bf16* ks = smem + (t & 1) * 2 * kTileElems;
    const bf16* vs = ks + kTileElems;
    if (warp_max_pos >= k0) {  // else every row of this warp is above the tile (causal)
      float sc[kK / 8][4];
#pragma unroll
      for (int n = 0; n < kK / 8; ++n) {
        sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
        for (int s = 0; s < kD / 16; ++s) {
          const bf16* kr = ks + (n * 8 + g) * kLd + s * 16 + tig * 2;
          mma16816(sc[n], qa[s], *reinterpret_cast<const uint32_t*>(kr), *reinterpret_cast<const uint32_t*>(kr + 8));
        }
      }
      float mx_lo = -INFINITY, mx_hi = -INFINITY;
      const bool need_mask = k0 + kK - 1 > min(pos_lo < 0 ? INT_MAX : pos_lo, pos_hi < 0 ? INT_MAX : pos_hi) ||
                             k0 + kK > kend || pos_lo < 0 || pos_hi < 0;
#pragma unroll
      for (int n = 0; n < kK / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          if (need_mask) {
            const int key = k0 + n * 8 + tig * 2 + e;
            if (key > pos_lo || key >= kend) sc[n][e] = -INFINITY;
            if (key > pos_hi || key >= kend) sc[n][2 + e] = -INFINITY;
          }
          mx_lo = fmaxf(mx_lo, sc[n][e]);
          mx_hi = fmaxf(mx_hi, sc[n][2 + e]);
        }
      }
#pragma unroll
      for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, o2));
        mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, o2));
      }
      const float mn_lo = fmaxf(m_lo, mx_lo), mn_hi = fmaxf(m_hi, mx_hi);
      const float ref_lo = mn_lo == -INFINITY ? 0.f : mn_lo, ref_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
      const float corr_lo = exp2f(m_lo - ref_lo), corr_hi = exp2f(m_hi - ref_hi);
      m_lo = mn_lo, m_hi = mn_hi;
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int n = 0; n < kK / 8; ++n) {
        sc[n][0] = exp2f(sc[n][0] - ref_lo);
        sc[n][1] = exp2f(sc[n][1] - ref_lo);
        sc[n][2] = exp2f(sc[n][2] - ref_hi);
        sc[n][3] = exp2f(sc[n][3] - ref_hi);
        sum_lo += sc[n][0] + sc[n][1];
        sum_hi += sc[n][2] + sc[n][3];
      }
#pragma unroll
      for (int o2 = 1; o2 <= 2; o2 <<= 1) {
        sum_lo += __shfl_xor_sync(0xffffffffu, sum_lo, o2);
        sum_hi += __shfl_xor_sync(0xffffffffu, sum_hi, o2);
      }
      l_lo = l_lo * corr_lo + sum_lo;
      l_hi = l_hi * corr_hi + sum_hi;
#pragma unroll
      for (int i = 0; i < kD / 8; ++i) {
        o[i][0] *= corr_lo, o[i][1] *= corr_lo;
        o[i][2] *= corr_hi, o[i][3] *= corr_hi;
      }
      // O += P V: k-step s covers keys [16 s, 16 s + 16); ldmatrix.x4.trans gives the B
      // fragments of dim tiles n and n + 1: lane l addresses key 16 s + 8 (m & 1) + l % 8,
      // dims 8 (n + (m >> 1)) with m = l / 8.
      const int m = lane >> 3;
#pragma unroll
      for (int s = 0; s < kK / 16; ++s) {
        uint32_t pa[4];
        pa[0] = pack2(sc[2 * s][0], sc[2 * s][1]);
        pa[1] = pack2(sc[2 * s][2], sc[2 * s][3]);
        pa[2] = pack2(sc[2 * s + 1][0], sc[2 * s + 1][1]);
        pa[3] = pack2(sc[2 * s + 1][2], sc[2 * s + 1][3]);
        const bf16* vrow = vs + (s * 16 + (m & 1) * 8 + (lane & 7)) * kLd + (m >> 1) * 8;
#pragma unroll
        for (int n = 0; n < kD / 8; n += 2) {
          uint32_t b[4];
          ldsm_x4_trans(b, vrow + n * 8);
          mma16816(o[n], pa, b[0], b[1]);
          mma16816(o[n + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's copy overwrites this stage
  }
  asm volatile("cp.async.wait_group 0;\n" ::);

  bf16* out = static_cast<bf16*>(p.out);
  const float inv_lo = l_lo > 0.f ? 1.f / l_lo : 0.f, inv_hi = l_hi > 0.f ? 1.f / l_hi : 0.f;
#pragma unroll
  for (int n = 0; n < kD / 8; ++n) {
    const int col = n * 8 + tig * 2;
    if (pos_lo >= 0)
      *reinterpret_cast<uint32_t*>(out + (int64_t(q0 + tok_lo) * p.Hq + h) * kD + col) =
          pack2(o[n][0] * inv_lo, o[n][1] * inv_lo);
    if (pos_hi >= 0)
      *reinterpret_cast<uint32_t*>(out + (int64_t(q0 + tok_hi) * p.Hq + h) * kD + col) =
          pack2(o[n][2] * inv_hi, o[n][3] * inv_hi);
  }
}

}  // namespace

bool attention_prefill_supported(const AttnParams& p) { return !p.kv_fp8 && p.D == kD && p.max_query_len >= kQ; }

void launch_attention_prefill(const AttnParams& p, cudaStream_t s) {
  CU_REQUIRE(p.D == kD, "attention_prefill: head_dim must be 128");
  if (p.T == 0 || p.num_seqs == 0) return;
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(attn_prefill_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    attr_set = true;
  }
  const int qtiles = ceil_div(p.max_query_len, kQ);
  attn_prefill_kernel<<<dim3(p.Hq, p.num_seqs * qtiles), kThreads, kSmemBytes, s>>>(p, qtiles);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kQ == limits::kAttnTcQuery);
}  // namespace moeserve::cuda
