// Persistent batch-1 decode layer: one MiniMax-M2 layer in ONE kernel (1 block of 8 warps per
// SM, cooperative launch), phases separated by a grid barrier:
//   P1  residual + moe_in, RMSNorm (every block, into shared memory), q/k/v GEMV
//   P2  QK-norm (full width, each block from the q/k sums) + RoPE + KV write + split-KV
//       attention over (kv head, split) units -> partial softmax states
//   P2b split merge -> attn (bf16) (by default done at the end of P2 instead, by the last split
//       block of each kv head: one grid barrier less); the residual add of P1 is stored here
//   P3  o_proj GEMV
//   P4  residual + o, RMSNorm (every block), router logits (f32 gate, one warp per expert)
//   P5  top-k (every block, redundantly), expert gate/up GEMV
//   P6  SiLU(gate) * up -> down GEMV weighted by the routing weights
//   P7  moe_out = bf16(sum), accumulators cleared
// GEMVs: the weight rows are cut into items of 16 rows x up to 512 columns (FP8 -> f16 on the fly,
// mma.sync m16n8k16 with f32 accumulation as in k_gemv_tc.cu; one block scale per 128-column
// chunk). Each block takes an equal contiguous range of items (perfect balance: no
// dependence on the row count per block), its warps take items round-robin with the next
// item's 16 x 16-byte loads per lane in flight while the current one is computed, partial
// row sums meet in shared memory and each block adds its rows into a global f32 accumulator
// (red.add). The phase after the next barrier reads the sums (rounded to bf16 where the
// unfused ops store bf16). So the sum order differs from the unfused kernels (f32 rounding).
// Weights of the next phase do not depend on this phase: each warp issues its first item's
// loads (q/k/v, o_proj, router gate rows, the first down item) before the barrier before it.
#include "backend/cuda/common/decode_layer_device.cuh"

namespace moeserve::cuda {
namespace {

// Runs layers 0 .. T.n - 1. Between layers of one launch the expert output stays in the f32
// accumulator: the next layer's P1 reads it (rounded to bf16 as moe_out would be) and clears it
// later; only the last layer stores moe_out.
template <int kL>
__global__ void __launch_bounds__(kThreads, 1) decode_layer_kernel(const __grid_constant__ LayerTable<kL> T) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Smem& S = *reinterpret_cast<Smem*>(smem_raw);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nb = gridDim.x;
  const int gtid = blockIdx.x * kThreads + tid, gthreads = nb * kThreads;
  const int nlayers = kL == 1 ? 1 : T.n;

