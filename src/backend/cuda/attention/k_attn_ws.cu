// Warp-specialised Hopper (sm_90a) causal prefill attention, head_dim 128 (FlashAttention-3's
// schedule, written for the paged bf16 cache); same contract as k_attn_wgmma.cu: query i of a
// sequence with `qlen` new tokens and `ctx` cached tokens sits at position ctx - qlen + i and
// sees keys [0, pos]; keys live in 16-token (any power of two) blocks scattered by the block
// table.
//
// Block = 3 warpgroups (384 threads):
// - warpgroup 0, producer (104 registers after setmaxnreg): copies each work item's Q, then
//   every K and V tile (128 keys x 128 dims, 32 KB each) global -> shared with cp.async (one
//   16-byte copy per (key, 8 dims); for block sizes 16 .. 128 each 16-key group's block id is
//   read once for K and V, other powers of two read the table per key) into a ring of kStages
//   K buffers and kStages V buffers. Completion: cp.async.mbarrier.arrive on the buffer's
//   "full" mbarrier; the consumers free a buffer through its "empty" mbarrier. K and V have
//   separate barriers, so S of tile t can start before V of tile t has landed. Opt-in
//   (kTma): 16-key groups inside the causal range by TMA boxes instead (measured slower).
// - warpgroups 1, 2, consumers (200 registers): 64 query rows each. Even GQA groups: two query
//   heads of one KV head over the same 64 tokens; otherwise one head over 128 tokens. Both
//   consumers walk the same key tiles (the block's causal range; tiles past a consumer's own
//   diagonal are fully masked, which only the odd-group case has), so the schedules match.
// Per consumer and step t (FlashAttention-3's intra-warpgroup overlap, kOverlap):
//   issue S_t = Q K_t^T (8 x wgmma m64n128k16, smem x smem) and O += P_{t-1} V_{t-1}
//   (8 x wgmma, P from registers); wait for S_t only; softmax of S_t (online, base 2) while
//   P V is still on the tensor cores; wait for P V; P_t = bf16(S_t) in registers.
//   O is rescaled by tile t's factor just before P_t V_t is issued.
// Without kOverlap the step issues P_{t-1} V_{t-1} and S_t back to back and waits for both.
// Ping-pong (pp): named barriers 1 and 2 make the consumers issue their steps' products in
// turn, so one consumer's softmax runs while the other's products occupy the tensor cores.
// Shared layout as in k_attn_wgmma.cu (128-byte swizzle, two 64-dim halves per operand).
// Epilogue: O / l as bf16 and, with q8 (launch_attention_ws_q8, prefill), also quantised to
// FP8 per (token, head) for the o_proj GEMM (attn_wgmma.cuh store_o_fp8), so o_proj skips its
// quantisation pass over [T, Hq * 128].
#include <cuda.h>
#include <cudaTypedefs.h>

#include "backend/cuda/attention/attn_wgmma.cuh"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/common/kernels_prefill.h"
#include "backend/cuda/linear/wgmma.cuh"

