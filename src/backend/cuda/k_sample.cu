// GPU sampling, one block of 1024 threads per row of logits [rows, V]:
// greedy (temperature <= 0): argmax, lowest index on ties. Otherwise z = (logit - max) / T; top-k and
// top-p keep the tokens whose z is at least a threshold found by bisection on the
// order-preserving integer image of z (32 steps, each a block-wide count or probability
// sum), so no sort is needed. The midpoint is computed in 64 bits: with lo = 0 and
// hi = 2^32 - 1, a 32-bit hi - lo + 1 wraps to 0 and the bisection never ends. Ties at the
// threshold are all kept (top-k may keep a few more than k on exactly equal logits). A
// uniform u from a hash of the row's seed picks the token by a prefix scan over
// kept probabilities in index order. A row whose maximum is not finite gets -1 (all -inf /
// NaN) or -2 (+inf) instead of a token.
// Structured outputs (launch_sample_masked): a row with mask_rows[row] >= 0 reads its
// allowed-token bitset (that row of the mask words) and sees every disallowed logit as -inf before all of the above, so
// greedy, top-k / top-p and the draw run over the allowed tokens only (the host sampler's
// masked row). An all-zero mask gives -1 like an all -inf row.
#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_sample.h"

namespace moeserve::cuda {
namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint32_t ordered(float f) {
  const uint32_t u = __float_as_uint(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Logit i of the row at `base` (i < V), -inf where the row's mask (null: none) disallows it.
__device__ __forceinline__ float logit(const void* p, bool bf, int64_t base, int i, const uint32_t* mask) {
  if (mask && !((__ldg(mask + (i >> 5)) >> (i & 31)) & 1u)) return -INFINITY;
  return bf ? bf2f(static_cast<const bf16*>(p)[base + i]) : static_cast<const float*>(p)[base + i];
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const void* logits, bool bf, int V,
                                                          const SampleRowParams* params, const int32_t* mask_rows,
                                                          const uint32_t* masks, int mask_words, int32_t* out) {
  __shared__ float red[32];
  __shared__ int redi[32];
  const int row = blockIdx.x;
  const SampleRowParams sp = params[row];
  const int64_t base = int64_t(row) * V;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int mask_row = mask_rows ? mask_rows[row] : -1;
  const uint32_t* mask = (masks && mask_row >= 0) ? masks + int64_t(mask_row) * mask_words : nullptr;

  // Max (and argmax for greedy), NaN treated as -inf.
  float best = -INFINITY;
  int best_i = V;
  for (int i = threadIdx.x; i < V; i += kThreads) {
    float z = logit(logits, bf, base, i, mask);
    if (z != z) z = -INFINITY;
    if (z > best || (z == best && i < best_i)) best = z, best_i = i;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ob > best || (ob == best && oi < best_i)) best = ob, best_i = oi;
  }
  if (lane == 0) red[warp] = best, redi[warp] = best_i;
  __syncthreads();
  best = red[lane];
  best_i = redi[lane];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ob > best || (ob == best && oi < best_i)) best = ob, best_i = oi;
  }
  if (best_i >= V) best_i = 0;
  // A row without a finite maximum cannot be sampled (the host sampler throws SamplingError):
  // -1 when every entry is -inf / NaN, -2 when one is +inf (kDeviceNoCandidate /
  // kDeviceInfLogit in engine/executor.h). The engine fails that request alone.
  if (!isfinite(best)) {
    if (threadIdx.x == 0) out[row] = best > 0.f ? -2 : -1;
    return;
  }
  if (sp.temperature <= 0.f) {
    if (threadIdx.x == 0) out[row] = best_i;
    return;
  }
  // z = (logit - max) / T <= 0: subtracting first keeps z finite for any finite logits and
  // temperature (logit / T alone overflows at T = 0.01 for logits above 3.4e36).
  const float invT = 1.f / sp.temperature;
  auto zof = [&](int i) { return (logit(logits, bf, base, i, mask) - best) * invT; };
  __syncthreads();