  for (int i = tid; i < kSlots * 16; i += kThreads) S.gacc[i] = 0.f;
  for (int d = tid; d < T.layer[0].rotary_dim / 2; d += kThreads)
    S.inv_freq[d] = float(1.0 / pow(double(T.layer[0].theta), double(2 * d) / double(T.layer[0].rotary_dim)));
  WBuf pre;
#pragma unroll 1
  for (int layer = 0; layer < nlayers; ++layer) {
  // This layer's parameters in shared memory, read through a volatile reference: every use
  // is a fresh shared load, so the ~40 fields are not all held in registers across a phase
  // (which spilled ~1.3 KB per thread with a dynamically indexed parameter table).
  __syncthreads();
  {
    const int* src = reinterpret_cast<const int*>(&T.layer[layer]);
    int* dst = reinterpret_cast<int*>(&S.prm);
    for (int i = tid; i < int(sizeof(DecodeLayerParams) / 4); i += kThreads) dst[i] = src[i];
  }
  __syncthreads();
  const volatile DecodeLayerParams& p = S.prm;
  const DecodeLayerParams& pn = const_cast<const DecodeLayerParams&>(p);  // for helpers (short reads)
  const Ws W = ws_layout(pn);
  const int H = p.H, QW = p.Hq * kD, KW = p.Hkv * kD, G = p.Hq / p.Hkv;
  const bf16* resid = static_cast<const bf16*>(p.residual);
  const bool acc_in = layer > 0;  // moe_in = the previous layer's f32 expert accumulator
  STAMP(13);

  // ---------------- P1: norm + q/k/v ----------------
  const int Jh = items_per_row(H), nch_h = item_chunks(H);  // items per 16-row group for K = H
  int i0, i1;
  item_range((QW + 2 * KW) / 16 * Jh, i0, i1);
  const int i0q = i0, i1q = i1;
  auto qkv_item = [&](int it, int slot) { return qkv_item_of(pn, it, slot); };
  if (layer == 0 && i0 + warp < i1) load_item(qkv_item(i0 + warp, 0), pre);  // (later layers: at the previous one's end)
  pdl_wait();
  {
    // v = bf16(residual + moe_in) (or x_in as given on the first layer); x = bf16(v * r * w).
    if (acc_in || p.moe_in) {
      add_norm_rows<kMaxH / 8 / kThreads + 1>(resid, acc_in ? static_cast<const void*>(W.down) : p.moe_in, acc_in,
                                              static_cast<const bf16*>(p.in_norm), H, p.eps, S.scratch, S.u.xf, S.xh, nullptr);
    } else {
      stage_bf16_h<kMaxH / 8 / kThreads + 1>(static_cast<const bf16*>(p.x_in), S.xh, H);
    }
    __syncthreads();
  }
  gemv_run<true>(i0, i1, Jh, qkv_item, [](int u) { return u; }, S, W.qkv, pre, p.gemv_pf);
  STAMP(0);
  grid_barrier(p.bar, p.fence_barrier);
  STAMP(1);

  // ---------------- P2: QK-norm, RoPE, KV write, split-KV attention ----------------
  // L2 prefetch (a hint; weights only) of what the block reads after attention: its o_proj
  // items and its warps' router gate rows. Attention is latency-bound, HBM otherwise idle.
  if (p.l2_prefetch) {
    const int Jq0 = items_per_row(QW), cols = item_chunks(QW) * 128;
    int o0, o1;
    item_range(H / 16 * Jq0, o0, o1);
    for (int i = tid; i < (o1 - o0) * 16; i += kThreads) {
      const int it = o0 + i / 16, gr = it / Jq0, j = it % Jq0;
      const uint8_t* src = p.wo + int64_t(gr * 16 + i % 16) * QW + j * cols;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(cols) : "memory");
    }
    const int e = warp * nb + blockIdx.x;
    if (lane == 0 && e < p.E)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p.gate + int64_t(e) * H), "r"(H * 4) : "memory");
  }
  const int ctx = __ldg(p.context_lens), newest = ctx - 1;
  const int nsplit = num_splits(ctx, p.max_splits);
  // attn element i (q head i / 128) from the partial softmax states of its kv head's splits.
  auto merge_out = [&](int i) {
    const int hq = i / kD, d = i % kD, kvh = hq / G, r = hq % G;
    float M = -INFINITY;
    for (int s = 0; s < nsplit; ++s) M = fmaxf(M, __ldcg(W.part_ml + ((kvh * nsplit + s) * G + r) * 2));
    float L = 0.f, O = 0.f;
    if (M != -INFINITY)
      for (int s = 0; s < nsplit; ++s) {
        const int u = kvh * nsplit + s;
        const float ms = __ldcg(W.part_ml + (u * G + r) * 2);
        if (ms == -INFINITY) continue;
        const float f = exp2f(ms - M);
        L += __ldcg(W.part_ml + (u * G + r) * 2 + 1) * f;
        O += __ldcg(W.part_o + (int64_t(u) * G + r) * kD + d) * f;
      }
    static_cast<bf16*>(p.attn)[i] = f2bf(L > 0.f ? O / L : 0.f);
  };
  {
    float qss = 0.f, kss = 0.f;
    {
      constexpr int kJ = (kMaxX + 2048) / 4 / kThreads + 1;  // q (<= 6144) and k (<= 2048 assumed) floats
      float4 v[kJ];
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const int g = tid + j * kThreads;
        if (g * 4 < QW + KW) v[j] = __ldcg(reinterpret_cast<const float4*>(W.qkv) + g);
      }
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
        const int g = tid + j * kThreads;
        if (g * 4 >= QW + KW) continue;
        const float a = bfr(v[j].x), b = bfr(v[j].y), c = bfr(v[j].z), d = bfr(v[j].w);
        const float sq = a * a + b * b + c * c + d * d;
        if (g * 4 < QW) qss += sq; else kss += sq;
      }
    }
    qss = block_sum(qss, S.scratch);
    STAMP(14);
    if (p.timing && blockIdx.x == 0 && tid == 0) S.ts[15] = S.ts[14];
    kss = block_sum(kss, S.scratch);
    const float rq = rsqrtf(qss / QW + p.eps), rk = rsqrtf(kss / KW + p.eps);
    const float pos = float(__ldg(p.positions));
    const int half = p.rotary_dim / 2;
    const float qscale = p.scale * 1.4426950408889634f;
    const bf16* qw = static_cast<const bf16*>(p.q_norm);
    const bf16* kw = static_cast<const bf16*>(p.k_norm);
    // x: a staged row (shared memory, f32 sums: rounded to bf16 as the q/k/v GEMV would store).
    auto normed = [&](const float* x, const bf16* w, float r, int d) {
      if (d >= p.rotary_dim) return bfr(bfr(x[d]) * r * bf2f(w[d]));
      const int d0 = d < half ? d : d - half;
      float sn, cs;
      sincosf(pos * S.inv_freq[d0], &sn, &cs);
      const float u = bfr(x[d0]) * r * bf2f(w[d0]), v = bfr(x[d0 + half]) * r * bf2f(w[d0 + half]);
      return bfr(d < half ? u * cs - v * sn : v * cs + u * sn);
    };
    const int64_t row_stride = KW;
    for (int unit = blockIdx.x; unit < p.Hkv * nsplit; unit += nb) {
      const int kvh = unit / nsplit, split = unit % nsplit;
      const int chunk = ((ctx + nsplit - 1) / nsplit + 31) / 32 * 32;
      const int kbeg = split * chunk, kend = min(ctx, kbeg + chunk);
      // One round of loads: q/k/v sums of this kv head, its norm weights, the block table of
      // the key range (entries b0 .. b0 + nbt - 1).
      const int b0 = kbeg / p.block_size;
      const int nbt = kend > kbeg ? (kend - 1) / p.block_size - b0 + 1 : 0;
      const bool bt_smem = nbt <= kMaxBtab;
      {
        float4 qv = make_float4(0.f, 0.f, 0.f, 0.f), kv4 = qv;
        uint4 qn = make_uint4(0, 0, 0, 0), kn4 = qn;
        int btv[kMaxBtab / kThreads];
        const bool hq = tid * 4 < G * kD;
        if (hq) {
          qv = __ldcg(reinterpret_cast<const float4*>(W.qkv + kvh * G * kD) + tid);
        }
        if (tid < kD / 4) kv4 = __ldcg(reinterpret_cast<const float4*>(W.qkv + QW + kvh * kD) + tid);
        else if (tid < kD / 2) kv4 = __ldcg(reinterpret_cast<const float4*>(W.qkv + QW + KW + kvh * kD) + tid - kD / 4);
        if (tid * 8 < G * kD) qn = __ldg(reinterpret_cast<const uint4*>(qw + kvh * G * kD) + tid);
        else if (tid * 8 < G * kD + kD) kn4 = __ldg(reinterpret_cast<const uint4*>(kw + kvh * kD) + tid - G * kD / 8);
#pragma unroll
        for (int j = 0; j < kMaxBtab / kThreads; ++j)
          if (bt_smem && tid + j * kThreads < nbt) btv[j] = __ldg(p.block_table + b0 + tid + j * kThreads);
        if (hq) reinterpret_cast<float4*>(&S.u.at.qraw[0][0])[tid] = qv;
        if (tid < kD / 4) reinterpret_cast<float4*>(S.u.at.kraw)[tid] = kv4;
        else if (tid < kD / 2) reinterpret_cast<float4*>(S.u.at.vraw)[tid - kD / 4] = kv4;
        if (tid * 8 < G * kD) reinterpret_cast<uint4*>(S.u.at.qnw)[tid] = qn;
        else if (tid * 8 < G * kD + kD) reinterpret_cast<uint4*>(S.u.at.knw)[tid - G * kD / 8] = kn4;
#pragma unroll
        for (int j = 0; j < kMaxBtab / kThreads; ++j)
          if (bt_smem && tid + j * kThreads < nbt) S.u.at.btab[tid + j * kThreads] = btv[j];
      }
      __syncthreads();
      // Cache row offset of key j (elements; this kv head).
      auto key_off = [&](int j) {
        const int e = j / p.block_size;
        const int blk = bt_smem ? S.u.at.btab[e - b0] : __ldg(p.block_table + e);
        return (int64_t(blk) * p.block_size + j % p.block_size) * row_stride + kvh * kD;
      };
      for (int i = tid; i < kMaxG * kD; i += kThreads) {
        const int r = i / kD, d = i % kD;
        S.u.at.qs[r][d] = r < G ? normed(S.u.at.qraw[r], S.u.at.qnw + r * kD, rq, d) * qscale : 0.f;
      }
      if (unit == blockIdx.x) STAMP(15);
      const bool has_new = newest >= kbeg && newest < kend;
      if (has_new && tid < kD) {
        const float kn = normed(S.u.at.kraw, S.u.at.knw, rk, tid);
        const float vn = bfr(S.u.at.vraw[tid]);
        S.u.at.knew[tid] = kn, S.u.at.vnew[tid] = vn;
        const int64_t slot = __ldg(p.slots);
        if (slot >= 0 && slot < p.num_slots) {
          static_cast<bf16*>(p.kc)[slot * row_stride + kvh * kD + tid] = f2bf(kn);
          static_cast<bf16*>(p.vc)[slot * row_stride + kvh * kD + tid] = f2bf(vn);
        }
      }
      __syncthreads();
      float m[kMaxG], l[kMaxG], acc[kMaxG][4];
#pragma unroll
      for (int r = 0; r < kMaxG; ++r) {
        m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[r][e] = 0.f;
      }
      // Tiles of 32 keys per warp: the K and V rows are copied into the warp's shared tiles
      // (cp.async, 16 bytes per lane and instruction, two rows per instruction), then lane =
      // key for the scores and lane = 4 dims for P.V. Compact loops: this code runs once per
      // layer on each SM (cold instruction cache), so it is not unrolled over the tile.
      bf16(*kt)[kTileK] = S.u.at.kt[warp];
      bf16(*vt)[kD] = S.u.at.vt[warp];
      const bf16* kcache = static_cast<const bf16*>(p.kc);
      const bf16* vcache = static_cast<const bf16*>(p.vc);
      for (int base = kbeg + warp * 32; base < kend; base += kWarps * 32) {
        const int j = base + lane;
        const bool valid = j < kend;
        const int64_t off = valid ? key_off(j) : 0;
        const int n = min(32, kend - base);
#pragma unroll 4
        for (int i = 0; i < 16; ++i) {
          const int row = 2 * i + (lane >> 4), c16 = lane & 15;
          const int64_t ro = __shfl_sync(0xffffffffu, off, row);
          if (row < n && base + row != newest) {
            cp_async16(&kt[row][c16 * 8], kcache + ro + c16 * 8);
            cp_async16(&vt[row][c16 * 8], vcache + ro + c16 * 8);
          }
        }
        cp_async_wait_all();
        __syncwarp();
        float s[kMaxG];
#pragma unroll
        for (int r = 0; r < kMaxG; ++r) s[r] = 0.f;
        if (valid) {
          const bool nw = j == newest;
#pragma unroll 2
          for (int c = 0; c < kD / 8; ++c) {
            float kf[8];
            if (nw) {
#pragma unroll
              for (int e = 0; e < 8; ++e) kf[e] = S.u.at.knew[c * 8 + e];
            } else {
              const uint4 w = *reinterpret_cast<const uint4*>(&kt[lane][c * 8]);
              const uint32_t ww[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const float2 f = bf16x2_to_f2(ww[e]);
                kf[2 * e] = f.x, kf[2 * e + 1] = f.y;
              }
            }
#pragma unroll
            for (int r = 0; r < kMaxG; ++r) {
              if (r >= G) continue;
              const float4 q0 = *reinterpret_cast<const float4*>(&S.u.at.qs[r][c * 8]);
              const float4 q1 = *reinterpret_cast<const float4*>(&S.u.at.qs[r][c * 8 + 4]);
              s[r] += q0.x * kf[0] + q0.y * kf[1] + q0.z * kf[2] + q0.w * kf[3] + q1.x * kf[4] + q1.y * kf[5] +
                      q1.z * kf[6] + q1.w * kf[7];
            }
          }
        }
        float pr[kMaxG];
#pragma unroll
        for (int r = 0; r < kMaxG; ++r) {
          pr[r] = 0.f;
          if (r >= G) continue;
          const float sv = valid ? s[r] : -INFINITY;
          const float mn = fmaxf(m[r], warp_max(sv));  // finite: lane 0 of a tile is valid
          const float corr = exp2f(m[r] - mn);
          pr[r] = valid ? exp2f(sv - mn) : 0.f;
          l[r] = l[r] * corr + warp_sum(pr[r]);
          m[r] = mn;
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[r][e] *= corr;
        }
#pragma unroll 2
        for (int kk = 0; kk < n; ++kk) {
          float v[4];
          if (base + kk == newest) {
#pragma unroll
            for (int e = 0; e < 4; ++e) v[e] = S.u.at.vnew[4 * lane + e];
          } else {
            const uint2 raw = *reinterpret_cast<const uint2*>(&vt[kk][4 * lane]);
            const float2 a = bf16x2_to_f2(raw.x), b = bf16x2_to_f2(raw.y);
            v[0] = a.x, v[1] = a.y, v[2] = b.x, v[3] = b.y;
          }
#pragma unroll
          for (int r = 0; r < kMaxG; ++r) {
            if (r >= G) continue;
            const float pk = __shfl_sync(0xffffffffu, pr[r], kk);
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][e] = fmaf(pk, v[e], acc[r][e]);
          }
        }
        __syncwarp();  // the tiles are reused by the warp's next tile
      }
