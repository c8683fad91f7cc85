// Hopper (sm_90a) causal prefill attention on wgmma, head_dim 128; same contract as
// k_attn_prefill.cu (paged bf16 KV cache, chunked prefill: query i of a sequence with
// `qlen` new tokens and `ctx` cached tokens sits at position ctx - qlen + i and sees keys
// [0, pos]).
//
// Block = 2 warpgroups (256 threads), each owning 64 query rows:
// - GQA group even: the two warpgroups are two query heads of one KV head over the same 64
//   tokens (one K/V stream feeds both; their causal masks are identical);
// - otherwise (MHA, odd groups): one head, 128 tokens (64 per warpgroup).
// Keys are walked in tiles of 128. K and V tiles (32 KB each) travel global -> shared with
// cp.async (the paged cache has 16-token blocks scattered by the block table; one 16-byte
// copy per (key, 8 dims)), double-buffered: tile t + 1 is copied while tile t is computed.
// Shared layout is the wgmma 128-byte-swizzle canonical layout: each operand is split in two
// 64-dim halves, each half [rows][128 B] with 16-byte chunk c of row r stored at chunk
// c ^ (r % 8) (regions 1024-byte aligned, so the hardware swizzle matches ours).
// Per tile and warpgroup:
//   S[64 x 128] = Q K^T   8 x wgmma m64n128k16, A = Q (smem, K-major), B = K (smem, K-major)
//   online softmax in registers, base 2, scale applied in f32 (Q is not pre-scaled)
//   O[64 x 128] += P V    8 x wgmma m64n128k16, A = P (registers, re-packed from the S
//                         accumulators), B = V (smem, MN-major: V keeps its [key][dim] layout)
// The second warpgroup issues its products after the first (ping-pong order, named barrier),
// so one warpgroup's softmax runs under the other's products. Masking only on tiles that cross
// a row's diagonal (or hold padded rows). The next tile's copies are issued right after S.
// An opt-in variant (g_attn_wgmma_overlap) also overlaps a warpgroup's own softmax with its
// previous tile's P V (FlashAttention-3's intra-warpgroup pipelining); on the H200 it measured
// ~8% slower (255 registers, and the per-tile block barrier still couples the warpgroups).
// Another (g_attn_wgmma_mbar, kMode 2) replaces that barrier by per-buffer mbarriers over 3
// K/V buffers; it measured the same speed as the default.
#include "backend/cuda/attn_wgmma.cuh"
#include "backend/cuda/kernels_fp8.h"

