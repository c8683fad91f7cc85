// Tensor-core paged causal attention for prefill (many query tokens per sequence), head_dim
// 128: flash-attention style with mma.sync m16n8k16 bf16 -> f32.
//
// Block = (sequence, tile of 64 query tokens, one query head); 4 warps, each owning 16 query
// rows. Per 64-key tile the block stages K [64][128] and V transposed, Vt [128][64], in shared
// memory (rows padded by 8 bf16 so the fragment loads are bank-conflict free), then each warp
//   S = Q K^T      (16 x 64: 8 n-tiles x 8 k-steps; Q fragments stay in registers),
//   online softmax in base 2 (scale * log2(e) folded into Q; row max/sum over the 4 lanes
//                  that share a row),
//   O += P V       (P re-packed from the S accumulators as the A operand: the FA2 layout trick).
// Decode and short queries keep the scalar split-KV kernel (k_attention.cu).
#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/linear/mma_bf16.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kD = 128, kQ = 64, kK = 64, kWarps = 4;
constexpr int kLdK = kD + 8;  // bf16 per K row in shared memory
constexpr int kLdV = kK + 8;  // bf16 per Vt row



__global__ void __launch_bounds__(kWarps * 32) attn_tc_kernel(AttnParams p, int qtiles) {
  __shared__ __align__(16) bf16 ks[kK][kLdK];
  __shared__ __align__(16) bf16 vt[kD][kLdV];

  const int seq = blockIdx.x / qtiles, qt = blockIdx.x % qtiles, h = blockIdx.y;
  const int q0 = p.query_start[seq], qlen = p.query_start[seq + 1] - q0;
  if (qt * kQ >= qlen) return;
  const int ctx = p.context_lens[seq];
  const int G = p.Hq / p.Hkv, kvh = h / G;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, tig = lane & 3;
  const float qscale = p.scale * 1.4426950408889634f;

  // This lane's two rows (g, g + 8 of the warp's 16) and their absolute positions.
  const int tok_lo = qt * kQ + warp * 16 + g, tok_hi = tok_lo + 8;
  const int pos_lo = tok_lo < qlen ? ctx - qlen + tok_lo : -1;
  const int pos_hi = tok_hi < qlen ? ctx - qlen + tok_hi : -1;

  // Q fragments (A operand, 16 x 128 = 8 k-steps): a[ks][0..3] rows (g, g+8), cols
  // ks*16 + tig*2 (+8). Loaded straight from global, scaled, rounded to bf16.
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
  const int row_stride = p.Hkv * kD;
  for (int k0 = 0; k0 < kend; k0 += kK) {
    __syncthreads();
    // Stage K rows and V transposed: 64 keys x 16 chunks of 8 dims.
    for (int i = threadIdx.x; i < kK * (kD / 8); i += blockDim.x) {
      const int kk = i >> 4, c = (i & 15) * 8, j = k0 + kk;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (j < kend) {
        const int blk = p.block_tables[int64_t(seq) * p.max_blocks_per_seq + j / p.block_size];
        const int64_t off = (int64_t(blk) * p.block_size + j % p.block_size) * row_stride + kvh * kD + c;
        kv = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.k_cache) + off));
        vv = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.v_cache) + off));
      }
      *reinterpret_cast<uint4*>(&ks[kk][c]) = kv;
      const bf16* ve = reinterpret_cast<const bf16*>(&vv);
#pragma unroll
      for (int e = 0; e < 8; ++e) vt[c + e][kk] = ve[e];
    }
    __syncthreads();
    // Skip tiles entirely above this warp's rows (causal).
    const int warp_max_pos = max(pos_lo, pos_hi);
    if (__reduce_max_sync(0xffffffffu, warp_max_pos) < k0) continue;

    float sc[kK / 8][4];
#pragma unroll
    for (int n = 0; n < kK / 8; ++n) {
      sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
#pragma unroll
      for (int s = 0; s < kD / 16; ++s) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&ks[n * 8 + g][s * 16 + tig * 2]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&ks[n * 8 + g][s * 16 + tig * 2 + 8]);
        mma16816(sc[n], qa[s], b0, b1);
      }
    }
    // Mask (causal and past kend) and the tile's row maxima.
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int n = 0; n < kK / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int key = k0 + n * 8 + tig * 2 + e;
        if (key > pos_lo || key >= kend) sc[n][e] = -INFINITY;
        if (key > pos_hi || key >= kend) sc[n][2 + e] = -INFINITY;
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
    // Rows with nothing visible yet keep m = -inf; use 0 as the reference so exp2 gives 0.
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
    // O += P V: k-step s covers keys [16 s, 16 s + 16) = S n-tiles 2s and 2s + 1.
#pragma unroll
    for (int s = 0; s < kK / 16; ++s) {
      uint32_t pa[4];
      pa[0] = pack2(sc[2 * s][0], sc[2 * s][1]);
      pa[1] = pack2(sc[2 * s][2], sc[2 * s][3]);
      pa[2] = pack2(sc[2 * s + 1][0], sc[2 * s + 1][1]);
      pa[3] = pack2(sc[2 * s + 1][2], sc[2 * s + 1][3]);
#pragma unroll
      for (int n = 0; n < kD / 8; ++n) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(&vt[n * 8 + g][s * 16 + tig * 2]);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(&vt[n * 8 + g][s * 16 + tig * 2 + 8]);
        mma16816(o[n], pa, b0, b1);
      }
    }
  }

  // Normalise and write rows g (cols tig*2, +1 of each n-tile) and g + 8.
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

bool attention_tc_supported(const AttnParams& p) { return !p.kv_fp8 && p.D == kD && p.max_query_len >= kQ; }

void launch_attention_tc(const AttnParams& p, cudaStream_t s) {
  CU_REQUIRE(p.D == kD, "attention_tc: head_dim must be 128");
  if (p.T == 0 || p.num_seqs == 0) return;
  const int qtiles = ceil_div(p.max_query_len, kQ);
  attn_tc_kernel<<<dim3(p.num_seqs * qtiles, p.Hq), kWarps * 32, 0, s>>>(p, qtiles);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kQ == limits::kAttnTcQuery);
}  // namespace moeserve::cuda
