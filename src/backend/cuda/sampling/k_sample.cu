// GPU sampling of logits [rows, V] (one token per row), spread over many blocks per row.
//
// Rule (as before, and as the host sampler's filters): greedy (temperature <= 0) is the argmax,
// lowest index on ties. Otherwise z = (logit - max) / T (NaN counts as -inf); top-k keeps the
// tokens whose order-preserving key ordered(z) is >= the k-th largest key (ties at the
// threshold all kept); top-p then keeps the keys >= the largest t with mass(key >= t) >=
// top_p * mass(kept by top-k); a uniform u from a hash of the row's seed picks the token by an
// inverse-CDF walk over the kept probabilities exp(z) in index order. A row whose maximum is not
// finite gets -1 (all -inf / NaN) or -2 (+inf) instead of a token.
//
// Why many blocks: one 1024-thread block per row (the first version) read a 200k vocabulary
// with one SM; top-k + top-p took 64 bisection passes, ~1.45 ms per step at batch 1 (MiniMax-M2's
// generation_config: top_k 40, top_p 0.95), a third of the decode step. Here:
//   - A row is cut into sub-chunks of kChunk = 4096 tokens (NC per row); every partial result
//     (max, mass, histograms) is kept per sub-chunk and combined in a fixed order, so the
//     result does not depend on how many blocks share a row (which follows the batch size):
//     a seeded row samples the same token in any batch.
//   - Thresholds are found by 8-bit radix selection on the 32-bit keys (4 passes instead of
//     32 bisection steps): per pass a 256-bin histogram (counts for top-k, masses for top-p)
//     of the keys that match the prefix chosen so far.
//   - Blocks of a row meet at grid-wide barriers (a cooperative launch guarantees that every
//     block is resident); when rows x blocks would not fit, each row gets one block and the
//     barrier is the block's own (same arithmetic, same result).
// Structured outputs: a row with mask_row >= 0 sees every logit its bitset disallows as -inf.
// Barriers per launch: 1 (max) + 4 if any row uses top-k + 1 (mass) + 5 if any row uses top-p.
#include <cooperative_groups.h>

#include <algorithm>

#include "backend/cuda/common/common.cuh"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/sampling/select_sampling.h"

namespace moeserve::cuda {
static_assert(kSampleChunk == limits::kSampleChunk && kSampleRowsPerLaunch == limits::kSampleRowsPerLaunch);
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 512;
constexpr int kPerThread = kSampleChunk / kThreads;  // 8 contiguous tokens per thread
static_assert(kPerThread * kThreads == kSampleChunk);
constexpr int kBins = 256;

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

struct SampleArgs {
  const void* logits;
  bool bf16;
  int V, NC;              // vocabulary, sub-chunks per row
  int row0;               // first row of this launch
  const SampleRowParams* params;
  int32_t* out;
  SampleScratch scratch;  // per launch row (row - row0)
  const uint32_t* masks;
  int mask_words;
  bool any_sampling, any_topk, any_topp;
};

// Barrier of the blocks that share rows: the whole grid (cooperative launch) or the block.
template <bool kGrid>
__device__ __forceinline__ void row_barrier() {
  if constexpr (kGrid) {
    cg::this_grid().sync();
  } else {
    __syncthreads();
  }
}

// Sum of v over the block in a fixed order (warp tree, then warp 0's tree); every thread gets it.
__device__ __forceinline__ float fixed_block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float r = lane < kThreads / 32 ? red[lane] : 0.f;
  r = warp_sum(r);
  __syncthreads();
  return r;
}

// Sum over the row's NC sub-chunk partials p[0..NC) in a fixed order; every thread gets it.
__device__ __forceinline__ float sum_partials(const float* p, int NC, float* red) {
  float v = 0.f;
  for (int j = threadIdx.x; j < NC; j += kThreads) v += p[j];
  return fixed_block_sum(v, red);
}

