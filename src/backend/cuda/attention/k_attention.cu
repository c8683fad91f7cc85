// Paged causal GQA attention for prefill, chunked prefill and decode (one kernel), with
// optional split-KV (flash-decoding) and a combine kernel.
//
// Block = (kv head, tile of QT query tokens of one sequence, KV split). Its rows are the
// QT x G query heads that share the kv head (G = Hq / Hkv), so each K/V tile is staged in
// shared memory once for all G heads (decode: the 6 heads of M2.5 read their kv head once).
// 4 warps x 4 rows; per 64-key tile a lane scores 2 keys per row, the warp runs the online
// softmax (base-2, scale folded into q), then accumulates P V with a lane owning dims
// lane + 32 i. Scalar f32 math: simple and exact enough; the tensor-core kernels take the
// shapes they support (kernel table in src/backend/cuda/README.md).
// FP8 KV cache (AttnParams::kv_fp8): the kernel is instantiated for e4m3 caches too; the tile
// staging loads 8 e4m3 bytes per 8 elements and widens them to bf16 in registers (exact: e4m3
// fits bf16), so the shared-memory tiles and the inner loops are the bf16 kernel's. k_scale is
// folded into the query scale and v_scale into the output (softmax(s * k_scale * q.k8) V8 *
// v_scale = attention over the dequantised cache). The bf16 instantiation has no FP8 code.
#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/pdl.cuh"

#include <type_traits>

namespace moeserve::cuda {
namespace {

constexpr int kWarps = 4, kRowsPerWarp = 4, kRows = kWarps * kRowsPerWarp;
constexpr int kKeys = 64, kDMax = 128, kDPer = kDMax / 32;

// 8 e4m3 bytes -> 4 words of 2 bf16 (exact), low byte first.
__device__ __forceinline__ uint4 e4m3x8_to_bf16x8(uint2 w) {
  uint32_t o[4];
  const uint32_t in[2] = {w.x, w.y};
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float2 f = fp8x2_to_f2(uint16_t(in[h] >> (16 * e)));
      __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
      o[2 * h + e] = *reinterpret_cast<uint32_t*>(&b);
    }
  }
  return make_uint4(o[0], o[1], o[2], o[3]);
}

template <typename KvT>  // bf16, or uint8_t: e4m3 codes (p.kv_fp8)
__global__ void __launch_bounds__(kWarps * 32) attention_kernel(AttnParams p, int QT, int qtiles) {
  constexpr bool kFp8 = std::is_same_v<KvT, uint8_t>;
  __shared__ float qs[kRows][kDMax];
  __shared__ __align__(16) bf16 ks[kKeys][kDMax + 2];  // +2: conflict-free row-per-lane reads
  __shared__ __align__(16) bf16 vs[kKeys][kDMax];

  pdl_enter();
  // grid.x: (sequence, query tile) (large), grid.y: kv head, grid.z: KV split.
  const int kvh = blockIdx.y, seq = blockIdx.x / qtiles, qt = blockIdx.x % qtiles, split = blockIdx.z;
  const int q0 = p.query_start[seq], qlen = p.query_start[seq + 1] - q0;
  if (qt * QT >= qlen) return;
  const int ctx = p.context_lens[seq];
  const int G = p.Hq / p.Hkv, D = p.D;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // log2(e): softmax in base 2; an FP8 cache's k_scale multiplies every score.
  const float qscale = p.scale * 1.4426950408889634f * (kFp8 ? p.k_scale : 1.f);
  const float oscale = kFp8 ? p.v_scale : 1.f;

  // Stage q rows (row r: token qt*QT + r / G, head kvh*G + r % G), pre-scaled.
  for (int i = threadIdx.x; i < kRows * kDMax; i += blockDim.x) {
    const int r = i / kDMax, d = i % kDMax;
    const int tok = qt * QT + r / G;
    float v = 0.f;
    if (r < QT * G && tok < qlen && d < D)
      v = bf2f(static_cast<const bf16*>(p.q)[int64_t(q0 + tok) * p.Hq * D + (kvh * G + r % G) * D + d]) * qscale;
    qs[r][d] = v;
  }

  // Key range of this block: causal end of its last token, split into p.splits chunks.
  const int last_tok = min(qlen, (qt + 1) * QT) - 1;
  const int kend = ctx - qlen + last_tok + 1;
  const int chunk = ceil_div(ceil_div(ctx, p.splits), kKeys) * kKeys;
  const int kbeg = split * chunk, kstop = min(kend, kbeg + chunk);

  int row_pos[kRowsPerWarp];  // absolute position of each row's token (-1: row unused)
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDPer];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = warp * kRowsPerWarp + rr, tok = qt * QT + r / G;
    row_pos[rr] = (r < QT * G && tok < qlen) ? ctx - qlen + tok : -1;
    m[rr] = -INFINITY;
    l[rr] = 0.f;
