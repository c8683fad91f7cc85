// Decode add + RMSNorm + router in one kernel (add_rms_norm_route at T <= 4).
//
// The batch-1 graph otherwise runs the row norm kernel (residual += o, x = rmsnorm) and then
// route_decode_kernel (k_moe.cu), which can start its math only after the norm kernel has
// completed: one more dependent kernel boundary between the o_proj output and the expert ids.
// Here each block of kW warps owns kW experts: the warps load their gate rows (f32, H <= 4096:
// up to 32 float4 per lane) into registers BEFORE the PDL wait (the 3 MB gate streams during
// o_proj's tail), then every block normalises the T rows of residual + o itself into shared
// memory (a 12 KB L2 read per token and block), computes its logits, and the last block
// (threadfence + counter) stores residual and the normed rows and ranks the experts of each
// token with the whole block as route_decode_kernel does (biased sigmoid score desc, id asc;
// NaN last; weights renormalised over the k chosen sigmoid scores).
#include <cstdlib>
#include <string>

#include "backend/cuda/common/select_common.h"
#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/norm_rope/row_vec.cuh"
#include "backend/cuda/moe/route_topk.cuh"
#include "core/debug_flags.h"

namespace moeserve::cuda {
namespace {

constexpr int kRTok = 4;        // max tokens (the normed rows stay under 48 KB of shared memory)
constexpr int kRMaxH = 4096;    // max hidden width
constexpr int kRPre = kRMaxH / 128;  // float4 per lane of a gate row
constexpr int kRMaxE = 1024;

// The last block's work at one token (fast_tail): every L2 read it needs (the 8-byte-per-thread
// residual and o slices, this thread's logit) is issued before any is used, then the top-k
// without the rank pass over all E: each warp takes its k best (value desc, id asc: k rounds of
// a shuffle argmax, the winner's lane drops out), warp 0 picks the k best of those 8k candidates
// the same way, and the weights are formed exactly as block_rank_topk does (same scores, same
// warp_sum over the chosen in rank order): the same ids and bit-identical weights.
// cand: 8 x 8 (value, id) pairs; score: E sigmoid scores; sel: k ids.
template <int kW>
__device__ void last_block_tail_t1(const RouteParams& p, bf16* resw, const bf16* add, const bf16* xs, float* score,
                                   float2* cand, int* sel, float bias_x) {
  constexpr int kRV = (kRMaxH / 8 + kW * 32 - 1) / (kW * 32);  // 16-byte residual pieces per thread
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, hv = p.H / 8, k = p.top_k;
  uint4 ra[kRV], xa[kRV];
#pragma unroll
  for (int r = 0; r < kRV; ++r) {
    const int c = tid + r * kW * 32;
    if (c < hv) {
      ra[r] = __ldcg(reinterpret_cast<const uint4*>(resw) + c);
      xa[r] = __ldcg(reinterpret_cast<const uint4*>(add) + c);
    }
  }
  const float logit = tid < p.E ? __ldcg(p.logits + tid) : 0.f;
  // Residual + o and the normed row (every other block is done with the old residual).
#pragma unroll
  for (int r = 0; r < kRV; ++r) {
    const int c = tid + r * kW * 32;
    if (c >= hv) continue;
    reinterpret_cast<uint4*>(resw)[c] = add_bf16x8(ra[r], xa[r]);
    reinterpret_cast<uint4*>(p.norm_out)[c] = reinterpret_cast<const uint4*>(xs)[c];
  }
  // Scores as block_rank_topk forms them.
  float v = -INFINITY;
  if (tid < p.E) {
    const float sc = 1.f / (1.f + expf(-logit));
    const float c = sc + (p.bias ? bias_x : 0.f);
    score[tid] = sc;
    v = c == c ? c : -INFINITY;  // NaN ranks last
  }
  // (value, id) argmax over a warp: larger value, then smaller id.
  auto warp_best = [&](float bv, int bi, float& ov, int& oi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v2 = __shfl_xor_sync(0xffffffffu, bv, o);
      const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
      if (v2 > bv || (v2 == bv && i2 < bi)) bv = v2, bi = i2;
    }
    ov = bv, oi = bi;
  };
  int my_id = tid;  // tid >= E: padding, behind every expert (as in block_rank_topk)
  for (int r = 0; r < k; ++r) {
    float bv;
    int bi;
    warp_best(v, my_id, bv, bi);
    if (lane == 0) cand[warp * 8 + r] = make_float2(bv, __int_as_float(bi));
    if (bi == my_id) v = -INFINITY, my_id = 1 << 30;  // taken: behind everything
  }
  __syncthreads();
  if (warp != 0) return;
  // Warp 0: the k best of the kW x k candidates (two per lane).
  float cv[2];
  int ci[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int w = (lane + 32 * h) / 8, r = (lane + 32 * h) % 8;
    const bool ok = w < kW && r < k;
    const float2 c = ok ? cand[w * 8 + r] : make_float2(-INFINITY, __int_as_float(1 << 30));
    cv[h] = c.x, ci[h] = __float_as_int(c.y);
  }
  for (int r = 0; r < k; ++r) {
    const int h = (cv[1] > cv[0] || (cv[1] == cv[0] && ci[1] < ci[0])) ? 1 : 0;
    float bv;
    int bi;
    warp_best(cv[h], ci[h], bv, bi);
    if (lane == 0) sel[r] = bi;
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (ci[j] == bi) cv[j] = -INFINITY, ci[j] = 1 << 30;
  }
  __syncwarp();
  const int id = lane < k ? sel[lane] : 0;
  const float sc = lane < k ? score[id] : 0.f;
  const float sum = warp_sum(sc);
  if (lane < k) {
    p.ids[lane] = id;
    p.weights[lane] = sc * (sum > 0.f ? 1.f / sum : 0.f);
  }
}

template <int kW>
__global__ void __launch_bounds__(kW * 32) route_norm_decode_kernel(RouteParams p) {
  constexpr int kV = kRMaxH / (8 * kW * 32);  // 16-byte vectors per thread and row (norm)
  // The normed rows [T][H] bf16 (dynamic: T x H x 2 bytes, 6 KB at batch 1, so that the
  // kernel's blocks fit next to the o_proj GEMV's when PDL starts them early).
  extern __shared__ __align__(16) unsigned char xs_raw[];
  bf16* xs = reinterpret_cast<bf16*>(xs_raw);
  __shared__ float score[kRMaxE];
  __shared__ __align__(16) float choice[kRMaxE];
  __shared__ float rnorm[kRTok];
  __shared__ float scratch[32];
  __shared__ int sel[32];
  __shared__ int is_last;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int e = blockIdx.x * kW + warp, H = p.H, T = p.T, nv = H / 128;
  auto xrow = [&](int j) { return xs + j * H; };
  float4 w[kRPre];
  const float4* g = reinterpret_cast<const float4*>(static_cast<const float*>(p.gate) + int64_t(min(e, p.E - 1)) * H);
#pragma unroll
  for (int i = 0; i < kRPre; ++i)
    if (i < nv) w[i] = __ldg(g + i * 32 + lane);
  // One-token tail: thread x ranks expert x; its correction bias is a weight.
  const bool fast_tail = p.decode_tail == 1;
  const float bias_x = fast_tail && p.bias && tid < p.E ? __ldg(p.bias + tid) : 0.f;
  pdl_enter();

  // x_j = bf16(rmsnorm(bf16(res_j + add_j)) * nw) into shared memory (every block).
  const bf16* res = static_cast<const bf16*>(p.residual);
  const bf16* add = static_cast<const bf16*>(p.x);
  const bf16* nw = static_cast<const bf16*>(p.norm_w);
  const int hv = H / 8;
  for (int j = 0; j < T; ++j) {
    float val[kV][8];
    const float r =
        norm_row_stats<kV, kW * 32, false>(add + int64_t(j) * H, res + int64_t(j) * H, H, p.eps, val, scratch);
    if (tid == 0) rnorm[j] = r;
#pragma unroll
    for (int i = 0; i < kV; ++i) {
      const int v = i * kW * 32 + tid;
      if (v < hv) {
        uint32_t o[4];
        norm_row_pack8(val[i], r, *reinterpret_cast<const uint4*>(nw + 8 * v), o);
        *reinterpret_cast<uint4*>(xrow(j) + 8 * v) = make_uint4(o[0], o[1], o[2], o[3]);
      }
    }
  }
  __syncthreads();

  // Logits: warp e, lane l holds gate columns 4 (i * 32 + l) .. + 3.
  float acc[kRTok];
#pragma unroll
  for (int j = 0; j < kRTok; ++j) acc[j] = 0.f;
#pragma unroll
  for (int i = 0; i < kRPre; ++i) {
    if (i >= nv) break;
    const int h = 4 * (i * 32 + lane);
#pragma unroll
    for (int j = 0; j < kRTok; ++j) {
      if (j < T) {
        const uint2 raw = *reinterpret_cast<const uint2*>(xrow(j) + h);
        const float2 a = bf16x2_to_f2(raw.x), b = bf16x2_to_f2(raw.y);
        acc[j] = fmaf(a.x, w[i].x, fmaf(a.y, w[i].y, fmaf(b.x, w[i].z, fmaf(b.y, w[i].w, acc[j]))));
      }
    }
  }
#pragma unroll
  for (int j = 0; j < kRTok; ++j) {
    const float v = warp_sum(acc[j]);
    if (lane == 0 && j < T && e < p.E) p.logits[int64_t(j) * p.E + e] = v;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) is_last = atomicAdd(p.counter, 1) == int(gridDim.x) - 1;
  __syncthreads();
  if (!is_last) return;
  if (tid == 0) *p.counter = 0;  // ready for the next layer / graph replay
  __threadfence();

  bf16* resw = static_cast<bf16*>(p.residual);
  if (fast_tail) {
    last_block_tail_t1<kW>(p, resw, add, xs, score, reinterpret_cast<float2*>(choice), sel, bias_x);
    return;
  }
  // Residual and normed rows (every other block is done with the old residual).
  for (int i = tid; i < T * hv; i += kW * 32) {
    const int j = i / hv, c = i - j * hv;
    const uint4 ra = __ldcg(reinterpret_cast<const uint4*>(resw + int64_t(j) * H + 8 * c));
    const uint4 xa = __ldcg(reinterpret_cast<const uint4*>(add + int64_t(j) * H + 8 * c));
    *reinterpret_cast<uint4*>(resw + int64_t(j) * H + 8 * c) = add_bf16x8(ra, xa);
    *reinterpret_cast<uint4*>(static_cast<bf16*>(p.norm_out) + int64_t(j) * H + 8 * c) =
        *reinterpret_cast<const uint4*>(xrow(j) + 8 * c);
  }

  if (p.decode_tail == 2) {  // MOESERVE_ROUTE_DIAG=1 (timing only): fixed distinct experts, no top-k
    if (warp == 0 && lane < p.top_k)
      for (int t = 0; t < T; ++t) {
        p.ids[t * p.top_k + lane] = (lane * 37 + 11 + t) % p.E;
        p.weights[t * p.top_k + lane] = 1.f / p.top_k;
      }
    return;
  }
  block_rank_topk(p, T, score, choice, sel);
}

bool a16(const void* q) { return (reinterpret_cast<uintptr_t>(q) & 15) == 0; }

}  // namespace