// Picks the radix bin: the highest non-empty bin b with above(b) + hist[b] >= need, where
// above(b) sums the bins over b (need <= 0: the highest non-empty bin); if rounding leaves
// `need` unreached, the lowest non-empty bin. Returns b and sets *above_out = above(b). Bins in
// smem `hist`; called by the 32 threads of warp 0. The prefix chosen so far always matches a
// key of positive weight (the row's maximum or a key of a bin chosen earlier), so some bin is
// non-empty.
__device__ __forceinline__ int select_bin(const float* hist, float need, float* above_out) {
  const int lane = threadIdx.x & 31;
  // Lane l owns bins 255 - 8l - i, i = 0..7 (highest first).
  float own[8];
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) own[i] = hist[kBins - 1 - (lane * 8 + i)], s += own[i];
  float incl = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  const float before = incl - s;
  int found = -1;
  float found_above = 0.f;
  {
    float c = before;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (found < 0 && own[i] > 0.f && c + own[i] >= need) found = i, found_above = c;
      c += own[i];
    }
  }
  const unsigned hit = __ballot_sync(0xffffffffu, found >= 0);
  int lane_sel, bin = -1;
  float above = 0.f;
  if (hit) {
    lane_sel = __ffs(hit) - 1;
    if (lane == lane_sel) bin = kBins - 1 - (lane * 8 + found), above = found_above;
  } else {
    const unsigned nz = __ballot_sync(0xffffffffu, s > 0.f);
    lane_sel = nz ? 31 - __clz(nz) : 0;
    if (lane == lane_sel) {
      int i = 7;
      while (i > 0 && own[i] <= 0.f) --i;
      bin = kBins - 1 - (lane * 8 + i);
      above = before;
      for (int q = 0; q < i; ++q) above += own[q];
    }
  }
  bin = __shfl_sync(0xffffffffu, bin, lane_sel);
  above = __shfl_sync(0xffffffffu, above, lane_sel);
  *above_out = above;
  return bin;
}