namespace moeserve::cuda {
namespace {

using namespace attn_wg;
constexpr int kWG = 2, kThreads = 128 * kWG;
constexpr int kStageBytes = 2 * kKVBytes;            // K then V
constexpr int kSmemBytes = kWG * kQBytes + 2 * kStageBytes + 1024;  // + alignment slack
constexpr int kSmemBytes3 = kWG * kQBytes + 3 * kStageBytes + 1024;  // kMode 2: 3 K/V buffers


// Set per compiled architecture: the host reads it back to learn whether the loaded cubin
// has the wgmma kernel (an sm_80 / PTX-JIT build on a Hopper part does not).
__device__ int g_attn_wgmma_compiled =
#ifdef MS_WGMMA_ATTN
    1;
#else
    0;
#endif


// kOverlap = false: per tile S, softmax, P V in sequence (both warpgroups overlap each other
// only). kOverlap = true (FlashAttention-3's intra-warpgroup overlap): per tile t the
// warpgroup issues S_t and then O += P_{t-1} V_{t-1}, and runs the softmax of S_t while the
// P V product is still on the tensor cores; V tiles arrive one tile later than K tiles.
// order != 0: per tile the second warpgroup issues its products only after the first has
// issued its own (named barrier 1), so the first one's S is done early and its softmax runs
// under the second one's products (FlashAttention-3's ping-pong, one step per tile).
// kMode 2 (opt-in): as kMode 0 but with 3 K/V buffers and per-buffer mbarriers instead of the
// per-tile block barrier, so the ping-pong offset between the warpgroups survives from tile to
// tile: "full" completes when every thread's copies of a tile have landed, "empty" when both
// warpgroups are done with a buffer; tile t + 1 goes into the buffer of tile t - 2.
template <int kMode>
__global__ void __launch_bounds__(kThreads, 1) attn_wgmma_kernel(AttnParams p, int qtiles, int pair_heads, int order) {
#ifdef MS_WGMMA_ATTN
  constexpr bool kOverlap = kMode == 1;
  constexpr int kBufs = kMode == 2 ? 3 : 2;
  __shared__ __align__(8) uint64_t bars[6];  // kMode 2: full[3], empty[3]
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t sbase = (uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const int tid = threadIdx.x, wg = tid >> 7, ltid = tid & 127;
  const int lane = tid & 31, wl = ltid >> 5, g = lane >> 2, tig = lane & 3;
  const int tile_id = blockIdx.y;
  const int seq = tile_id / qtiles, qt = qtiles - 1 - tile_id % qtiles;
  const int q0 = p.query_start[seq], qlen = p.query_start[seq + 1] - q0;
  // This warpgroup's head and first token (see the header).
  const int h = pair_heads ? 2 * blockIdx.x + wg : blockIdx.x;
  const int cta_tok0 = pair_heads ? qt * kRows : qt * kRows * kWG;
  const int tw = pair_heads ? cta_tok0 : cta_tok0 + wg * kRows;
  if (cta_tok0 >= qlen) return;
  const int ctx = p.context_lens[seq], off = ctx - qlen;
  const int kvh = h / (p.Hq / p.Hkv);  // both warpgroups share it (pair mode: 2 | group size)
  const float sl2 = p.scale * 1.4426950408889634f;

  // Keys [0, kend) are visible to some row of the block.
  const int cta_last = min(qlen, cta_tok0 + (pair_heads ? kRows : kRows * kWG)) - 1;
  const int kend = off + cta_last + 1;
  const int ntiles = (kend + kN - 1) / kN;
  const int wg_min_pos = off + tw;
  const bool wg_has_pad = tw + kRows > qlen;
  const int r_lo = wl * 16 + g, r_hi = r_lo + 8;
  const int pos_lo = tw + r_lo < qlen ? off + tw + r_lo : -1;
  const int pos_hi = tw + r_hi < qlen ? off + tw + r_hi : -1;

  const uint32_t sq = sbase + wg * kQBytes;  // this warpgroup's Q: two halves of 64 x 128 B
  const uint32_t skb = sbase + kWG * kQBytes, svb = skb + kBufs * kKVBytes;  // K buffers, then V buffers

  // Q copy: warpgroup-local chunk (row, c) = (ltid / 16 + 8 j, ltid % 16), j = 0..7.
  {
    const bf16* qb = static_cast<const bf16*>(p.q);
    const int c = ltid & 15;
#pragma unroll
    for (int j = 0; j < kRows / 8; ++j) {
      const int r = (ltid >> 4) + 8 * j, tok = tw + r;
      const bool ok = tok < qlen;
      const bf16* src = qb + (ok ? (int64_t(q0 + tok) * p.Hq + h) * kD + c * 8 : 0);
      cp_async16(sq + (c >> 3) * (kRows * 128) + swz(r, c & 7), src, ok);
    }
  }
  const int row_stride = p.Hkv * kD;
  const bf16* kc = static_cast<const bf16*>(p.k_cache) + kvh * kD;
  const bf16* vc = static_cast<const bf16*>(p.v_cache) + kvh * kD;
  const int32_t* table = p.block_tables + int64_t(seq) * p.max_blocks_per_seq;
  // K or V tile copy: block-wide chunk (key, c) = (tid / 16 + 16 j, tid % 16), j = 0..7.
  // K or V tile copy: block-wide chunk (key, c) = (tid / 16 + 16 j, tid % 16), j = 0..7.
  // Branch-free (keys >= kend zero-fill and read table[0]) so that it can sit between a
  // wgmma issue and its wait without ptxas serialising the wgmma pipeline. Block size is a
  // power of two (attention_wgmma_supported).
  const int bs_shift = __ffs(p.block_size) - 1, bs_mask = p.block_size - 1;
  auto load_tile = [&](const bf16* src_cache, uint32_t dst_buf, int k0) {
    const int c = tid & 15;
    const uint32_t cofs = (c >> 3) * (kN * 128);
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      const int kk = (tid >> 4) + 16 * j, key = k0 + kk;
      const bool ok = key < kend;
      const int kq = ok ? key : 0;
      const int64_t o = (int64_t(table[kq >> bs_shift]) * p.block_size + (kq & bs_mask)) * row_stride + c * 8;
      cp_async16(dst_buf + cofs + swz(kk, c & 7), src_cache + (ok ? o : 0), ok);
    }
  };
  auto load_kv = [&](uint32_t kdst, uint32_t vdst, int k0) {  // K and V of the same keys
    const int c = tid & 15;
    const uint32_t cofs = (c >> 3) * (kN * 128);
#pragma unroll
    for (int j = 0; j < kN / 16; ++j) {
      const int kk = (tid >> 4) + 16 * j, key = k0 + kk;
      const bool ok = key < kend;
      const int kq = ok ? key : 0;
      const int64_t o = ok ? (int64_t(table[kq >> bs_shift]) * p.block_size + (kq & bs_mask)) * row_stride + c * 8 : 0;
      const uint32_t d = cofs + swz(kk, c & 7);
      cp_async16(kdst + d, kc + o, ok);
      cp_async16(vdst + d, vc + o, ok);
    }
  };
  auto tile_ready = [&] {
    asm volatile("cp.async.wait_group 0;\n" ::);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async writes -> wgmma reads
    __syncthreads();
  };

  float o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) o[i] = 0.f;
  RowState st;
  float s[64];

