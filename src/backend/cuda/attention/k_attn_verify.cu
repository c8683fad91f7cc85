// Decode-like paged attention on tensor cores: every sequence of the batch carries 1..32/G
// query rows (a decode token, or a speculative verify step of 1 + k tokens, causal within the
// step; G = Hq / Hkv), over a bf16 or e4m3 KV cache. The KV of a (sequence, kv head) is read
// ONCE for all G x (1 + k) query rows of the step.
//
//   q [T, Hq, D] bf16, cache [blocks, block_size, Hkv, D] bf16 or e4m3 (K = k8 * k_scale,
//   V = v8 * v_scale), out [T, Hq, D] bf16; split partials part_o [splits, T, Hq, D] f32 and
//   part_ml [splits, T, Hq, 2] (max, sum in base 2), merged by k_attention.cu's combine kernel.
//
// * Grid (splits, kv heads, sequences), 4 warps per block. Block rows r = tok * G + h
//   (tok < qlen, h < G) are the M side of mma.sync m16n8k16 (MT = 1 or 2 tiles of 16 rows; rows
//   >= G x qlen are zero and masked). Row r sees keys <= ctx - qlen + tok.
// * The block's key range (ctx / splits, rounded to 16) is cut into 16-key chunks; warp w owns
//   chunks w, w + 4, ... and streams them through its own cp.async ring (bf16: 3 stages of 16 K
//   + 16 V rows, copied into XOR-swizzled tiles; e4m3: 4 stages of raw bytes, widened by the
//   warp into one swizzled f16 tile per chunk, exact), so the key loop has no block barrier.
// * S = Q K^T (K by ldmatrix), online softmax in base 2 with f32 state (the scale, and k_scale
//   for e4m3, applied to the f32 scores), P re-packed from the S accumulators, O += P V (V by
//   ldmatrix.trans). bf16 caches run bf16 mma; e4m3 caches run f16 mma (e4m3 -> f16 exact, q
//   bf16 -> f16 clamped to +-65504, P in f16: 3 more mantissa bits than bf16).
// * The 4 warps' partials merge in shared memory; one split writes out (x v_scale), several
//   write partials for the combine kernel. Everything variable (query starts, context lengths,
//   block tables) is read on the device, so a captured grid serves every step of its bucket.
#include <algorithm>
#include <atomic>
#include <string>
#include <type_traits>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/attention/attn_mma.cuh"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/linear/gemv_frag.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/linear/mma_fp8.cuh"
#include "backend/cuda/common/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kW = 4, kChunk = 16, kMaxRows = 32;

template <typename KvT, int D, int MT>
struct VerifyCfg {
  static constexpr bool kFp8 = std::is_same_v<KvT, uint8_t>;
  static constexpr int kStages = kFp8 ? 4 : 3;
  static constexpr int kRows = 16 * MT;
  static constexpr int kQStride = D + 8;  // 16-bit elements; +8: conflict-free ldmatrix rows
  static constexpr int kQBytes = kRows * kQStride * 2;
  static constexpr int kStageBytes = 2 * kChunk * D * int(sizeof(KvT));  // K rows then V rows
  static constexpr int kTileBytes = kFp8 ? 2 * kChunk * D * 2 : 0;         // widened K, V (f16)
  static constexpr int kPartBytes = kRows * D * 4;  // the warp's partial O after the key loop
  static constexpr int kLoopBytes = kStages * kStageBytes + kTileBytes;
  static constexpr int kWarpBytes = kLoopBytes > kPartBytes ? kLoopBytes : kPartBytes;
  static constexpr int kSmem = kQBytes + kW * kWarpBytes + kW * kRows * 2 * 4 + kRows * (kW + 2) * 4;
};

template <bool F16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (F16) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