template <bool kGrid>
__global__ void __launch_bounds__(kThreads) sample_kernel(SampleArgs a) {
  __shared__ float red[32];
  __shared__ float hist[kBins];
  __shared__ float sel_above;
  __shared__ int sel_bin;
  __shared__ int redi[32];
  __shared__ int chosen, last_kept;
  const int lr = blockIdx.y;  // row within the launch
  const int row = a.row0 + lr;
  const int S = gridDim.x, s = blockIdx.x;
  const SampleRowParams sp = a.params[row];
  const int V = a.V, NC = a.NC;
  const int64_t base = int64_t(row) * V;
  const int tid = threadIdx.x;
  float* pmax = a.scratch.pmax + size_t(lr) * NC;
  int* parg = a.scratch.parg + size_t(lr) * NC;
  float* pmass = a.scratch.pmass + size_t(lr) * NC;
  auto hist_of = [&](int pass, int j) { return a.scratch.hist + ((size_t(pass & 1) * gridDim.y + lr) * NC + j) * kBins; };
  const uint32_t* mask = (a.masks && sp.mask_row >= 0) ? a.masks + int64_t(sp.mask_row) * a.mask_words : nullptr;
  auto raw = [&](int i) -> float {
    if (mask && !((__ldg(mask + (i >> 5)) >> (i & 31)) & 1u)) return -INFINITY;
    float z = a.bf16 ? bf2f(static_cast<const bf16*>(a.logits)[base + i]) : static_cast<const float*>(a.logits)[base + i];
    return z != z ? -INFINITY : z;
  };

  // 1. Per sub-chunk max and argmax (lowest index among equal maxima).
  for (int j = s; j < NC; j += S) {
    float best = -INFINITY;
    int best_i = V;
    const int c0 = j * kSampleChunk + tid * kPerThread;
#pragma unroll
    for (int e = 0; e < kPerThread; ++e) {
      const int i = c0 + e;
      if (i < V) {
        const float z = raw(i);
        if (z > best) best = z, best_i = i;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (ob > best || (ob == best && oi < best_i)) best = ob, best_i = oi;
    }
    if ((tid & 31) == 0) red[tid >> 5] = best, redi[tid >> 5] = best_i;
    __syncthreads();
    if (tid < 32) {
      best = tid < kThreads / 32 ? red[tid] : -INFINITY;
      best_i = tid < kThreads / 32 ? redi[tid] : V;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (ob > best || (ob == best && oi < best_i)) best = ob, best_i = oi;
      }
      if (tid == 0) pmax[j] = best, parg[j] = best_i;
    }
    __syncthreads();
  }
  row_barrier<kGrid>();
  // The row's maximum: every block reduces the NC partials the same way.
  float best = -INFINITY;
  int best_i = V;
  for (int j = tid; j < NC; j += kThreads) {
    const float b = pmax[j];
    const int bi = parg[j];
    if (b > best || (b == best && bi < best_i)) best = b, best_i = bi;
  }
  {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (ob > best || (ob == best && oi < best_i)) best = ob, best_i = oi;
    }
    if ((tid & 31) == 0) red[tid >> 5] = best, redi[tid >> 5] = best_i;
    __syncthreads();
    best = (tid & 31) < kThreads / 32 ? red[tid & 31] : -INFINITY;
    best_i = (tid & 31) < kThreads / 32 ? redi[tid & 31] : V;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
      if (ob > best || (ob == best && oi < best_i)) best = ob, best_i = oi;
    }
    __syncthreads();
  }
  if (best_i >= V) best_i = 0;
  // A row without a finite maximum cannot be sampled (the host sampler throws SamplingError):
  // kDeviceNoCandidate / kDeviceInfLogit in engine/executor.h; the engine fails that request.
  const bool finite = isfinite(best);
  const bool done = !finite || sp.temperature <= 0.f;
  if (done && s == 0 && tid == 0) a.out[row] = !finite ? (best > 0.f ? -2 : -1) : best_i;
  if (!a.any_sampling) return;  // uniform: every row of the launch is greedy

  // z = (logit - max) / T <= 0: subtracting first keeps z finite for finite logits.
  const float invT = done ? 0.f : 1.f / sp.temperature;
  auto key_of = [&](int i) { return ordered((raw(i) - best) * invT); };

  // 2. Top-k threshold: the k-th largest key, by radix selection (counts are exact in fp32:
  // V < 2^24).
  uint32_t thr = 0;
  if (a.any_topk) {
    const bool active = !done && sp.top_k > 0 && sp.top_k < V;
    uint32_t prefix = 0, mask = 0;
    float need = float(sp.top_k);
    for (int pass = 0; pass < 4; ++pass) {
      const int shift = 24 - 8 * pass;
      if (active) {
        for (int j = s; j < NC; j += S) {
          for (int b = tid; b < kBins; b += kThreads) hist[b] = 0.f;
          __syncthreads();
          const int c0 = j * kSampleChunk + tid * kPerThread;
#pragma unroll
          for (int e = 0; e < kPerThread; ++e) {
            const int i = c0 + e;
            if (i < V) {
              const uint32_t k = key_of(i);
              if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], 1.f);
            }
          }
          __syncthreads();
          float* g = hist_of(pass, j);
          for (int b = tid; b < kBins; b += kThreads) g[b] = hist[b];
          __syncthreads();
        }
      }
      row_barrier<kGrid>();
      if (active) {
        for (int b = tid; b < kBins; b += kThreads) {
          float c = 0.f;
          for (int j = 0; j < NC; ++j) c += hist_of(pass, j)[b];
          hist[b] = c;
        }
        __syncthreads();
        if (tid < 32) {
          float above;
          const int bin = select_bin(hist, need, &above);
          if (tid == 0) sel_bin = bin, sel_above = above;
        }
        __syncthreads();
        need -= sel_above;
        prefix |= uint32_t(sel_bin) << shift;
        mask |= 255u << shift;
        __syncthreads();
      }
    }
    if (active) thr = prefix;
  }
  auto prob_at = [&](int i, uint32_t t) {
    const float z = (raw(i) - best) * invT;
    return ordered(z) >= t ? __expf(z) : 0.f;
  };
  // Per sub-chunk kept mass (thread t: tokens [8t, 8t + 8) of the sub-chunk, fixed order).
  auto chunk_masses = [&](uint32_t t) {
    if (done) return;
    for (int j = s; j < NC; j += S) {
      const int c0 = j * kSampleChunk + tid * kPerThread;
      float m = 0.f;
#pragma unroll
      for (int e = 0; e < kPerThread; ++e)
        if (c0 + e < V) m += prob_at(c0 + e, t);
      m = fixed_block_sum(m, red);
      if (tid == 0) pmass[j] = m;
    }
  };

  // 3. Mass kept by top-k.
  chunk_masses(thr);
  row_barrier<kGrid>();
  float total = done ? 0.f : sum_partials(pmass, NC, red);

  // 4. Top-p: the largest key t >= thr with mass(key >= t) >= top_p * total, by radix
  // selection on per-sub-chunk mass histograms (summed in a fixed order).
  if (a.any_topp) {
    const bool active = !done && sp.top_p > 0.f && sp.top_p < 1.f;
    uint32_t prefix = 0, mask = 0;
    float need = sp.top_p * total;
    for (int pass = 0; pass < 4; ++pass) {
      const int shift = 24 - 8 * pass;
      if (active) {
        for (int j = s; j < NC; j += S) {
          for (int b = tid; b < kBins; b += kThreads) hist[b] = 0.f;
          __syncthreads();
          const int c0 = j * kSampleChunk + tid * kPerThread;
#pragma unroll
          for (int e = 0; e < kPerThread; ++e) {
            const int i = c0 + e;
            if (i < V) {
              const float z = (raw(i) - best) * invT;
              const uint32_t k = ordered(z);
              if (k >= thr && (k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255u], __expf(z));
            }
          }
          __syncthreads();
          float* g = hist_of(pass, j);
          for (int b = tid; b < kBins; b += kThreads) g[b] = hist[b];
          __syncthreads();
        }
      }
      row_barrier<kGrid>();
      if (active) {
        for (int b = tid; b < kBins; b += kThreads) {
          float c = 0.f;
          for (int j = 0; j < NC; ++j) c += hist_of(pass, j)[b];
          hist[b] = c;
        }
        __syncthreads();
        if (tid < 32) {
          float above;
          const int bin = select_bin(hist, need, &above);
          if (tid == 0) sel_bin = bin, sel_above = above;
        }
        __syncthreads();
        need -= sel_above;
        prefix |= uint32_t(sel_bin) << shift;
        mask |= 255u << shift;
        __syncthreads();
      }
    }
    // Same-mass atomics within a sub-chunk are summed in a varying order; the selected key is
    // still a kept key, so the row's maximum (mass 1) always survives.
    if (active) thr = max(thr, prefix);
    chunk_masses(thr);
    row_barrier<kGrid>();
    if (!done) total = sum_partials(pmass, NC, red);
  }
  if (done) return;

  // 5. The draw: u in [0, total); the sub-chunk holding u (prefix of the partials in index
  // order, the same in every block), then the walk inside it by the block that owns it.
  const uint64_t h = splitmix64(sp.seed ^ 0x51ED27ull);
  const float u = float(double(h >> 11) * (1.0 / 9007199254740992.0)) * total;
  int jstar = -1;
  float before_j = 0.f;
  if (tid == 0) {
    float c = 0.f;
    int last = -1;
    float before_last = 0.f;
    for (int j = 0; j < NC; ++j) {
      const float m = pmass[j];
      if (m > 0.f) {
        if (u < c + m) {
          jstar = j, before_j = c;
          break;
        }
        last = j, before_last = c;
      }
      c += m;
    }
    if (jstar < 0) jstar = last, before_j = before_last;  // rounding: u past the last partial
    sel_bin = jstar;
    sel_above = before_j;
  }
  __syncthreads();
  jstar = sel_bin;
  before_j = sel_above;
  if (jstar < 0 || jstar % S != s) return;  // another block owns it
  const int c0 = jstar * kSampleChunk + tid * kPerThread;
  float mine = 0.f;
