// Decode experts at very few tokens (direct pairs) as ONE persistent launch: the gate/up GEMV
// (silu(x W1^T) * (x W3^T), 16-row items) and the down GEMV (32-row items, routing weight,
// fused ordered combine) of every routing pair, handed out to a grid of resident blocks as
// work items in ticket order: all gate/up items first (pair-major), then all down items.
//
// Why: a block of the two-launch path (k_gemv_tc.cu) streams only ~100 KB of weights and
// spends ~1.5 of its ~6 us without loads in flight (the id / pointer round trip before its
// first loads, the split-K reduction and stores after its last), and the launch boundary
// between the GEMVs waits for the whole gate/up grid. Here a block issues the next item's
// first weight loads before the current item's reduction and stores, takes its tickets two
// items ahead, and a down item waits only for its own pair's gate/up items (a counter per
// pair) after its first weight loads are in flight.
//
// Layout and arithmetic per item are k_gemv_tc.cu's (gemv_frag.cuh: a warp owns 16 rows of
// each of two matrices and every 4th 128-column chunk; split-K over the 4 warps reduced in
// shared memory; per-chunk block scale), so the results are bit-identical to it.
//
// No deadlock whatever the residency: items are handed out in ticket order to blocks that are
// already running, so when a down item is handed out every gate/up item has been handed to a
// running block, and gate/up items never wait. Counters (ticket, exit, done[pair]) are reset
// by the last block to leave; the first ticket is taken before the PDL wait, which is safe
// because two launches sharing a counter set are never adjacent on the stream (the host
// alternates two sets): the launch before us ran to completion before our predecessor's
// blocks passed their wait (pdl.cuh).
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/gemv_frag.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace moeserve::cuda {
namespace {

constexpr int kChunk = 128;
constexpr int kWarps = 4;

// One work item's weight side, as the warps need it.
struct Item {
  int id;                 // ticket (>= total: no more work)
  int pair, nblk;         // routing pair, row block (16 rows gate/up, 32 rows down)
  bool down, skip;        // skip: the pair's expert is not local (gate/up: nothing; down: zeros)
  const uint8_t* row[2];  // [group]: weight row rb[m] + g, column q * 16 (row + 8: + 8 K)
  int K;
  const float* scale[2];  // block-scale row of each group
  int rb[2];
  bool gvalid[2];
  int nchunks;
};

__device__ __forceinline__ Item describe(int id, const LinParams& up, const LinParams& down, const ExpertPtrs* ep_s,
                                         const int* local_s, int up_items, int total, int up_x, int down_x,
                                         int lane) {
  Item it;
  it.id = id;
  if (id >= total) id = 0;  // no more work: describe item 0 (never loaded, only compared)
  it.down = id >= up_items;
  const int idx = it.down ? id - up_items : id, nx = it.down ? down_x : up_x;
  it.pair = idx / nx, it.nblk = idx - it.pair * nx;
  const int e = local_s[it.pair];
  it.skip = e < 0;
  const ExpertPtrs& ep = ep_s[it.pair];  // zeros for a non-local expert: never dereferenced
  const LinParams& p = it.down ? down : up;
  const int K = p.K, g = lane >> 2, q = lane & 3;
#pragma unroll
  for (int m = 0; m < 2; ++m) {
    const uint8_t* w = static_cast<const uint8_t*>(it.down ? ep.w2 : m == 0 ? ep.w1 : ep.w3);
    const float* s = it.down ? ep.s2 : m == 0 ? ep.s1 : ep.s3;
    int rb = it.down ? it.nblk * 32 + 16 * m : it.nblk * 16;
    it.gvalid[m] = rb < p.N;
    if (!it.gvalid[m]) rb = it.nblk * 32;  // re-read group 0, discard
    it.rb[m] = rb;
    it.row[m] = w + int64_t(rb + g) * K + q * 16;
    it.scale[m] = s + (rb / p.bo) * p.s_cols;
  }
  it.K = K;
  it.nchunks = it.skip || it.id >= total ? 0 : K / kChunk;
  return it;
}

template <int LD>
__device__ __forceinline__ void load_w(const Item& it, int c, Chunk& ch) {
#pragma unroll
  for (int s = 0; s < 2; ++s)
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) ch.a[m][s][h] = ld_w<LD>(it.row[m] + int64_t(8 * h) * it.K + c * kChunk + s * 64);
}

template <int LD, int MINB>
__global__ void __launch_bounds__(kWarps * 32, MINB) moe_chain_kernel(LinParams up, LinParams down, MoeChain c) {
  __shared__ float red[2][kWarps - 1][2][4][32];  // split-K partials, double-buffered by item parity
  __shared__ int tickets[3];                      // ring: current, next, the one after
  extern __shared__ __align__(16) unsigned char dyn_s[];  // [P] expert pointers, then [P] local ids
  ExpertPtrs* ep_s = reinterpret_cast<ExpertPtrs*>(dyn_s);
  int* local_s = reinterpret_cast<int*>(ep_s + up.M);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int P = up.M, up_x = up.N / 16, down_x = ceil_div(down.N, 32);
  const int up_items = up_x * P, total = up_items + down_x * P;
  int t1 = 0;
  if (threadIdx.x == 0) {
    tickets[0] = atomicAdd(c.ticket, 1);
    t1 = atomicAdd(c.ticket, 1);
  }
  pdl_enter();  // the routing ids come from the predecessor
  for (int i = threadIdx.x; i < P; i += blockDim.x) {
    const int e = up.pair_ids[i] - up.first_local;
    const bool local = e >= 0 && e < up.num_local;
    local_s[i] = local ? e : -1;
    ep_s[i] = local ? up.experts[e] : ExpertPtrs{};
  }
  if (threadIdx.x == 0) tickets[1] = t1;
  __syncthreads();

  Item cur = describe(tickets[0], up, down, ep_s, local_s, up_items, total, up_x, down_x, lane);
  Chunk c0, c1;
  if (cur.id < total) {
    if (warp < cur.nchunks) load_w<LD>(cur, warp, c0);
    if (warp + kWarps < cur.nchunks) load_w<LD>(cur, warp + kWarps, c1);
  }
  for (int k = 0; cur.id < total; ++k) {
    int t_after = 0;
    if (threadIdx.x == 0) t_after = atomicAdd(c.ticket, 1);  // used at this item's barrier
    const LinParams& p = cur.down ? down : up;
    // x: gate/up the token's row (written before this launch); down the pair's intermediate
    // row, written in this launch by other blocks: wait for its gate/up items, then L2 loads.
    const bf16* xrow;
    if (cur.down) {
      if (!cur.skip) {
        if (lane == 0) {
          int v;
          for (;;) {
            asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(c.done + cur.pair) : "memory");
            if (v >= up_x) break;
            __nanosleep(64);
          }
        }
        __syncwarp();
      }
      xrow = static_cast<const bf16*>(down.x) + int64_t(cur.pair) * down.ldx;
    } else {
      xrow = static_cast<const bf16*>(up.x) + int64_t(cur.pair / up.x_row_div) * up.ldx;
    }
    auto load_x = [&](int ci, Chunk& ch) {
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        const uint4* xp = reinterpret_cast<const uint4*>(xrow + ci * kChunk + s * 64 + q * 16);
        if (cur.down) {
          ch.x[s][0] = __ldcg(xp);
          ch.x[s][1] = __ldcg(xp + 1);
        } else {
          ch.x[s][0] = __ldg(xp);
          ch.x[s][1] = __ldg(xp + 1);
        }
      }
    };
    float acc[2][4] = {};
    auto compute = [&](int ci, const Chunk& ch) {
      float part[2][4];
      chunk_mma(ch, part);
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        const float sc = __ldg(cur.scale[m] + ci);
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[m][e] = fmaf(part[m][e], sc, acc[m][e]);
      }
    };
    // Two chunks in flight per warp; the first two were issued before this item began.
    for (int ci = warp; ci < cur.nchunks; ci += 2 * kWarps) {
      const int c2 = ci + kWarps;
      if (ci != warp) {
        load_w<LD>(cur, ci, c0);
        if (c2 < cur.nchunks) load_w<LD>(cur, c2, c1);
      }
      load_x(ci, c0);
      if (c2 < cur.nchunks) load_x(c2, c1);
      compute(ci, c0);
      if (c2 < cur.nchunks) compute(c2, c1);
    }
    // The next item's first weight loads, before this item's reduction and stores.
    const Item nxt = describe(tickets[(k + 1) % 3], up, down, ep_s, local_s, up_items, total, up_x, down_x, lane);
    if (nxt.id < total) {
      if (warp < nxt.nchunks) load_w<LD>(nxt, warp, c0);
      if (warp + kWarps < nxt.nchunks) load_w<LD>(nxt, warp + kWarps, c1);
    }
    float(*rd)[2][4][32] = red[k & 1];
    if (warp > 0) {
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int e = 0; e < 4; ++e) rd[warp - 1][m][e][lane] = acc[m][e];
    }
    if (threadIdx.x == 0) tickets[(k + 2) % 3] = t_after;
    __syncthreads();
    if (warp == 0) {
#pragma unroll
      for (int w = 0; w < kWarps - 1; ++w)
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[m][e] += rd[w][m][e][lane];
      // C fragment: acc[m][0] = row rb[m] + g, acc[m][2] = row + 8 (token column 0: lanes q == 0).
      const int r = cur.pair;
      if (!cur.down) {
        if (!cur.skip && q == 0) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
            static_cast<bf16*>(up.out)[int64_t(r) * up.ldo + cur.rb[0] + g + 8 * h] =
                f2bf(silu(acc[0][2 * h]) * acc[1][2 * h]);
        }
        __threadfence();  // the stores above, before the pair's count
        __syncwarp();
        if (lane == 0) atomicAdd(c.done + r, 1);
      } else {
        if (q == 0) {
          const float scale = p.row_scale[r];
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int m = 0; m < 2; ++m)
              if (cur.gvalid[m])
                static_cast<float*>(down.out)[int64_t(r) * down.ldo + cur.rb[m] + g + 8 * h] = acc[m][2 * h] * scale;
        }
        // Fused ordered combine (as k_gemv_tc.cu): the token's last pair block of this row
        // block sums its top_k rows in k order.
        const int token = r / down.top_k;
        int* ctr = down.counters + int64_t(token) * down_x + cur.nblk;
        __threadfence();
        __syncwarp();
        int last = 0;
        if (lane == 0) last = atomicAdd(ctr, 1) == down.top_k - 1;
        last = __shfl_sync(0xffffffffu, last, 0);
        if (last) {
          if (lane == 0) *ctr = 0;
          __threadfence();
          const int row = cur.nblk * 32 + lane;
          if (row < down.N) {
            const float* yp = static_cast<const float*>(down.out) + int64_t(token) * down.top_k * down.ldo + row;
            float sum = 0.f;
            for (int j = 0; j < down.top_k; ++j) sum += __ldcg(yp + int64_t(j) * down.ldo);
            const int64_t o = int64_t(token) * down.N + row;
            if (down.combine_bf16)
              static_cast<bf16*>(down.combine_out)[o] = f2bf(sum);
            else
              static_cast<float*>(down.combine_out)[o] = sum;
          }
        }
      }
    }
    cur = nxt;
  }
  __syncthreads();
  if (threadIdx.x == 0) __threadfence();  // this block's ticket and count atomics, before its exit count
  if (threadIdx.x == 0 && atomicAdd(c.exit, 1) == int(gridDim.x) - 1) {
    // Every block has left the loop: no ticket is taken and no count read any more.
    *c.ticket = 0;
    *c.exit = 0;
    for (int i = 0; i < P; ++i) c.done[i] = 0;
  }
}