  if (kOverlap)
    load_tile(kc, skb, 0);
  else
    load_kv(skb, svb, 0);
  asm volatile("cp.async.commit_group;\n" ::);
  if constexpr (kMode == 2) {
    const uint32_t full0 = uint32_t(__cvta_generic_to_shared(&bars[0])), empty0 = full0 + 24;
    if (tid == 0)
      for (int i = 0; i < 6; ++i) mbar_init(full0 + 8 * i, kThreads);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncthreads();
    mbar_arrive_cp(full0);  // Q and tile 0
    for (int t = 0; t < ntiles; ++t) {
      const int k0 = t * kN, b = t % 3, nb = (t + 1) % 3;
      mbar_wait(full0 + 8 * b, (t / 3) & 1);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async writes -> wgmma reads
      if (order && wg == 1) named_sync();
      wg_fence();
      issue_s(s, sq, skb + b * kKVBytes);
      wg_commit();
      if (order && wg == 0) named_arrive();
      // Tile t + 1 into the buffer of tile t - 2 (zero-filled past kend).
      if (t >= 2) mbar_wait(empty0 + 8 * nb, ((t - 2) / 3) & 1);
      load_kv(skb + nb * kKVBytes, svb + nb * kKVBytes, k0 + kN);
      mbar_arrive_cp(full0 + 8 * nb);
      wg_wait0();
      fence_acc(s);
      softmax_tile(s, st, k0 + kN - 1 > wg_min_pos || wg_has_pad, k0, tig, pos_lo, pos_hi, sl2);
      rescale_o(o, st);
      uint32_t pa[8][4];
      pack_p(s, pa);
      wg_fence();
      fence_acc(o);
      issue_pv(o, pa, svb + b * kKVBytes);
      wg_commit();
      wg_wait0();
      fence_acc(o);
      mbar_arrive(empty0 + 8 * b);
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // the zero-filled tile past the end
  } else if constexpr (!kOverlap) {
    // Fully masked tiles (single mode's last tile for the first warpgroup) are computed like
    // the others (their P is 0): no wgmma in a divergent path.
    for (int t = 0; t < ntiles; ++t) {
      const int k0 = t * kN, b = t & 1;
      tile_ready();  // tile t visible; every warpgroup is done with tile t - 1's buffers
      if (order && wg == 1) named_sync();
      wg_fence();
      issue_s(s, sq, skb + b * kKVBytes);
      wg_commit();
      if (order && wg == 0) named_arrive();
      // Next tile's copies, issued while S is on the tensor cores (zero-filled past kend).
      load_kv(skb + (b ^ 1) * kKVBytes, svb + (b ^ 1) * kKVBytes, k0 + kN);
      asm volatile("cp.async.commit_group;\n" ::);
      wg_wait0();
      fence_acc(s);
      softmax_tile(s, st, k0 + kN - 1 > wg_min_pos || wg_has_pad, k0, tig, pos_lo, pos_hi, sl2);
      rescale_o(o, st);
      uint32_t pa[8][4];
      pack_p(s, pa);
      wg_fence();
      fence_acc(o);
      issue_pv(o, pa, svb + b * kKVBytes);
      wg_commit();
      wg_wait0();
      fence_acc(o);
    }
  } else {
    // Iteration t: K_t and V_{t-1} are resident; K_{t+1} and V_t are copied meanwhile. Fully
    // masked tiles are computed like the others (their P is 0) so the schedule stays uniform.
    // Tile 0 (peeled: no P V yet, so the loop body issues the same wgmmas every time).
    uint32_t pa[8][4];
    tile_ready();
    if (order && wg == 1) named_sync();
    wg_fence();
    issue_s(s, sq, skb);
    wg_commit();
    if (order && wg == 0) named_arrive();
    load_tile(kc, skb + kKVBytes, kN);  // K_1 (zero-filled past kend)
    load_tile(vc, svb, 0);              // V_0
    asm volatile("cp.async.commit_group;\n" ::);
    wg_wait0();
    fence_acc(s);
    softmax_tile(s, st, kN - 1 > wg_min_pos || wg_has_pad, 0, tig, pos_lo, pos_hi, sl2);
    pack_p(s, pa);
    for (int t = 1; t < ntiles; ++t) {
      const int k0 = t * kN, b = t & 1;
      tile_ready();  // K_t, V_{t-1} visible; K_{t-1} and V_{t-2} no longer read by anyone
      rescale_o(o, st);  // by the factor of tile t - 1's softmax
      if (order && wg == 1) named_sync();
      wg_fence();
      fence_acc(o);
      issue_s(s, sq, skb + b * kKVBytes);
      wg_commit();
      issue_pv(o, pa, svb + (b ^ 1) * kKVBytes);
      wg_commit();
      if (order && wg == 0) named_arrive();
      // Next copies, issued while the products run: K_{t+1} over K_{t-1}, V_t over V_{t-2}.
      load_tile(kc, skb + (b ^ 1) * kKVBytes, k0 + kN);
      load_tile(vc, svb + b * kKVBytes, k0);
      asm volatile("cp.async.commit_group;\n" ::);
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S_t done, P V may run on
      fence_acc(s);
      softmax_tile(s, st, k0 + kN - 1 > wg_min_pos || wg_has_pad, k0, tig, pos_lo, pos_hi, sl2);
      wg_wait0();  // P_{t-1} V_{t-1} done: pa and o free
      fence_acc(o);
      pack_p(s, pa);
    }
    tile_ready();  // V_{n-1}
    rescale_o(o, st);
    wg_fence();
    fence_acc(o);
    issue_pv(o, pa, svb + ((ntiles - 1) & 1) * kKVBytes);
    wg_commit();
    wg_wait0();
    fence_acc(o);
  }
  asm volatile("cp.async.wait_group 0;\n" ::);

  bf16* out = static_cast<bf16*>(p.out);
  store_o_bf16(o, st, tig, pos_lo >= 0 ? out + (int64_t(q0 + tw + r_lo) * p.Hq + h) * kD : nullptr,
               pos_hi >= 0 ? out + (int64_t(q0 + tw + r_hi) * p.Hq + h) * kD : nullptr);
#endif  // MS_WGMMA_ATTN
}

}  // namespace

bool attention_wgmma_available() {
  static int avail = -1;
  if (avail < 0) {
    int dev = 0, major = 0, flag = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    if (major == 9) CUDA_CHECK(cudaMemcpyFromSymbol(&flag, g_attn_wgmma_compiled, sizeof(int)));
    avail = flag == 1 ? 1 : 0;
  }
  return avail == 1;
}

bool attention_wgmma_supported(const AttnParams& p) {
  return p.D == kD && p.max_query_len >= kRows && p.splits <= 1 && p.Hkv > 0 && p.Hq % p.Hkv == 0 &&
         p.block_size > 0 && (p.block_size & (p.block_size - 1)) == 0 && attention_wgmma_available();
}

bool g_attn_wgmma_overlap = false;  // measured slower (docs/benchmarks.md)
bool g_attn_wgmma_order = true;
bool g_attn_wgmma_mbar = false;

void launch_attention_wgmma(const AttnParams& p, cudaStream_t s) {
  CU_REQUIRE(p.D == kD, "attention_wgmma: head_dim must be 128");
  if (p.T == 0 || p.num_seqs == 0) return;
  if (g_attn_ws) return launch_attention_ws(p, s);
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(attn_wgmma_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    CUDA_CHECK(cudaFuncSetAttribute(attn_wgmma_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    CUDA_CHECK(cudaFuncSetAttribute(attn_wgmma_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes3));
    attr_set = true;
  }
  const int group = p.Hq / p.Hkv;
  const int pair = group % 2 == 0 ? 1 : 0;
  const int qtiles = ceil_div(p.max_query_len, pair ? kRows : kRows * kWG);
  const dim3 grid(pair ? p.Hq / 2 : p.Hq, p.num_seqs * qtiles);
  const int order = g_attn_wgmma_order ? 1 : 0;
  if (g_attn_wgmma_mbar)
    attn_wgmma_kernel<2><<<grid, kThreads, kSmemBytes3, s>>>(p, qtiles, pair, order);
  else if (g_attn_wgmma_overlap)
    attn_wgmma_kernel<1><<<grid, kThreads, kSmemBytes, s>>>(p, qtiles, pair, order);
  else
    attn_wgmma_kernel<0><<<grid, kThreads, kSmemBytes, s>>>(p, qtiles, pair, order);
  CUDA_CHECK_LAUNCH();
}

}  // namespace moeserve::cuda