#pragma unroll
  for (int e = 0; e < kPerThread; ++e)
    if (c0 + e < V) mine += prob_at(c0 + e, thr);
  // Exclusive prefix over threads (warp scan, then the warp totals).
  const int lane = tid & 31, warp = tid >> 5;
  float incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float n = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += n;
  }
  if (lane == 31) red[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    float w = lane < kThreads / 32 ? red[lane] : 0.f;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float n = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += n;
    }
    if (lane < kThreads / 32) red[lane] = w;
  }
  __syncthreads();
  const float before = before_j + (warp > 0 ? red[warp - 1] : 0.f) + incl - mine;
  if (tid == 0) chosen = -1, last_kept = -1;
  __syncthreads();
  if (mine > 0.f) {
    int last = -1;
#pragma unroll
    for (int e = 0; e < kPerThread; ++e)
      if (c0 + e < V && prob_at(c0 + e, thr) > 0.f) last = c0 + e;
    atomicMax(&last_kept, last);
    if (u >= before && u < before + mine) {
      float c = before;
      int pick = -1;
      for (int e = 0; e < kPerThread && c0 + e < V; ++e) {
        const float pi = prob_at(c0 + e, thr);
        if (pi <= 0.f) continue;
        c += pi;
        if (u < c) {
          pick = c0 + e;
          break;
        }
      }
      chosen = pick >= 0 ? pick : last;  // at most one thread's range contains u
    }
  }
  __syncthreads();
  if (tid == 0) a.out[row] = chosen >= 0 ? chosen : (last_kept >= 0 ? last_kept : best_i);
}

}  // namespace