template <typename KvT, int D, int MT>
__global__ void __launch_bounds__(kW * 32, 2) attn_verify_kernel(AttnParams p) {
  using C = VerifyCfg<KvT, D, MT>;
  constexpr bool kFp8 = C::kFp8;
  constexpr int kRows = C::kRows, kStages = C::kStages;
  extern __shared__ __align__(128) unsigned char smem[];
  uint16_t* qb = reinterpret_cast<uint16_t*>(smem);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t4 = lane & 3;
  unsigned char* wreg = smem + C::kQBytes + warp * C::kWarpBytes;
  float* pml = reinterpret_cast<float*>(smem + C::kQBytes + kW * C::kWarpBytes);  // [kW][kRows][2]
  float* fac = pml + kW * kRows * 2;                                                // [kRows][kW]
  float* mlb = fac + kRows * kW;                                                    // [kRows][2]
  const int split = blockIdx.x, splits = gridDim.x, kvh = blockIdx.y, seq = blockIdx.z;

  // Step metadata and the K/V of earlier positions are read before the PDL wait (as the fused
  // decode kernels do: uploaded before the step's first kernel, written by no kernel of the
  // step); the step's own qlen K/V rows (written by the kernel before) and q after it.
  const int q0 = p.query_start[seq], qlen = p.query_start[seq + 1] - q0;
  if (qlen <= 0) {  // a padding sequence of a graph bucket
    pdl_enter();
    return;
  }
  const int ctx = p.context_lens[seq];
  const int G = p.Hq / p.Hkv, R = G * qlen;
  const int span = (ctx + splits - 1) / splits;
  const int kbeg = split * ((span + kChunk - 1) / kChunk * kChunk);
  const int kend = min(ctx, kbeg + (span + kChunk - 1) / kChunk * kChunk);
  const int nchunks = kend > kbeg ? (kend - kbeg + kChunk - 1) / kChunk : 0;
  const int my_chunks = nchunks > warp ? (nchunks - warp + kW - 1) / kW : 0;
  const int32_t* btab = p.block_tables + int64_t(seq) * p.max_blocks_per_seq;
  const int row_stride = p.Hkv * D;

  // Issues the copies of the warp's i-th chunk into stage i % kStages (always commits, so the
  // wait counts stay uniform). Lane l < 16 resolves the cache row of key l; keys >= kend are
  // zero-filled (P = 0 there, and 0 x garbage could be NaN).
  constexpr int kCpr = D * int(sizeof(KvT)) / 16;  // 16-byte copies per row
  auto issue = [&](int i) {
    if (i < my_chunks) {
      const int k0 = kbeg + (warp + i * kW) * kChunk;
      int prow = -1;
      if (lane < kChunk && k0 + lane < kend) {
        const int j = k0 + lane;
        prow = btab[j / p.block_size] * p.block_size + j % p.block_size;
      }
      unsigned char* st = wreg + (i % kStages) * C::kStageBytes;
#pragma unroll
      for (int r = 0; r < kChunk * kCpr / 32; ++r) {
        const int c = lane + 32 * r, row = c / kCpr, col = c % kCpr;
        const int pr = __shfl_sync(0xffffffffu, prow, row);
        const int64_t off = (int64_t(max(pr, 0)) * row_stride + kvh * D) * int(sizeof(KvT)) + col * 16;
        // bf16: straight into the swizzled tile; e4m3: raw rows (widened below).
        const int dst = kFp8 ? row * D + col * 16 : swz16<D>(row, col * 8) * 2;
        cp_async16(st + dst, static_cast<const unsigned char*>(p.k_cache) + off, pr >= 0);
        cp_async16(st + kChunk * D * int(sizeof(KvT)) + dst, static_cast<const unsigned char*>(p.v_cache) + off,
                   pr >= 0);
      }
    }
    cp_async_commit();
  };
  int pre = 0;  // leading chunks whose keys all precede the step's own tokens
  while (pre < kStages && (pre >= my_chunks || kbeg + (warp + pre * kW + 1) * kChunk <= ctx - qlen)) issue(pre++);
  pdl_enter();
  for (int i = pre; i < kStages; ++i) issue(i);

  // q rows of this kv head (row r: token q0 + r / G, head kvh * G + r % G), 16-bit, zero padded.
  for (int i = tid; i < kRows * (D / 8); i += kW * 32) {
    const int r = i / (D / 8), c = i % (D / 8);
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < R) {
      v = *reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.q) +
                                          (int64_t(q0 + r / G) * p.Hq + kvh * G + r % G) * D + c * 8);
      if constexpr (kFp8) v = make_uint4(bf2_to_h2(v.x), bf2_to_h2(v.y), bf2_to_h2(v.z), bf2_to_h2(v.w));
    }
    *reinterpret_cast<uint4*>(qb + r * C::kQStride + c * 8) = v;
  }
  __syncthreads();
  // A fragments of q: in registers for one m tile; two tiles re-read them from shared memory
  // per chunk (64 more registers would spill next to the 2 x 64 accumulators).
  constexpr bool kQReg = MT == 1;
  uint32_t qa[kQReg ? D / 16 : 1][4];
  auto qfrag = [&](int mt, int ks, uint32_t* a) {
    ldsm_x4(a, qb + (mt * 16 + (lane & 15)) * C::kQStride + 16 * ks + 8 * (lane >> 4));
  };
  if constexpr (kQReg) {
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) qfrag(0, ks, qa[ks]);
  }

  // Last visible key of rows g and g + 8 of each m tile (-1: padding row).
  int lim[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = mt * 16 + g + 8 * h;
      lim[mt][h] = r < R ? ctx - qlen + r / G : -1;
    }
  // log2(e): softmax in base 2; an e4m3 cache's k_scale multiplies every score.
  const float qscale = p.scale * 1.4426950408889634f * (kFp8 ? p.k_scale : 1.f);
  float o[MT][D / 8][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < D / 8; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
    m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.f;
  }

  for (int i = 0; i < my_chunks; ++i) {
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const int k0 = kbeg + (warp + i * kW) * kChunk;
    unsigned char* st = wreg + (i % kStages) * C::kStageBytes;
    const uint16_t* kb;
    const uint16_t* vb;
    if constexpr (kFp8) {
      // Widen the raw chunk (16 K rows then 16 V rows of D bytes) into the f16 tile.
      uint16_t* tile = reinterpret_cast<uint16_t*>(wreg + kStages * C::kStageBytes);
#pragma unroll
      for (int r = 0; r < 2 * kChunk * (D / 16) / 32; ++r) {
        const int c = lane + 32 * r, row = c / (D / 16), col = (c % (D / 16)) * 16;  // row 0..31: K then V
        const uint4 w = *reinterpret_cast<const uint4*>(st + row * D + col);
        const uint32_t in[4] = {w.x, w.y, w.z, w.w};
        uint32_t h[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) h[2 * e] = fp8x2_to_h2(in[e]), h[2 * e + 1] = fp8x2_to_h2(in[e] >> 16);
        uint16_t* t = tile + (row >= kChunk ? kChunk * D : 0);
        const int rr = row % kChunk;
        *reinterpret_cast<uint4*>(t + swz16<D>(rr, col)) = make_uint4(h[0], h[1], h[2], h[3]);
        *reinterpret_cast<uint4*>(t + swz16<D>(rr, col + 8)) = make_uint4(h[4], h[5], h[6], h[7]);
      }
      __syncwarp();
      issue(i + kStages);  // the raw stage is free once widened
      kb = tile, vb = tile + kChunk * D;
    } else {
      kb = reinterpret_cast<const uint16_t*>(st);
      vb = kb + kChunk * D;
    }
    // S = q K^T for the chunk's 16 keys: two n tiles of 8 keys.
    float s[MT][2][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < 2; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
    for (int kp = 0; kp < D / 32; ++kp)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        uint32_t b[4];
        ldsm_x4(b, kb + swz16<D>(8 * j + (lane & 7), 32 * kp + 8 * (lane >> 3)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t qt[4];
            const uint32_t* a = qt;
            if constexpr (kQReg) a = qa[2 * kp + h];
            else qfrag(mt, 2 * kp + h, qt);
            if constexpr (kFp8) mma_f16(s[mt][j], a, b[2 * h], b[2 * h + 1]);
            else mma_bf16(s[mt][j], a, b[2 * h], b[2 * h + 1]);
          }
        }
      }
    // Online softmax per row (rows g, g + 8 of each m tile; a row's 16 keys span the 4 t4 lanes).
    uint32_t pa[MT][4];
    float corr[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = k0 + 8 * j + 2 * t4 + e;
            float& v = s[mt][j][2 * h + e];
            v = key <= lim[mt][h] && key < kend ? v * qscale : -INFINITY;
            mx = fmaxf(mx, v);
          }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m[mt][h], mx);
        const float base = mn == -INFINITY ? 0.f : mn;  // nothing visible yet: P = 0, O stays 0
        corr[mt][h] = exp2f(m[mt][h] - base);
        m[mt][h] = mn;
        float sum = 0.f;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& v = s[mt][j][2 * h + e];
            v = exp2f(v - base);
            sum += v;
          }
        l[mt][h] = l[mt][h] * corr[mt][h] + sum;
      }
      pa[mt][0] = pack2<kFp8>(s[mt][0][0], s[mt][0][1]);
      pa[mt][1] = pack2<kFp8>(s[mt][0][2], s[mt][0][3]);
      pa[mt][2] = pack2<kFp8>(s[mt][1][0], s[mt][1][1]);
      pa[mt][3] = pack2<kFp8>(s[mt][1][2], s[mt][1][3]);
    }
    // O += P V: D / 8 n tiles of 8 dims, one k step of the chunk's 16 keys.