bool route_norm_decode_supported(const RouteParams& p) {
  return p.norm && p.counter && p.x_bf16 && !p.gate_bf16 && !p.logits_split && p.T >= 1 && p.T <= kRTok &&
         p.H % 128 == 0 && p.H <= kRMaxH && p.E <= kRMaxE && p.top_k >= 1 && p.top_k <= 32 && p.top_k <= p.E &&
         p.logits && !p.pf_experts && a16(p.x) && a16(p.residual) && a16(p.norm_w) && a16(p.norm_out) && a16(p.gate);
}

void launch_route_norm_decode(const RouteParams& p, cudaStream_t s) {
  CU_REQUIRE(route_norm_decode_supported(p), "route_norm_decode: unsupported arguments");
  // MOESERVE_ROUTE_DIAG=1 (diagnostic build, timing only, WRONG routing): the last block
  // writes 8 fixed distinct experts (weights 1/k) instead of ranking them, to time the top-k
  // inside the step (merely skipping it leaves the ids at their zeroed start: every pair on
  // expert 0, served from L2).
  static const bool diag = debug_flags().route_diag;
  const int threads = 8 * 32;  // 8 warps (experts) per block (4 measured no faster)
  RouteParams d = p;
  d.decode_tail = diag ? 2 : p.fast_tail && p.T == 1 && p.E <= threads && p.top_k <= 8 ? 1 : 0;
  const size_t smem = size_t(p.T) * p.H * 2;  // <= 32 KB (T <= 4, H <= 4096): no opt-in needed
  launch_pdl(route_norm_decode_kernel<8>, dim3(ceil_div(p.E, 8)), dim3(8 * 32), smem, s, d);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda

// The selectors (common/select_common.h) check these limits.
namespace moeserve::cuda {
static_assert(kRTok == limits::kRouteDenseTok && kRMaxH == limits::kRouteDenseMaxH && kRMaxE == limits::kRouteDenseMaxE);
}  // namespace moeserve::cuda