size_t sample_scratch_bytes(int rows, int vocab) {
  const size_t NC = size_t((vocab + kSampleChunk - 1) / kSampleChunk);
  const size_t R = size_t(std::min(rows, kSampleRowsPerLaunch));
  return R * NC * (3 * 4 + 2 * kBins * 4) + 256;
}

int sample_max_resident() {
  // Blocks that can be resident at once (the cooperative launch's bound).
  int per_sm = 0, dev = 0, sms = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sample_kernel<true>, kThreads, 0));
  return per_sm * sms;
}

void launch_sample(const SampleLaunch& l, cudaStream_t s) {
  if (l.rows == 0) return;
  const int NC = (l.vocab + kSampleChunk - 1) / kSampleChunk;
  for (int r0 = 0; r0 < l.rows; r0 += kSampleRowsPerLaunch) {
    const int R = std::min(kSampleRowsPerLaunch, l.rows - r0);
    const size_t NCs = size_t(NC);
    SampleArgs a{};
    a.logits = l.logits, a.bf16 = l.logits_bf16, a.V = l.vocab, a.NC = NC, a.row0 = r0;
    a.params = l.params, a.out = l.out_ids, a.masks = l.masks, a.mask_words = l.mask_words;
    char* p = static_cast<char*>(l.scratch);
    a.scratch.pmax = reinterpret_cast<float*>(p);
    a.scratch.parg = reinterpret_cast<int*>(p + size_t(R) * NCs * 4);
    a.scratch.pmass = reinterpret_cast<float*>(p + size_t(R) * NCs * 8);
    a.scratch.hist = reinterpret_cast<float*>(p + size_t(R) * NCs * 12);
    a.any_sampling = l.any_sampling, a.any_topk = l.any_topk, a.any_topp = l.any_topp;
    // Blocks per row: enough to cover the sub-chunks, as many as stay resident with R rows.
    const int S = sample_blocks_per_row(R, l.vocab, l.max_resident);  // (select_sample)
    if (S > 1) {
      void* args[] = {&a};
      CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(sample_kernel<true>), dim3(S, R), dim3(kThreads),
                                             args, 0, s));
    } else {
      sample_kernel<false><<<dim3(1, R), kThreads, 0, s>>>(a);
      CUDA_CHECK_LAUNCH();
    }
  }
}

}  // namespace moeserve::cuda