#pragma unroll
    for (int i = 0; i < kDPer; ++i) acc[rr][i] = 0.f;
  }

  const int row_stride = p.Hkv * D;
  const bool vec = D % 8 == 0;
  for (int k0 = kbeg; k0 < kstop; k0 += kKeys) {
    __syncthreads();  // previous tile fully consumed (and q staged on the first pass)
    // Stage K/V tile: key j -> physical block block_tables[seq][j / bs], slot j % bs.
    if (vec) {
      const int cpr = D / 8;  // 16-byte chunks per row
      for (int i = threadIdx.x; i < kKeys * cpr; i += blockDim.x) {
        const int kk = i / cpr, c = (i % cpr) * 8, j = k0 + kk;
        uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
        if (j < kstop) {
          const int blk = p.block_tables[int64_t(seq) * p.max_blocks_per_seq + j / p.block_size];
          const int64_t off = (int64_t(blk) * p.block_size + j % p.block_size) * row_stride + kvh * D + c;
          if constexpr (kFp8) {
            kv = e4m3x8_to_bf16x8(__ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.k_cache) + off)));
            vv = e4m3x8_to_bf16x8(__ldg(reinterpret_cast<const uint2*>(static_cast<const uint8_t*>(p.v_cache) + off)));
          } else {
            kv = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.k_cache) + off));
            vv = __ldg(reinterpret_cast<const uint4*>(static_cast<const bf16*>(p.v_cache) + off));
          }
        }
        const uint32_t* kw = reinterpret_cast<const uint32_t*>(&kv);
#pragma unroll
        for (int w = 0; w < 4; ++w) *reinterpret_cast<uint32_t*>(&ks[kk][c + 2 * w]) = kw[w];
        *reinterpret_cast<uint4*>(&vs[kk][c]) = vv;
      }
    } else {
      for (int i = threadIdx.x; i < kKeys * D; i += blockDim.x) {
        const int kk = i / D, d = i % D, j = k0 + kk;
        bf16 kv = f2bf(0.f), vv = kv;
        if (j < kstop) {
          const int blk = p.block_tables[int64_t(seq) * p.max_blocks_per_seq + j / p.block_size];
          const int64_t off = (int64_t(blk) * p.block_size + j % p.block_size) * row_stride + kvh * D + d;
          if constexpr (kFp8) {
            kv = f2bf(fp8x2_to_f2(static_cast<const uint8_t*>(p.k_cache)[off]).x);
            vv = f2bf(fp8x2_to_f2(static_cast<const uint8_t*>(p.v_cache)[off]).x);
          } else {
            kv = static_cast<const bf16*>(p.k_cache)[off];
            vv = static_cast<const bf16*>(p.v_cache)[off];
          }
        }
        ks[kk][d] = kv;
        vs[kk][d] = vv;
      }
    }
    __syncthreads();

    // Scores for keys lane and lane + 32.
    float s0[kRowsPerWarp], s1[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) s0[rr] = s1[rr] = 0.f;
    for (int d = 0; d < D; d += 2) {
      const float2 ka = bf16x2_to_f2(*reinterpret_cast<const uint32_t*>(&ks[lane][d]));
      const float2 kb = bf16x2_to_f2(*reinterpret_cast<const uint32_t*>(&ks[lane + 32][d]));
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float2 qv = *reinterpret_cast<const float2*>(&qs[warp * kRowsPerWarp + rr][d]);
        s0[rr] = fmaf(qv.x, ka.x, fmaf(qv.y, ka.y, s0[rr]));
        s1[rr] = fmaf(qv.x, kb.x, fmaf(qv.y, kb.y, s1[rr]));
      }
    }
    float p0[kRowsPerWarp], p1[kRowsPerWarp];
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int j0 = k0 + lane, j1 = k0 + lane + 32;
      const int lim = row_pos[rr];  // keys <= position are visible
      if (j0 > lim || j0 >= kstop) s0[rr] = -INFINITY;
      if (j1 > lim || j1 >= kstop) s1[rr] = -INFINITY;
      const float mt = warp_max(fmaxf(s0[rr], s1[rr]));
      const float mn = fmaxf(m[rr], mt);
      if (mn == -INFINITY) {  // nothing visible yet for this row
        p0[rr] = p1[rr] = 0.f;
        continue;
      }
      const float corr = exp2f(m[rr] - mn);
      p0[rr] = exp2f(s0[rr] - mn);
      p1[rr] = exp2f(s1[rr] - mn);
      l[rr] = l[rr] * corr + warp_sum(p0[rr] + p1[rr]);
      m[rr] = mn;