#pragma unroll
    for (int jp = 0; jp < D / 16; ++jp) {
      uint32_t b[4];
      ldsm_x4_trans(b, vb + swz16<D>((lane & 7) + 8 * ((lane >> 3) & 1), 16 * jp + 8 * (lane >> 4)));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          float* acc = o[mt][2 * jp + n];
          acc[0] *= corr[mt][0], acc[1] *= corr[mt][0], acc[2] *= corr[mt][1], acc[3] *= corr[mt][1];
          if constexpr (kFp8) mma_f16(acc, pa[mt], b[2 * n], b[2 * n + 1]);
          else mma_bf16(acc, pa[mt], b[2 * n], b[2 * n + 1]);
        }
      }
    }
    __syncwarp();  // every lane done with the stage / tile before it is refilled
    if constexpr (!kFp8) issue(i + kStages);
  }
  cp_async_wait<0>();
  __syncwarp();

  // ---- the warp's partial (o, m, l) per row -> shared memory (the warp's own region) ----
  float* po = reinterpret_cast<float*>(wreg);  // [kRows][D]
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float lr = l[mt][h];
      lr += __shfl_xor_sync(0xffffffffu, lr, 1);
      lr += __shfl_xor_sync(0xffffffffu, lr, 2);
      const int r = mt * 16 + g + 8 * h;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<float2*>(&po[r * D + 8 * j + 2 * t4]) = make_float2(o[mt][j][2 * h], o[mt][j][2 * h + 1]);
      if (t4 == 0) pml[(warp * kRows + r) * 2] = m[mt][h], pml[(warp * kRows + r) * 2 + 1] = lr;
    }
  __syncthreads();
  // Per (row, warp) factors 2^(m_w - M) and the block's (M, L) per row: 4 lanes per row.
  for (int i = tid; i < kRows * kW; i += kW * 32) {
    const int r = i / kW, w = i % kW;
    const float mw = pml[(w * kRows + r) * 2];
    float M = mw;
    M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 1));
    M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 2));
    const float sc = mw == -INFINITY ? 0.f : exp2f(mw - M);
    float L = pml[(w * kRows + r) * 2 + 1] * sc;
    L += __shfl_xor_sync(0xffffffffu, L, 1);
    L += __shfl_xor_sync(0xffffffffu, L, 2);
    fac[r * kW + w] = sc;
    if (w == 0) mlb[r * 2] = M, mlb[r * 2 + 1] = L;
  }
  __syncthreads();
  const float oscale = kFp8 ? p.v_scale : 1.f;
  for (int e = 4 * tid; e < R * D; e += 4 * kW * 32) {  // 4 consecutive outputs of one row
    const int r = e / D, d = e % D;
    float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int w = 0; w < kW; ++w) {
      const float sc = fac[r * kW + w];
      const float4 v = *reinterpret_cast<const float4*>(
          reinterpret_cast<const float*>(smem + C::kQBytes + w * C::kWarpBytes) + r * D + d);
      O.x = fmaf(v.x, sc, O.x), O.y = fmaf(v.y, sc, O.y), O.z = fmaf(v.z, sc, O.z), O.w = fmaf(v.w, sc, O.w);
    }
    const int64_t row = int64_t(q0 + r / G) * p.Hq + kvh * G + r % G;  // (token, head)
    if (splits == 1) {
      const float L = mlb[r * 2 + 1], inv = L > 0.f ? oscale / L : 0.f;
      uint2 st;
      st.x = pack2<false>(O.x * inv, O.y * inv), st.y = pack2<false>(O.z * inv, O.w * inv);
      *reinterpret_cast<uint2*>(static_cast<bf16*>(p.out) + row * D + d) = st;
    } else {
      const int64_t base = int64_t(split) * p.T * p.Hq + row;
      *reinterpret_cast<float4*>(p.part_o + base * D + d) =
          make_float4(O.x * oscale, O.y * oscale, O.z * oscale, O.w * oscale);  // linear in V
      if (d == 0) p.part_ml[base * 2] = mlb[r * 2], p.part_ml[base * 2 + 1] = mlb[r * 2 + 1];
    }
  }
}