#pragma unroll
      for (int r = 0; r < kMaxG; ++r) {
        if (r >= G) continue;
#pragma unroll
        for (int e = 0; e < 4; ++e) S.u.at.po[warp][r][4 * lane + e] = acc[r][e];
        if (lane == 0) S.u.at.pml[warp][r][0] = m[r], S.u.at.pml[warp][r][1] = l[r];
      }
      __syncthreads();
      for (int i = tid; i < G * kD; i += kThreads) {
        const int r = i / kD, d = i % kD;
        float M = -INFINITY;
        for (int w = 0; w < kWarps; ++w) M = fmaxf(M, S.u.at.pml[w][r][0]);
        float L = 0.f, O = 0.f;
        if (M != -INFINITY)
          for (int w = 0; w < kWarps; ++w) {
            const float mw = S.u.at.pml[w][r][0];
            if (mw == -INFINITY) continue;
            const float f = exp2f(mw - M);
            L += S.u.at.pml[w][r][1] * f;
            O += S.u.at.po[w][r][d] * f;
          }
        W.part_o[(int64_t(unit) * G + r) * kD + d] = O;
        if (d == 0) W.part_ml[(unit * G + r) * 2] = M, W.part_ml[(unit * G + r) * 2 + 1] = L;
      }
      if (p.merge_in_attention) {
        // The kv head's last split block to finish merges its G x 128 outputs (threadfence
        // reduction; the counter is back to 0 afterwards).
        __syncthreads();
        if (tid == 0) {
          __threadfence();
          const int last = atomicAdd(W.cnt + kvh, 1) == nsplit - 1;
          if (last) atomicExch(W.cnt + kvh, 0);
          S.flag = last;
        }
        __syncthreads();
        if (S.flag) {
          __threadfence();
          for (int i = tid; i < nsplit * G * 2; i += kThreads) S.u.at.mls[i] = __ldcg(W.part_ml + kvh * nsplit * G * 2 + i);
          __syncthreads();
          for (int i = tid; i < G * kD; i += kThreads) {
            const int r = i / kD, d = i % kD;
            float M = -INFINITY;
            for (int s2 = 0; s2 < nsplit; ++s2) M = fmaxf(M, S.u.at.mls[(s2 * G + r) * 2]);
            float po[kMaxSplits];
#pragma unroll
            for (int s2 = 0; s2 < kMaxSplits; ++s2)
              if (s2 < nsplit) po[s2] = __ldcg(W.part_o + (int64_t(kvh * nsplit + s2) * G + r) * kD + d);
            float L = 0.f, O = 0.f;
            if (M != -INFINITY) {
#pragma unroll
              for (int s2 = 0; s2 < kMaxSplits; ++s2) {
                if (s2 >= nsplit) break;
                const float ms = S.u.at.mls[(s2 * G + r) * 2];
                if (ms == -INFINITY) continue;
                const float f = exp2f(ms - M);
                L += S.u.at.mls[(s2 * G + r) * 2 + 1] * f;
                O += po[s2] * f;
              }
            }
            static_cast<bf16*>(p.attn)[(kvh * G + r) * kD + d] = f2bf(L > 0.f ? O / L : 0.f);
          }
        }
      }
      __syncthreads();  // smem reused by the next unit
    }
  }
  // o_proj items of this block; the first one's loads go out before the barrier.
  const int Jq = items_per_row(QW), nch_q = item_chunks(QW);
  item_range(H / 16 * Jq, i0, i1);
  auto o_item = [&](int it, int slot) {
    const int gr = it / Jq, j = it % Jq;
    Item x;
    x.w = p.wo + int64_t(gr) * 16 * QW, x.s = p.so + (gr * 16 / 128) * (QW / 128), x.K = QW, x.c0 = j * nch_q;
    x.nch = nch_q, x.xoff = 0, x.slot = slot, x.wf = 1.f;
    return x;
  };
  if (i0 + warp < i1) load_item(o_item(i0 + warp, 0), pre);
  STAMP(2);
  grid_barrier(p.bar, p.fence_barrier);
  STAMP(3);

  // ---------------- P2b: split merge (unless done in P2); residual store; q/k/v cleared ----------------
  if (!p.merge_in_attention) {
    for (int i = gtid; i < QW; i += gthreads) merge_out(i);
    grid_barrier(p.bar, p.fence_barrier);
  }
  for (int i = gtid; i < QW + 2 * KW; i += gthreads) W.qkv[i] = 0.f;
  if (acc_in) {
    for (int i = gtid; i < H; i += gthreads) {
      static_cast<bf16*>(p.residual)[i] = f2bf(bf2f(__ldcg(resid + i)) + bfr(__ldcg(W.down + i)));
      W.down[i] = 0.f;
    }
    for (int i = gtid; i < p.top_k * 2 * p.I; i += gthreads) W.up[i] = 0.f;
  } else if (p.moe_in) {
    for (int i = gtid; i < H; i += gthreads)
      static_cast<bf16*>(p.residual)[i] = f2bf(bf2f(__ldcg(resid + i)) + bf2f(__ldcg(static_cast<const bf16*>(p.moe_in) + i)));
  }

  // ---------------- P3: o_proj ----------------
  stage_bf16_h<kMaxX / 8 / kThreads>(static_cast<const bf16*>(p.attn), S.xh, QW);
  __syncthreads();
  gemv_run<true>(i0, i1, Jq, o_item, [](int u) { return u; }, S, W.o, pre, p.gemv_pf);
  STAMP(4);
  // Router gate row of this warp (weights: before the barrier).
  const int ge = warp * nb + blockIdx.x;
  float4 gw[kGateV];
  if (ge < p.E) {
    const float4* g = reinterpret_cast<const float4*>(p.gate + int64_t(ge) * H);
#pragma unroll
    for (int i = 0; i < kGateV; ++i)
      if (i < H / 128) gw[i] = __ldg(g + i * 32 + lane);
  }
  grid_barrier(p.bar, p.fence_barrier);
  STAMP(5);

  // ---------------- P4: residual + o, RMSNorm, router logits ----------------
  {
    add_norm_rows<kMaxH / 8 / kThreads + 1>(resid, W.o, true, static_cast<const bf16*>(p.post_norm), H, p.eps,
                                            S.scratch, S.u.xf, nullptr, S.u.xf);
    __syncthreads();
    if (ge < p.E) {
      float acc = 0.f;
#pragma unroll
      for (int i = 0; i < kGateV; ++i) {
        if (i >= H / 128) break;
        const float4 x = *reinterpret_cast<const float4*>(&S.u.xf[4 * (i * 32 + lane)]);
        acc = fmaf(x.x, gw[i].x, fmaf(x.y, gw[i].y, fmaf(x.z, gw[i].z, fmaf(x.w, gw[i].w, acc))));
      }
      acc = warp_sum(acc);
      if (lane == 0) W.logits[ge] = acc;
    }
  }
  STAMP(6);
  grid_barrier(p.bar, p.fence_barrier);
  STAMP(7);

  // ---------------- P5: top-k (every block), gate/up ----------------
  {
    const int E4 = (p.E + 3) / 4 * 4;
    for (int x = tid; x < E4; x += kThreads) {
      if (x < p.E) {
        const float sc = 1.f / (1.f + expf(-__ldcg(W.logits + x)));
        const float c = sc + (p.bias ? __ldg(p.bias + x) : 0.f);
        S.score[x] = sc;
        S.choice[x] = c == c ? c : -INFINITY;
      } else {
        S.choice[x] = -INFINITY;
      }
    }
    if (tid < 32) S.sel[tid] = 0;
    __syncthreads();
    for (int x = tid; x < p.E; x += kThreads) {
      const float c = S.choice[x];
      int rank = 0;
      for (int j = 0; j < E4; j += 4) {
        const float4 o = *reinterpret_cast<const float4*>(&S.choice[j]);
        rank += (o.x > c || (o.x == c && j < x)) + (o.y > c || (o.y == c && j + 1 < x)) +
                (o.z > c || (o.z == c && j + 2 < x)) + (o.w > c || (o.w == c && j + 3 < x));
      }
      if (rank < p.top_k) S.sel[rank] = x;
    }
    __syncthreads();
    if (warp == 0) {
      const int id = lane < p.top_k ? S.sel[lane] : 0;
      const float sc = lane < p.top_k ? S.score[id] : 0.f;
      const float sum = warp_sum(sc);
      if (lane < p.top_k) {
        const float wgt = sc * (sum > 0.f ? 1.f / sum : 0.f);
        S.ids[lane] = id, S.rw[lane] = wgt;
        S.ep[lane] = p.experts[id];
        if (blockIdx.x == 0) p.ids[lane] = id, p.rw[lane] = wgt;
      }
    }
    __syncthreads();
  }
  // x = the post-attention norm, as f16 for the GEMV.
  for (int i = tid; i < H; i += kThreads) S.xh[i] = to_h(S.u.xf[i]);
  __syncthreads();
  {
    const int gI = p.I / 16;  // 16-row groups per matrix
    item_range(p.top_k * 2 * gI * Jh, i0, i1);
    auto up_item = [&](int it, int slot) {
      const int u = it / Jh, j = it % Jh;
      const int k = u / (2 * gI), mtx = (u / gI) % 2, ig = u % gI;
      const ExpertPtrs& e = S.ep[k];
      Item x;
      x.w = static_cast<const uint8_t*>(mtx ? e.w3 : e.w1) + int64_t(ig) * 16 * H;
      x.s = (mtx ? e.s3 : e.s1) + (ig * 16 / 128) * (H / 128);
      x.K = H, x.c0 = j * nch_h, x.nch = nch_h, x.xoff = 0, x.slot = slot, x.wf = 1.f;
      return x;
    };
    STAMP(8);
    gemv_run<false>(i0, i1, Jh, up_item, [](int u) { return u; }, S, W.up, pre, p.gemv_pf);
    STAMP(9);
  }
  // First down item (experts known): before the barrier.
  const int Ji = items_per_row(p.I), nch_i = item_chunks(p.I), gH = H / 16;
  item_range(p.top_k * gH * Ji, i0, i1);
  const int k_lo = i0 / (gH * Ji);
  auto down_item = [&](int it, int slot) {
    const int u = it / Ji, cs = it % Ji, k = u / gH, gr = u % gH;
    const ExpertPtrs& e = S.ep[k];
    Item x;
    x.w = static_cast<const uint8_t*>(e.w2) + int64_t(gr) * 16 * p.I;
    x.s = e.s2 + (gr * 16 / 128) * (p.I / 128);
    x.K = p.I, x.c0 = cs * nch_i, x.nch = nch_i, x.xoff = (k - k_lo) * p.I, x.slot = slot, x.wf = S.rw[k];
    return x;
  };
  if (i0 + warp < i1) load_item(down_item(i0 + warp, 0), pre);
  grid_barrier(p.bar, p.fence_barrier);
  STAMP(10);

  // ---------------- P6: SiLU * up, down ----------------
  // The residual store (residual + o; nothing reads the residual until the next layer's P1)
  // and o's accumulator cleared.
  for (int i = gtid; i < H; i += gthreads) {
    static_cast<bf16*>(p.residual)[i] = f2bf(bf2f(__ldcg(resid + i)) + bfr(__ldcg(W.o + i)));
    W.o[i] = 0.f;
  }
  if (i1 > i0) {
    const int k_hi = (i1 - 1) / (gH * Ji);
    // act of experts k_lo..k_hi (<= 2 x I <= kMaxX values), 4 at a time, all loads in flight first.
    constexpr int kJ = kMaxX / 4 / kThreads;
    const int n4 = (k_hi - k_lo + 1) * p.I / 4, I4 = p.I / 4;
    float4 gv[kJ], uv[kJ];
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int g4 = tid + j * kThreads;
      if (g4 < n4) {
        const int k = k_lo + g4 / I4, c4 = g4 % I4;
        gv[j] = __ldcg(reinterpret_cast<const float4*>(W.up + (2 * k) * p.I) + c4);
        uv[j] = __ldcg(reinterpret_cast<const float4*>(W.up + (2 * k + 1) * p.I) + c4);
      }
    }