#pragma unroll
      for (int i = 0; i < kDPer; ++i) acc[rr][i] *= corr;
    }
    const int kn = min(kKeys, kstop - k0);
    for (int kk = 0; kk < kn; ++kk) {
      float vv[kDPer];
#pragma unroll
      for (int i = 0; i < kDPer; ++i) {
        const int d = lane + 32 * i;
        vv[i] = d < D ? bf2f(vs[kk][d]) : 0.f;
      }
#pragma unroll
      for (int rr = 0; rr < kRowsPerWarp; ++rr) {
        const float pk = __shfl_sync(0xffffffffu, kk < 32 ? p0[rr] : p1[rr], kk & 31);
#pragma unroll
        for (int i = 0; i < kDPer; ++i) acc[rr][i] = fmaf(pk, vv[i], acc[rr][i]);
      }
    }
  }

  // Write: final output (one split) or unnormalised partials + (m, l).
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    if (row_pos[rr] < 0) continue;
    const int r = warp * kRowsPerWarp + rr;
    const int t = q0 + qt * QT + r / G, h = kvh * G + r % G;
    if (p.splits == 1) {
      const float inv = (l[rr] > 0.f ? 1.f / l[rr] : 0.f) * oscale;
#pragma unroll
      for (int i = 0; i < kDPer; ++i) {
        const int d = lane + 32 * i;
        if (d < D) static_cast<bf16*>(p.out)[(int64_t(t) * p.Hq + h) * D + d] = f2bf(acc[rr][i] * inv);
      }
    } else {
      const int64_t base = (int64_t(split) * p.T + t) * p.Hq + h;
#pragma unroll
      for (int i = 0; i < kDPer; ++i) {
        const int d = lane + 32 * i;
        if (d < D) p.part_o[base * D + d] = acc[rr][i] * oscale;  // v_scale: the partials are linear in V
      }
      if (lane == 0) {
        p.part_ml[base * 2] = m[rr];
        p.part_ml[base * 2 + 1] = l[rr];
      }
    }
  }
  if (p.splits == 1 || !p.counters) return;
  // Fused combine (threadfence reduction): the last split block of this (sequence, query
  // tile, kv head) merges every split's partials for its rows, in split order.
  __shared__ int is_last;
  int* ctr = p.counters + (int64_t(seq) * qtiles + qt) * p.Hkv + kvh;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(ctr, 1) == p.splits - 1;
  __syncthreads();
  if (!is_last) return;
  if (threadIdx.x == 0) *ctr = 0;  // ready for the next layer / graph replay
  __threadfence();
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    if (row_pos[rr] < 0) continue;
    const int r = warp * kRowsPerWarp + rr;
    const int t = q0 + qt * QT + r / G, h = kvh * G + r % G;
    // Lane s holds split s's (m, l) (splits <= 32): one parallel load, warp max / sum.
    float ms = -INFINITY, ls = 0.f;
    if (lane < p.splits) {
      const int64_t base = (int64_t(lane) * p.T + t) * p.Hq + h;
      ms = __ldcg(p.part_ml + base * 2);
      ls = __ldcg(p.part_ml + base * 2 + 1);
    }
    const float M = warp_max(ms);
    const float ws = ms == -INFINITY ? 0.f : exp2f(ms - M);
    const float L = warp_sum(ls * ws);
    float o[kDPer];