  // Threshold on ordered(z): keep tokens with ordered(z) >= thr.
  uint32_t thr = 0;
  if (sp.top_k > 0 && sp.top_k < V) {
    // Largest thr with count(ordered(z) >= thr) >= top_k.
    uint32_t lo = 0, hi = 0xffffffffu;
    while (lo < hi) {
      const uint32_t mid = uint32_t(lo + (uint64_t(hi) - lo + 1) / 2);  // 64-bit: hi - lo + 1 may be 2^32
      float c = 0.f;
      for (int i = threadIdx.x; i < V; i += kThreads) c += ordered(zof(i)) >= mid;
      c = block_sum(c, red);
      if (c >= float(sp.top_k)) lo = mid; else hi = mid - 1;
    }
    thr = lo;
  }
  auto prob = [&](int i) {
    const float z = zof(i);
    return (z == z && ordered(z) >= thr) ? __expf(z) : 0.f;
  };
  float total = 0.f;
  for (int i = threadIdx.x; i < V; i += kThreads) total += prob(i);
  total = block_sum(total, red);
  if (sp.top_p > 0.f && sp.top_p < 1.f) {
    // Largest thr2 >= thr with mass(ordered(z) >= thr2) >= top_p * total.
    const float target = sp.top_p * total;
    uint32_t lo = thr, hi = 0xffffffffu;
    while (lo < hi) {
      const uint32_t mid = uint32_t(lo + (uint64_t(hi) - lo + 1) / 2);  // 64-bit: hi - lo + 1 may be 2^32
      float m = 0.f;
      for (int i = threadIdx.x; i < V; i += kThreads) {
        const float z = zof(i);
        if (z == z && ordered(z) >= mid) m += __expf(z);
      }
      m = block_sum(m, red);
      if (m >= target) lo = mid; else hi = mid - 1;
    }
    thr = lo;
    total = 0.f;
    for (int i = threadIdx.x; i < V; i += kThreads) total += prob(i);
    total = block_sum(total, red);
  }

  // u in [0, total): scan contiguous chunks in index order.
  // The draw depends on the row's seed only (not its index), so a row samples the same
  // token whatever batch position it has; callers give distinct rows distinct seeds.
  const uint64_t h = splitmix64(sp.seed ^ 0x51ED27ull);
  const float u = float(double(h >> 11) * (1.0 / 9007199254740992.0)) * total;
  const int per = (V + kThreads - 1) / kThreads;
  const int b = threadIdx.x * per, e = min(V, b + per);
  float mine = 0.f;
  for (int i = b; i < e; ++i) mine += prob(i);
  // Exclusive prefix over threads: warp scan, then scan of warp totals.
  float incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  __syncthreads();
  if (lane == 31) red[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    float w = red[lane];
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    red[lane] = w;  // inclusive warp totals
  }
  __syncthreads();
  const float before = (warp > 0 ? red[warp - 1] : 0.f) + incl - mine;
  __shared__ int chosen;
  if (threadIdx.x == 0) chosen = best_i;  // fallback: the most probable token
  __syncthreads();
  if (mine > 0.f && u >= before && u < before + mine) {
    float c = before;
    int pick = -1, last = -1;
    for (int i = b; i < e; ++i) {
      const float pi = prob(i);
      if (pi <= 0.f) continue;
      last = i;
      c += pi;
      if (u < c) { pick = i; break; }
    }
    chosen = pick >= 0 ? pick : last;  // at most one thread's range contains u
  }
  __syncthreads();
  if (threadIdx.x == 0) out[row] = chosen;
}

}  // namespace

void launch_sample(const void* logits, bool logits_bf16, int rows, int vocab, const SampleRowParams* params,
                   int32_t* out_ids, cudaStream_t s) {
  launch_sample_masked(logits, logits_bf16, rows, vocab, params, SampleMasks{}, out_ids, s);
}

void launch_sample_masked(const void* logits, bool logits_bf16, int rows, int vocab, const SampleRowParams* params,
                          const SampleMasks& masks, int32_t* out_ids, cudaStream_t s) {
  if (rows == 0) return;
  sample_kernel<<<rows, kThreads, 0, s>>>(logits, logits_bf16, vocab, params, masks.rows, masks.words,
                                          masks.words_per_row, out_ids);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