template <int LD, int MINB>
void launch_chain(const LinParams& up, const LinParams& down, const MoeChain& c, int total, cudaStream_t s) {
  static int per_sm = 0, sms = 0;
  if (per_sm == 0) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    // (with batch 1's 8 pairs of dynamic shared memory; more pairs only lower the grid's fill)
    CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, moe_chain_kernel<LD, MINB>, kWarps * 32,
                                                             8 * (sizeof(ExpertPtrs) + sizeof(int))));
    per_sm = std::max(per_sm, 1);
  }
  const int grid = std::min(total, c.max_blocks > 0 ? c.max_blocks : per_sm * sms);
  const size_t smem = size_t(up.M) * (sizeof(ExpertPtrs) + sizeof(int));
  launch_pdl(moe_chain_kernel<LD, MINB>, dim3(grid), dim3(kWarps * 32), smem, s, up, down, c);
}

}  // namespace

bool moe_chain_supported(const LinParams& up, const LinParams& down) {
  return up.mode == LinMode::kSwiglu && down.mode == LinMode::kDown && up.pair_ids && down.pair_ids &&
         up.M == down.M && up.M <= kMoeChainMaxPairs && up.fp8 && down.fp8 && up.bo == 128 && down.bo == 128 &&
         up.bi == kChunk && down.bi == kChunk && up.K % kChunk == 0 && down.K % kChunk == 0 && up.N % 16 == 0 &&
         down.N % 16 == 0 && up.ldx % 8 == 0 && down.ldx % 8 == 0 && up.K > 0 && down.K > 0 && down.combine_out &&
         down.out_f32 && down.x == up.out && down.K == up.N && (up.ld_hint == 1 || up.ld_hint == 2) &&
         down.counters && down.top_k > 0;
}

void launch_moe_chain(const LinParams& up, const LinParams& down, const MoeChain& c, cudaStream_t s) {
  const int total = (up.N / 16 + ceil_div(down.N, 32)) * up.M;
  if (total == 0) return;
  if (up.ld_hint == 2)
    launch_chain<2, 4>(up, down, c, total, s);
  else if (c.min_blocks == 3)
    launch_chain<1, 3>(up, down, c, total, s);
  else
    launch_chain<1, 4>(up, down, c, total, s);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