template <typename KvT, int D, int MT>
void launch_one(const AttnParams& p, cudaStream_t s) {
  auto* k = attn_verify_kernel<KvT, D, MT>;
  constexpr int smem = VerifyCfg<KvT, D, MT>::kSmem;
  static std::atomic<uint64_t> attr_set{0};  // per device: the shared-memory opt-in is done
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attr_set.load() & bit)) {
    CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    attr_set.fetch_or(bit);
  }
  launch_pdl(k, dim3(p.splits, p.Hkv, p.num_seqs), dim3(kW * 32), smem, s, p);
  CUDA_CHECK_LAUNCH();
}

template <typename KvT, int D>
void launch_d(const AttnParams& p, cudaStream_t s) {
  if ((p.Hq / p.Hkv) * p.max_query_len <= 16) launch_one<KvT, D, 1>(p, s);
  else launch_one<KvT, D, 2>(p, s);
}

}  // namespace

bool attention_verify_supported(const AttnParams& p) {
  return (p.D == 64 || p.D == 128) && p.Hkv > 0 && p.Hq % p.Hkv == 0 && p.max_query_len >= 1 &&
         (p.Hq / p.Hkv) * p.max_query_len <= kMaxRows && p.block_size > 0;
}

int attention_verify_splits(int num_sms, int kv_groups, int max_context) {
  // At most one wave of 2 blocks per SM (two fit: ~100 KB of shared memory each; a second
  // partial wave would cost more than longer splits), >= 8 chunks of 16 keys (2 per warp) per
  // split, at most 64 splits.
  const int want = 2 * num_sms / std::max(1, kv_groups);
  return std::max(1, std::min({want, max_context / (8 * kChunk), 64}));
}

void launch_attention_verify(const AttnParams& p, cudaStream_t s) {
  CU_REQUIRE(attention_verify_supported(p), "attention_verify: unsupported shape (head_dim " + std::to_string(p.D) +
                                                ", " + std::to_string(p.Hq) + " / " + std::to_string(p.Hkv) +
                                                " heads, " + std::to_string(p.max_query_len) + " query tokens)");
  CU_REQUIRE(p.splits == 1 || (p.part_o && p.part_ml), "attention_verify: splits without partial buffers");
  if (p.T == 0 || p.num_seqs == 0) return;
  if (p.D == 64) {
    if (p.kv_fp8) launch_d<uint8_t, 64>(p, s);
    else launch_d<bf16, 64>(p, s);
  } else {
    if (p.kv_fp8) launch_d<uint8_t, 128>(p, s);
    else launch_d<bf16, 128>(p, s);
  }
  if (p.splits > 1) launch_attention_combine(p, s);
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kMaxRows == limits::kAttnVerifyMaxRows && kChunk == limits::kAttnVerifyChunk);
}  // namespace moeserve::cuda