#pragma unroll
    for (int j = 0; j < kJ; ++j) {
      const int g4 = tid + j * kThreads;
      if (g4 >= n4) continue;
      S.xh[4 * g4] = to_h(bfr(silu(gv[j].x) * uv[j].x));
      S.xh[4 * g4 + 1] = to_h(bfr(silu(gv[j].y) * uv[j].y));
      S.xh[4 * g4 + 2] = to_h(bfr(silu(gv[j].z) * uv[j].z));
      S.xh[4 * g4 + 3] = to_h(bfr(silu(gv[j].w) * uv[j].w));
    }
  }
  __syncthreads();
  gemv_run<true>(i0, i1, Ji, down_item, [gH](int u) { return u % gH; }, S, W.down, pre, p.gemv_pf);
  STAMP(11);
  if (layer + 1 < nlayers) {
    // The next layer's first q/k/v item (its weights only; same shapes, so the same item range)
    // before the barrier.
    if (i0q + warp < i1q) load_item(qkv_item_of(T.layer[layer + 1], i0q + warp, 0), pre);
  }
  grid_barrier(p.bar, p.fence_barrier);
  STAMP(12);
  if (p.timing && blockIdx.x == 0 && tid == 0) {  // phase durations of block 0, summed over launches
    for (int i = 0; i <= 12; ++i) p.timing[i] += S.ts[i] - S.ts[i == 0 ? 13 : i - 1];
    p.timing[15] += 1;
    // inside P2: prefetch + q/k sums, staging + normalisation of the first unit, the rest
    p.timing[16] += S.ts[14] - S.ts[1];
    p.timing[17] += S.ts[15] - S.ts[14];
    p.timing[18] += S.ts[2] - S.ts[15];
  }
  if (layer + 1 < nlayers) continue;

  // ---------------- P7 (last layer): moe_out, accumulators cleared ----------------
  // PDL (DecodeLayerParams::pdl): the next kernel may be scheduled from here; it waits for
  // this grid's completion (griddepcontrol.wait) before touching anything this one writes.
  if (p.pdl) pdl_trigger();
  for (int i = gtid; i < H; i += gthreads) {
    static_cast<bf16*>(p.moe_out)[i] = f2bf(__ldcg(W.down + i));
    W.down[i] = 0.f;
  }
  for (int i = gtid; i < p.top_k * 2 * p.I; i += gthreads) W.up[i] = 0.f;
  }  // layers