namespace moeserve::cuda {
namespace {

using namespace attn_wg;
constexpr int kConsumers = 2, kThreadsWs = 128 * (kConsumers + 1);
// Registers per thread after setmaxnreg. The block starts with 168 per thread (the
// __launch_bounds__ cap for 384 threads, which ptxas uses); the consumers' increase is
// served only from what the producer gives back, so the sum may not exceed 3 x 168 (with
// more, setmaxnreg.inc waits forever). The producer needs ~100 without spilling.
constexpr int kProducerRegs = 104, kConsumerRegs = 200;
static_assert(kProducerRegs + kConsumers * kConsumerRegs <= (kConsumers + 1) * 168, "register budget");
constexpr int ws_smem_bytes(int stages) { return kConsumers * kQBytes + 2 * stages * kKVBytes + 1024; }

#ifdef MS_WGMMA_ATTN
__device__ __forceinline__ void pp_sync(int id) { asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory"); }
__device__ __forceinline__ void pp_arrive(int id) { asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory"); }
// Arrive on `bar` and expect `bytes` more from bulk copies in this phase.
__device__ __forceinline__ void mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// TMA: box {64 dims, 16 rows} at (x, y) of a cache tensor map -> dst (2 KB, 128-byte swizzle).
__device__ __forceinline__ void tma_box(uint32_t dst, const CUtensorMap* map, int x, int y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}
#endif

// Work item w (of nhg * num_seqs * qtiles): head group w % nhg, then sequence, then query
// tile (last tiles of every sequence first: they see the most keys). The grid walks the
// items in rounds of gridDim.x; a persistent grid (one block per SM) lets the producer load
// the next item's Q and K/V while the consumers finish the previous one. hp: query heads per item (2: GQA pair mode, 1: one head,
// 128 tokens). pp: ping-pong order.
template <bool kOverlap, int kStages, bool kTma, bool kQ8>
__global__ void __launch_bounds__(kThreadsWs, 1) attn_ws_kernel(AttnParams p, int qtiles, int hp, int pp, int page_loader,
                                                                const __grid_constant__ CUtensorMap kmap,
                                                                const __grid_constant__ CUtensorMap vmap,
                                                                const AttnQ8Out q8) {
#ifdef MS_WGMMA_ATTN
  // bars: [0] Q full, [1] Q empty, [2 + s] K full, [2 + S + s] V full, [2 + 2S + s] K empty,
  // [2 + 3S + s] V empty.
  __shared__ __align__(8) uint64_t bars[2 + 4 * kStages];
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const uint32_t sbase = (uint32_t(__cvta_generic_to_shared(smem_raw)) + 1023u) & ~1023u;
  const uint32_t sQ = sbase, sK = sbase + kConsumers * kQBytes, sV = sK + kStages * kKVBytes;
  const uint32_t bar0 = uint32_t(__cvta_generic_to_shared(&bars[0]));
  const uint32_t qfull = bar0, qempty = bar0 + 8;
  auto kfull = [&](int s) { return bar0 + 8 * (2 + s); };
  auto vfull = [&](int s) { return bar0 + 8 * (2 + kStages + s); };
  auto kempty = [&](int s) { return bar0 + 8 * (2 + 2 * kStages + s); };
  auto vempty = [&](int s) { return bar0 + 8 * (2 + 3 * kStages + s); };

  const int tid = threadIdx.x, wg = tid >> 7;
  const int nhg = p.Hq / hp, rows_blk = kRows * (kConsumers / hp);
  const int total = nhg * p.num_seqs * qtiles;
  if (tid == 0) {
    mbar_init(qfull, 128);
    mbar_init(qempty, 128 * kConsumers);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(kfull(s), kTma ? 129 : 128);  // TMA: + thread 0's arrive.expect_tx
      mbar_init(vfull(s), kTma ? 129 : 128);
      mbar_init(kempty(s), 128 * kConsumers);
      mbar_init(vempty(s), 128 * kConsumers);
    }
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();

  // Round i of a persistent grid: blocks take items i G .. i G + G - 1 (G = gridDim.x), in
  // reverse block order on odd rounds, so that each block's sum of item lengths (longest
  // first) stays close to the others'.
  auto next_item = [&](int i) { return i * int(gridDim.x) + (i & 1 ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x)); };
  // Item geometry, the same in every warpgroup (so all skip the same empty items).
  struct Item {
    int seq, q0, qlen, off, tok0, h0, kvh, kend, ntiles;
  };
  auto item = [&](int w, Item& it) {
    const int hg = w % nhg, tile_id = w / nhg;
    it.seq = tile_id % p.num_seqs;
    const int qt = qtiles - 1 - tile_id / p.num_seqs;
    it.q0 = p.query_start[it.seq];
    it.qlen = p.query_start[it.seq + 1] - it.q0;
    it.tok0 = qt * rows_blk;
    if (it.tok0 >= it.qlen) return false;
    it.off = p.context_lens[it.seq] - it.qlen;
    it.h0 = hg * hp;
    it.kvh = it.h0 / (p.Hq / p.Hkv);  // hp divides the group size
    it.kend = it.off + min(it.qlen, it.tok0 + rows_blk);  // keys [0, kend) are visible to some row
    it.ntiles = (it.kend + kN - 1) / kN;
    return true;
  };

  if (wg == 0) {
    // ---------------- producer ----------------
    sm90::setmaxnreg_dec<kProducerRegs>();
    const int c = tid & 15;  // 16-byte chunk of a 256-byte row
    const uint32_t cofs = (c >> 3) * (kN * 128);
    const int row_stride = p.Hkv * kD;
    const int bs_shift = __ffs(p.block_size) - 1, bs_mask = p.block_size - 1;
    const bool paged16 = page_loader && p.block_size >= 16 && p.block_size <= kN;
    const int64_t page_elems = int64_t(p.block_size) * row_stride;
    int items = 0, r = 0;  // items and K/V tiles loaded so far (ring position)
    for (int round = 0, w = blockIdx.x; w < total; w = next_item(++round)) {
      Item it;
      if (!item(w, it)) continue;
      // Q of both consumers, once the previous item's last S products are done.
      mbar_wait(qempty, (items & 1) ^ 1);  // a fresh barrier passes parity 1
      {
        const bf16* qb = static_cast<const bf16*>(p.q);
#pragma unroll
        for (int cw = 0; cw < kConsumers; ++cw) {
          const int h = it.h0 + cw % hp, tw = it.tok0 + kRows * (cw / hp);
#pragma unroll
          for (int j = 0; j < kRows / 8; ++j) {
            const int rr = (tid >> 4) + 8 * j, tok = tw + rr;
            const bool ok = tok < it.qlen;
            const bf16* src = qb + (ok ? (int64_t(it.q0 + tok) * p.Hq + h) * kD + c * 8 : 0);
            cp_async16(sQ + cw * kQBytes + (c >> 3) * (kRows * 128) + swz(rr, c & 7), src, ok);
          }
        }
        mbar_arrive_cp(qfull);
      }
      ++items;
      const bf16* kc = static_cast<const bf16*>(p.k_cache) + it.kvh * kD + c * 8;
      const bf16* vc = static_cast<const bf16*>(p.v_cache) + it.kvh * kD + c * 8;
      const int32_t* table = p.block_tables + int64_t(it.seq) * p.max_blocks_per_seq;
      for (int t = 0; t < it.ntiles; ++t, ++r) {
        const int s = r % kStages;
        const uint32_t par = ((r / kStages) & 1) ^ 1;
        const int k0 = t * kN;
        if (paged16) {
          // Block size 16 .. 128: keys 16 m + (tid >> 4) and that + 8 share a KV block, whose
          // id is read once for K and V (8 table reads per tile instead of 32), and a key's
          // row inside its block does not depend on the tile (k0 is a multiple of 128).
          // With TMA (kTma), groups of 16 keys that are all < kend come as one box per
          // 64-dim half, issued by lanes 0 .. 2 nfull - 1 of warp 0 (lane l: group l / 2,
          // half l % 2); the rest (the causal edge) by cp.async with zero-fill.
          const int nfull = kTma ? max(0, min(kN / 16, (it.kend - k0) / 16)) : 0;
          int box_y = 0;
          if constexpr (kTma) {
            if (tid < 2 * nfull) {
              const int key = k0 + 16 * (tid >> 1);
              box_y = table[key >> bs_shift] * p.block_size + (key & bs_mask);
            }
          }
          int blk[kN / 16];
#pragma unroll
          for (int m = 0; m < kN / 16; ++m) {
            const int key = k0 + 16 * m + (tid >> 4);
            if constexpr (kTma)
              blk[m] = m >= nfull && key < it.kend ? table[key >> bs_shift] : 0;
            else
              blk[m] = key < it.kend ? table[key >> bs_shift] : 0;
          }
          auto load = [&](const bf16* cache, const CUtensorMap* map, uint32_t dst, uint32_t bar) {
            if constexpr (kTma) {
              if (tid < 32) {
                if (tid == 0) mbar_arrive_tx(bar, uint32_t(nfull) * 4096u);
                __syncwarp();
                if (tid < 2 * nfull)
                  tma_box(dst + (tid & 1) * (kN * 128) + (tid >> 1) * 2048, map, it.kvh * kD + (tid & 1) * 64, box_y, bar);
              }
            }
#pragma unroll
            for (int m = 0; m < kN / 16; ++m) {
              if (kTma && m < nfull) continue;
              const bf16* page = cache + int64_t(blk[m]) * page_elems;
#pragma unroll
              for (int e = 0; e < 2; ++e) {
                const int kk = 16 * m + (tid >> 4) + 8 * e;
                cp_async16(dst + cofs + swz(kk, c & 7), page + (kk & bs_mask) * row_stride, k0 + kk < it.kend);
              }
            }
          };
          mbar_wait(kempty(s), par);
          load(kc, &kmap, sK + s * kKVBytes, kfull(s));
          mbar_arrive_cp(kfull(s));
          mbar_wait(vempty(s), par);
          load(vc, &vmap, sV + s * kKVBytes, vfull(s));
          mbar_arrive_cp(vfull(s));
        } else {
          // Any other power of two: keys (tid >> 4) + 8 j, j < 16, the table read per key.
          auto load = [&](const bf16* cache, uint32_t dst) {
#pragma unroll 4
            for (int j = 0; j < kN / 8; ++j) {
              const int kk = (tid >> 4) + 8 * j, key = k0 + kk;
              const bool ok = key < it.kend;
              const int64_t o = ok ? (int64_t(table[key >> bs_shift]) * p.block_size + (key & bs_mask)) * row_stride : 0;
              cp_async16(dst + cofs + swz(kk, c & 7), cache + o, ok);
            }
          };
          mbar_wait(kempty(s), par);
          load(kc, sK + s * kKVBytes);
          mbar_arrive_cp(kfull(s));
          mbar_wait(vempty(s), par);
          load(vc, sV + s * kKVBytes);
          mbar_arrive_cp(vfull(s));
        }
      }
    }
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    return;
  }

  // ---------------- consumers ----------------
  sm90::setmaxnreg_inc<kConsumerRegs>();
  const int cw = wg - 1, ltid = tid & 127;
  const int lane = tid & 31, wl = ltid >> 5, g = lane >> 2, tig = lane & 3;
  const float sl2 = p.scale * 1.4426950408889634f;
  const int r_lo = wl * 16 + g, r_hi = r_lo + 8;
  const uint32_t sq = sQ + cw * kQBytes;
  const int my_bar = 1 + cw, other_bar = 1 + (cw ^ 1);
  auto wait_k = [&](int r) { mbar_wait(kfull(r % kStages), (r / kStages) & 1); };
  auto wait_v = [&](int r) { mbar_wait(vfull(r % kStages), (r / kStages) & 1); };
  auto free_k = [&](int r) { mbar_arrive(kempty(r % kStages)); };
  auto free_v = [&](int r) { mbar_arrive(vempty(r % kStages)); };
  int items = 0, r0 = 0;  // items done, ring position of this item's tile 0
  for (int round = 0, w = blockIdx.x; w < total; w = next_item(++round)) {
    Item it;
    if (!item(w, it)) continue;
    const int ntiles = it.ntiles;
    const int h = it.h0 + cw % hp, tw = it.tok0 + kRows * (cw / hp);
    const int wg_min_pos = it.off + tw;
    const bool wg_has_pad = tw + kRows > it.qlen;
    const int pos_lo = tw + r_lo < it.qlen ? it.off + tw + r_lo : -1;
    const int pos_hi = tw + r_hi < it.qlen ? it.off + tw + r_hi : -1;
    auto need_mask = [&](int t) { return t * kN + kN - 1 > wg_min_pos || wg_has_pad; };

    float o[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) o[i] = 0.f;
    RowState st;
    float s[64];
    uint32_t pa[8][4];

    mbar_wait(qfull, items & 1);
    if (pp && cw == 1) pp_arrive(1);  // consumer 0 issues first
    // Step 0: S_0 only.
    wait_k(r0);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // cp.async writes -> wgmma reads
    if (pp) pp_sync(my_bar);
    wg_fence();
    issue_s(s, sq, sK + (r0 % kStages) * kKVBytes);
    wg_commit();
    if (pp) pp_arrive(other_bar);
    wg_wait0();
    fence_acc(s);
    free_k(r0);
    if (ntiles == 1) mbar_arrive(qempty);
    softmax_tile(s, st, need_mask(0), 0, tig, pos_lo, pos_hi, sl2);
    pack_p(s, pa);
    // Steps 1 .. ntiles - 1: S_t and P_{t-1} V_{t-1}.
    for (int t = 1; t < ntiles; ++t) {
      const int r = r0 + t;
      wait_k(r);
      wait_v(r - 1);
      asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
      rescale_o(o, st);  // by tile t - 1's factor, before P_{t-1} V_{t-1} accumulates
      if (pp) pp_sync(my_bar);
      wg_fence();
      fence_acc(o);
      const uint32_t kb = sK + (r % kStages) * kKVBytes, vb = sV + ((r - 1) % kStages) * kKVBytes;
      if constexpr (kOverlap) {
        issue_s(s, sq, kb);
        wg_commit();
        issue_pv(o, pa, vb);
        wg_commit();
      } else {
        issue_pv(o, pa, vb);
        issue_s(s, sq, kb);
        wg_commit();
      }
      if (pp) pp_arrive(other_bar);
      if constexpr (kOverlap) {
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");  // S_t done; P V runs on
        fence_acc(s);
        free_k(r);
        if (t == ntiles - 1) mbar_arrive(qempty);
        softmax_tile(s, st, need_mask(t), t * kN, tig, pos_lo, pos_hi, sl2);
        wg_wait0();  // P_{t-1} V_{t-1} done: pa and V_{t-1} free
        fence_acc(o);
        free_v(r - 1);
      } else {
        wg_wait0();
        fence_acc(s);
        fence_acc(o);
        free_k(r);
        free_v(r - 1);
        if (t == ntiles - 1) mbar_arrive(qempty);
        softmax_tile(s, st, need_mask(t), t * kN, tig, pos_lo, pos_hi, sl2);
      }
      pack_p(s, pa);
    }
    // Last step: P_{n-1} V_{n-1}.
    const int rl = r0 + ntiles - 1;
    wait_v(rl);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    rescale_o(o, st);
    if (pp) pp_sync(my_bar);
    wg_fence();
    fence_acc(o);
    issue_pv(o, pa, sV + (rl % kStages) * kKVBytes);
    wg_commit();
    if (pp && cw == 0) pp_arrive(other_bar);  // consumer 1 arrived once at the start instead
    wg_wait0();
    fence_acc(o);
    free_v(rl);
    ++items;
    r0 += ntiles;

    const int64_t t_lo = it.q0 + tw + r_lo, t_hi = it.q0 + tw + r_hi;
    bf16* out_lo = pos_lo >= 0 ? static_cast<bf16*>(p.out) + (t_lo * p.Hq + h) * kD : nullptr;
    bf16* out_hi = pos_hi >= 0 ? static_cast<bf16*>(p.out) + (t_hi * p.Hq + h) * kD : nullptr;
    store_o_bf16(o, st, tig, out_lo, out_hi);
    if constexpr (kQ8) {  // o_proj's FP8 input too (one quantisation group per (token, head))
      quant_row_quad(out_lo, tig, q8.q + (t_lo * p.Hq + h) * kD, q8.s_tok + int64_t(h) * p.T + t_lo,
                     q8.s_row + t_lo * p.Hq + h);
      quant_row_quad(out_hi, tig, q8.q + (t_hi * p.Hq + h) * kD, q8.s_tok + int64_t(h) * p.T + t_hi,
                     q8.s_row + t_hi * p.Hq + h);
    }
  }
#endif  // MS_WGMMA_ATTN
}

template <bool kOverlap, int kStages, bool kTma, bool kQ8 = false>
void launch_ws(const AttnParams& p, int qtiles, int hp, int grid, const CUtensorMap& kmap, const CUtensorMap& vmap,
               const AttnQ8Out& q8, cudaStream_t s) {
  static bool attr_set = false;
  if (!attr_set) {
    CUDA_CHECK(cudaFuncSetAttribute(attn_ws_kernel<kOverlap, kStages, kTma, kQ8>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, ws_smem_bytes(kStages)));
    attr_set = true;
  }
  attn_ws_kernel<kOverlap, kStages, kTma, kQ8><<<grid, kThreadsWs, ws_smem_bytes(kStages), s>>>(
      p, qtiles, hp, /*ping-pong*/ 1, /*page loader*/ 1, kmap, vmap, q8);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

// The default variant is the only one built: intra-warpgroup overlap, 2-deep K/V ring by
// cp.async (no TMA), ping-pong consumers, page loader, persistent grid. The other variants
// (sequential softmax, no ping-pong, 3 stages, one block per item, the generic loader, TMA,
// the FP8 epilogue) measured slower or no faster: docs/bench/cuda_switch_inventory.md.
void launch_attention_ws(const AttnParams& p, cudaStream_t s) {
  CU_REQUIRE(p.D == kD, "attention_ws: head_dim must be 128");
  if (p.T == 0 || p.num_seqs == 0) return;
  const int group = p.Hq / p.Hkv;
  const int hp = group % 2 == 0 ? 2 : 1;
  const int qtiles = ceil_div(p.max_query_len, kRows * (kConsumers / hp));
  const int total = p.Hq / hp * p.num_seqs * qtiles;
  static int sms = 0;
  if (sms == 0) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  }
  const int grid = std::min(total, sms);
  CUtensorMap kmap{}, vmap{};
  launch_ws<true, 2, false>(p, qtiles, hp, grid, kmap, vmap, AttnQ8Out{}, s);
}

}  // namespace moeserve::cuda