#pragma unroll
    for (int i = 0; i < kDPer; ++i) o[i] = 0.f;
#pragma unroll 8
    for (int sp = 0; sp < p.splits; ++sp) {
      const float w = __shfl_sync(0xffffffffu, ws, sp);
      const float* po = p.part_o + ((int64_t(sp) * p.T + t) * p.Hq + h) * D;
#pragma unroll
      for (int i = 0; i < kDPer; ++i) {
        const int d = lane + 32 * i;
        if (d < D) o[i] = fmaf(__ldcg(po + d), w, o[i]);
      }
    }
#pragma unroll
    for (int i = 0; i < kDPer; ++i) {
      const int d = lane + 32 * i;
      if (d < D) static_cast<bf16*>(p.out)[(int64_t(t) * p.Hq + h) * D + d] = f2bf(L > 0.f ? o[i] / L : 0.f);
    }
  }
}

// One block per (token, head): merges the splits' partials.
__global__ void attn_combine_kernel(AttnParams p) {
  pdl_enter();
  const int t = blockIdx.x, h = blockIdx.y;
  float M = -INFINITY;
  for (int sp = 0; sp < p.splits; ++sp) M = fmaxf(M, p.part_ml[((int64_t(sp) * p.T + t) * p.Hq + h) * 2]);
  for (int d = threadIdx.x; d < p.D; d += blockDim.x) {
    float L = 0.f, o = 0.f;
    for (int sp = 0; sp < p.splits; ++sp) {
      const int64_t base = (int64_t(sp) * p.T + t) * p.Hq + h;
      const float ms = p.part_ml[base * 2], ls = p.part_ml[base * 2 + 1];
      if (ms == -INFINITY) continue;
      const float w = exp2f(ms - M);
      L += ls * w;
      o += p.part_o[base * p.D + d] * w;
    }
    static_cast<bf16*>(p.out)[(int64_t(t) * p.Hq + h) * p.D + d] = f2bf(L > 0.f ? o / L : 0.f);
  }
}

}  // namespace

int attn_query_tile(int group) { return group >= kRows ? 1 : kRows / group; }

void launch_attention(const AttnParams& p, cudaStream_t s) {
  CU_REQUIRE(p.D <= kDMax && p.D % 2 == 0, "attention: head_dim " + std::to_string(p.D) + " unsupported (even, <= 128)");
  CU_REQUIRE(p.Hkv > 0 && p.Hq % p.Hkv == 0 && p.Hq / p.Hkv <= kRows,
             "attention: " + std::to_string(p.Hq) + " q heads over " + std::to_string(p.Hkv) + " kv heads unsupported");
  if (p.T == 0 || p.num_seqs == 0) return;
  const int QT = attn_query_tile(p.Hq / p.Hkv);
  const int qtiles = ceil_div(p.max_query_len, QT);
  dim3 grid(p.num_seqs * qtiles, p.Hkv, p.splits);
  if (p.kv_fp8) launch_pdl(attention_kernel<uint8_t>, grid, dim3(kWarps * 32), 0, s, p, QT, qtiles);
  else launch_pdl(attention_kernel<bf16>, grid, dim3(kWarps * 32), 0, s, p, QT, qtiles);
  CUDA_CHECK_LAUNCH();
  if (p.splits > 1 && !p.counters) launch_attention_combine(p, s);
}

void launch_attention_combine(const AttnParams& p, cudaStream_t s) {
  launch_pdl(attn_combine_kernel, dim3(p.T, p.Hq), dim3(128), 0, s, p);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kRows == limits::kAttnGenericRows);
}  // namespace moeserve::cuda