#endif
}

}  // namespace

int64_t decode_layer_ws_floats(const DecodeLayerParams& p) {
  const int G = p.Hkv > 0 ? p.Hq / p.Hkv : 1;
  return int64_t(p.Hq + 2 * p.Hkv) * kD + p.H + (p.E + 3) / 4 * 4 + int64_t(p.top_k) * 2 * p.I + p.H +
         int64_t(p.Hkv) * kMaxSplits * G * (kD + 2) + p.Hkv;
}

const char* decode_layer_unsupported(const DecodeLayerParams& p, int grid) {
  if (code_arch() < 900) return "needs sm_90 code";
  if (grid < 1) return "no grid";
  if (p.Hkv <= 0 || p.Hq % p.Hkv || p.Hq / p.Hkv > kMaxG) return "GQA group > 8";
  if (p.H % 128 || p.H > kMaxH) return "hidden size";
  if (p.Hq * kD > kMaxX) return "q width";
  if (p.Hkv * kD > 2048) return "kv width";
  if (p.I % 128 || 2 * p.I > kMaxX) return "expert intermediate size";
  if (p.E < 1 || p.E > kMaxE || p.top_k < 1 || p.top_k > kMaxK || p.top_k > p.E) return "experts / top_k";
  if (p.rotary_dim % 2 || p.rotary_dim > kD) return "rotary_dim";
  if (p.max_splits < 1 || p.max_splits > kMaxSplits) return "splits";
  if (int64_t(p.E) > int64_t(kWarps) * grid) return "router rows > warps";
  // Shared accumulators per phase: ceil(items per block / items per unit) + 1 units.
  const int H = p.H, QW = p.Hq * kD, KW = p.Hkv * kD;
  const int jh = items_per_row(H), jq = items_per_row(QW), ji = items_per_row(p.I);
  const int64_t phases[4][2] = {{int64_t(QW + 2 * KW) / 16 * jh, jh},
                                {int64_t(H) / 16 * jq, jq},
                                {int64_t(p.top_k) * 2 * (p.I / 16) * jh, jh},
                                {int64_t(p.top_k) * (H / 16) * ji, ji}};
  for (const auto& ph : phases)
    if ((ph[0] + grid - 1) / grid / ph[1] + 2 > kSlots) return "too many rows per block";
  // Down: a block's items span at most two experts (the act buffer holds two).
  if ((int64_t(p.top_k) * (H / 16) * ji + grid - 1) / grid > int64_t(H / 16) * ji)
    return "grid too small";
  return "";
}

int decode_layer_blocks_per_sm() {
  static std::atomic<uint64_t> attr_set{0};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = uint64_t(1) << (dev & 63);
  if (!(attr_set.load() & bit)) {
    CUDA_CHECK(cudaFuncSetAttribute(decode_layer_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Smem))));
    attr_set.fetch_or(bit);
  }
  int n = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, decode_layer_kernel<1>, kThreads, sizeof(Smem)));
  return n;
}

namespace {
template <int kL>
void launch_table(const LayerTable<kL>& t, int grid, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = sizeof(Smem);
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  int na = 1;
  if (t.layer[0].pdl && pdl_enabled()) {
    attr[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[na].val.programmaticStreamSerializationAllowed = 1;
    ++na;
  }
  cfg.attrs = attr;
  cfg.numAttrs = na;
  CUDA_CHECK(cudaLaunchKernelEx(&cfg, decode_layer_kernel<kL>, t));
}
}  // namespace

void launch_decode_layer(const DecodeLayerParams& p, int grid, cudaStream_t s) {
  LayerTable<1> t;
  t.layer[0] = p;
  t.n = 1;
  launch_table(t, grid, s);
}

}  // namespace moeserve::cuda
