// Host-side launchers of the CUDA backend's kernels. Plain C++ declarations so that
// cuda_backend.cpp (and tests) need no device code. All launchers are asynchronous on
// `stream`, allocate nothing and never synchronise, so a sequence of them can be
// captured into a CUDA graph. Pointers are device pointers; "act" buffers are bf16 when
// the matching *_bf16 flag is set, f32 otherwise.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace moeserve::cuda {

__host__ __device__ inline int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// ---- elementwise (k_elementwise.cu) ----
void launch_embedding(const void* table, bool table_bf16, const int32_t* ids, int T, int H,
                      int vocab, void* out, bool out_bf16, cudaStream_t s);
// residual == nullptr: out = rmsnorm(x) * w. Otherwise residual += x; out = rmsnorm(residual) * w.
struct RmsNormParams {
  const void* x = nullptr;
  bool x_bf16 = true;
  void* residual = nullptr;
  bool residual_bf16 = true;
  const void* weight = nullptr;
  bool weight_bf16 = true;
  void* out = nullptr;
  bool out_bf16 = true;
  int rows = 0, cols = 0;
  float eps = 1e-6f;
};
void launch_rms_norm(const RmsNormParams& p, cudaStream_t s);
void launch_add(const void* a, bool a_bf16, const void* b, bool b_bf16, void* out, bool out_bf16,
                int64_t n, cudaStream_t s);
void launch_row_sum_squares(const void* x, bool x_bf16, int rows, int cols, float* out,
                            cudaStream_t s);
struct QkNormRopeParams {
  void* q = nullptr;  // [T, q_width] act
  void* k = nullptr;  // [T, k_width] act
  bool act_bf16 = true;
  const void* q_w = nullptr;
  const void* k_w = nullptr;
  bool w_bf16 = true;
  const int32_t* positions = nullptr;
  const float* q_sumsq = nullptr;  // optional [T]
  const float* k_sumsq = nullptr;
  int T = 0, q_width = 0, k_width = 0;
  int64_t q_full = 0, k_full = 0;  // widths the mean is taken over
  int head_dim = 0, rotary_dim = 0;
  float theta = 10000.f, eps = 1e-6f;
  // Optional fused KV write (kc != null): k (after norm + RoPE) and v [T, k_width] into the
  // caches [num_slots, k_width] at slots[t] (negative / out of range: skipped).
  const void* v = nullptr;
  void* kc = nullptr;
  void* vc = nullptr;
  bool cache_bf16 = true;
  // FP8 KV cache (--kv-cache-dtype fp8): the caches hold e4m3(x / scale) (core/fp8_e4m3.h);
  // cache_bf16 is then false. The kernels that do not store e4m3 refuse it in their supported().
  bool cache_fp8 = false;
  float k_scale = 1.f, v_scale = 1.f;
  const int32_t* slots = nullptr;
  int64_t num_slots = 0;
  // Prefill (T >= kQkRopeVecMinTokens): the 16-byte-load kernel (k_rope_prefill.cu) where it
  // applies (CudaTuning::qk_rope_vec).
  bool rope_vec = true;
};
void launch_qk_norm_rope(const QkNormRopeParams& p, cudaStream_t s);
// __CUDA_ARCH__ of the code the current device runs (e.g. 800 for the sm_80 SASS or the
// compute_80 PTX, 900 for sm_90/sm_90a), 0 when there is none; cached per device (k_arch.cu).
// Feature dispatch (FP8 mma.sync >= 890, PDL and clusters >= 900) must use this, not the
// device's compute capability.
int code_arch();
// True when that code is sm_90a (wgmma and the other arch-specific features compiled in).
bool code_has_sm90a();
// The cache side of a KV write: bf16 / f32, or e4m3(x / scale) with the layer's scales.
struct KvStoreSpec {
  bool bf16 = true;
  bool fp8 = false;
  float k_scale = 1.f, v_scale = 1.f;
};
// Copies k/v rows [T, width] into caches [slots, width] at slot_mapping (negative = skip).
void launch_write_kv(const void* k, const void* v, bool src_bf16, void* kc, void* vc, const KvStoreSpec& cache,
                     const int32_t* slot_mapping, int T, int width, int64_t num_slots, cudaStream_t s);

// ---- linear layers (k_gemv.cu, k_gemm.cu) ----
// One local expert's weights (device pointers) for the MoE kernels.
struct ExpertPtrs {
  const void* w1;
  const void* w3;
  const void* w2;
  const float* s1;
  const float* s3;
  const float* s2;
};

enum class LinMode : int {
  kStore = 0,   // out[r, n] = acc
  kSwiglu = 1,  // out[r, i] = silu(x W1[i]) * (x W3[i]) (MoE gate/up; bf16 out)
  kDown = 2,    // out[r, n] = acc * row_scale[r] (MoE down; f32 out)
};

struct LinParams {
  LinMode mode = LinMode::kStore;
  // Activations: row r of the problem reads x[(x_rows ? x_rows[r] : r) * ldx + k].
  const void* x = nullptr;  // bf16
  int ldx = 0;
  const int32_t* x_rows = nullptr;
  int M = 0;  // rows (tokens, or sorted (token, expert) pairs)
  // Weights: a single matrix (experts == nullptr) or the tile's expert from `experts`.
  const void* w = nullptr;  // [N, K]
  const float* s = nullptr;  // block scales [ceil(N/bo), s_cols]
  const ExpertPtrs* experts = nullptr;
  bool fp8 = true;  // false: bf16 weights
  // Tensor-core GEMV weight loads: 0 ld.global.nc, 1 (default) + L1::no_allocate + L2::256B
  // prefetch hint (the neighbouring 128-byte chunk, read by the next warp; -4 us per layer at
  // batch 1 on the H200). Only the default is built (k_gemv_tc.cu); the field stays (always 1,
  // read by no kernel) so LinParams keeps its layout: the benchmarked kernels' parameter
  // offsets, hence their SASS, are unchanged (checked with cuobjdump against 420258f).
  int ld_hint = 1;
  int N = 0, K = 0;  // N = output columns (for kSwiglu: I, the rows of W1 and of W3)
  int bo = 128, bi = 128, s_cols = 0;
  // Tile table (MoE): tile t covers sorted rows [tile_begin[t], tile_end[t]) of expert
  // tile_expert[t]; *num_tiles tiles are valid, grid covers max_tiles. When null, tiles are
  // consecutive chunks of M rows.
  const int32_t* tile_expert = nullptr;
  const int32_t* tile_begin = nullptr;
  const int32_t* tile_end = nullptr;
  const int32_t* num_tiles = nullptr;
  int max_tiles = 0;
  int tile_rows = 64;  // rows per table tile (kGemmTileM; kFp8PairTileM for the wgmma 128 x 256 tiles)
  // Output
  void* out = nullptr;
  int ldo = 0;
  bool out_f32 = false;
  const float* row_scale = nullptr;  // kDown
  // The fused quantising epilogue's outputs (k_gemm_fp8_wgmma.cu's QOUT, not built: measured
  // slower than the separate quantisation); every launcher refuses out_q != null.
  uint8_t* out_q = nullptr;
  float* out_qs = nullptr;
  // launch_gemm_fp8: the Hopper wgmma kernel where it applies (select_fp8_gemm; the backend
  // sets it from its choice, CudaTuning::fp8_gemm_wgmma), else the mma.sync kernel.
  bool fp8_wgmma = true;
  bool tc = true;  // GEMV: tensor-core FP8 path (k_gemv_tc.cu) where gemv_tc_supported
  // Direct pair tiles (MoE decode at very few tokens; tensor-core GEMV only; no align step):
  // tile t (grid.y = T * top_k) is routing pair t, one row, expert pair_ids[t] - first_local.
  // A non-local expert: kSwiglu skips the tile, kDown writes a zero row. Activation row of
  // row r: r / x_row_div (kSwiglu: the token; kDown: the pair's intermediate row).
  const int32_t* pair_ids = nullptr;
  int first_local = 0, num_local = 0, x_row_div = 1;
  // pair_ids were written at least two PDL launches back (the down GEMV after the up GEMV
  // after the router): every block of the predecessor waited for the router before it
  // triggered us, so the ids may be read, and the expert's first weight chunks loaded,
  // before this kernel's own dependency wait.
  bool ids_ready = false;
  // kDown + direct pairs: fused ordered combine. After writing its 32 rows of pair t, a block
  // bumps counters[token * gridDim.x + blockIdx.x]; the top_k-th arrival sums the token's
  // top_k pair rows in k order (deterministic) into combine_out [T, N] and resets the counter.
  void* combine_out = nullptr;
  bool combine_bf16 = true;
  int top_k = 0;
  int* counters = nullptr;
  // Several weights sharing x in one launch (linear_multi; kStore, no tile table, tensor-core
  // GEMV only): when nseg > 0, segment i (weight, scales, N, s_cols, out, ldo) owns blocks
  // [seg_block[i], seg_block[i + 1]) of the 1-D grid; the single-matrix fields are unused.
  struct Seg {
    const void* w;
    const float* s;
    void* out;
    int N, s_cols, ldo;
  };
  static constexpr int kMaxSegs = 4;
  int nseg = 0;
  Seg seg[kMaxSegs] = {};
  int seg_block[kMaxSegs + 1] = {};
  // Fused add + RMSNorm of the input (k_gemv_dense.cu only: kStore, M <= 8):
  // x is the addend; each block computes rmsnorm(norm_res + x) * norm_w for its rows in shared
  // memory, and the grid's last block stores norm_res += x and norm_out (bf16, [M, K]).
  bool norm = false;
  void* norm_res = nullptr;
  const void* norm_w = nullptr;
  void* norm_out = nullptr;
  float eps = 1e-6f;
  int* norm_counter = nullptr;  // zeroed; reset by the last block
};
// Rows per tile of each path (the MoE align kernel builds tiles of this height).
constexpr int kGemvTile = 8;
constexpr int kGemmTileM = 64;
void launch_gemv(const LinParams& p, cudaStream_t s);  // memory-bound path, small row counts
// Tensor-core decode path (FP8 weights, 128x128 scales, K % 128 == 0, N % 16 == 0);
// launch_gemv dispatches to it when supported and p.tc is set.
bool gemv_tc_supported(const LinParams& p);
void launch_gemv_tc(const LinParams& p, cudaStream_t s);
// Dense decode GEMV (k_gemv_dense.cu; sm_90+): kStore, no tile table, FP8 128 x 128 scales,
// M <= 8, K % 128 == 0, optionally multi-segment and/or with the fused add + RMSNorm
// (p.norm, K <= 4096). Each block copies its whole weight slice into shared memory before
// the PDL wait. seg_block is recomputed by the launcher.
bool gemv_dense_supported(const LinParams& p);
void launch_gemv_dense(const LinParams& p, int num_sms, cudaStream_t s);
void launch_gemm(const LinParams& p, cudaStream_t s);  // tensor-core path (mma.sync bf16)

// ---- MoE (k_moe.cu) ----
struct RouteParams {
  const void* x = nullptr;
  bool x_bf16 = true;
  const void* gate = nullptr;  // [E, H]
  bool gate_bf16 = false;      // else f32
  const float* bias = nullptr;  // [E] or null
  int T = 0, H = 0, E = 0, top_k = 0;
  int32_t* ids = nullptr;  // [T, top_k]
  float* weights = nullptr;
  float* logits = nullptr;  // workspace [T, E] f32: router logits between the two kernels
  // Split-bf16 router GEMM output (top-k kernels only): logits rows are [2E] f32, the logit
  // of expert e is logits[t * 2E + e] + logits[t * 2E + E + e] (x . gate_hi + x . gate_lo).
  bool logits_split = false;
  // Zeroed device int: with it, T <= 8 runs as one kernel (the last logits block does the
  // top-k and resets it to 0). Null: logits kernel + top-k kernel.
  int* counter = nullptr;
  // Fused add + RMSNorm before the router (norm = true; needs route_norm_supported): x is the
  // addend (bf16), residual += x (bf16, stored), norm_out = rmsnorm(residual) * norm_w (bf16),
  // and the logits use norm_out.
  bool norm = false;
  void* residual = nullptr;
  const void* norm_w = nullptr;
  void* norm_out = nullptr;
  float eps = 1e-6f;
  // route_norm_decode_kernel's last block (set by launch_route_norm_decode): 0 residual loop +
  // block_rank_topk, 1 the one-token tail (last_block_tail_t1), 2 MOESERVE_ROUTE_DIAG=1
  // (timing only: fixed distinct experts, no top-k).
  int decode_tail = 0;
  // k_route_dense.cu: the one-token last-block tail where it applies (loads first, per-warp then
  // warp-0 argmax top-k); false: residual loop then block_rank_topk (the tail for T > 1; tests
  // compare the two at T = 1). CudaTuning::route_fast_tail.
  bool fast_tail = true;
  // launch_moe_route_topk: warp-per-token register top-k for E <= 256 (2: redux.sync rounds,
  // default; 1: 64-bit shuffle rounds) instead of the shared-memory route_kernel (0). All give
  // the same ids and weights. CudaTuning::route_topk_warp.
  int topk_warp = 2;
  // Optional L2 prefetch of the gate/up weights (pf_bytes each, a multiple of 16) of the
  // experts chosen for the first pf_pairs (token, k) pairs, issued as they are chosen.
  const ExpertPtrs* pf_experts = nullptr;
  int pf_first_local = 0, pf_num_local = 0, pf_pairs = 0;
  uint64_t pf_bytes = 0;
};
bool route_norm_supported(const RouteParams& p);
// Decode add + RMSNorm + router in one kernel (k_route_dense.cu): p.norm set, T <= 4, f32
// gate, H % 128 == 0, H <= 4096, top_k <= 32, p.counter set.
bool route_norm_decode_supported(const RouteParams& p);
void launch_route_norm_decode(const RouteParams& p, cudaStream_t s);
void launch_moe_route(const RouteParams& p, cudaStream_t s);

// Groups (token, k) pairs by local expert. Outputs (device, caller-sized):
// sorted_token [P], sorted_weight [P], pair_pos [P] (sorted position or -1), tiles (max
// ceil(P / tile_rows) + E_local entries) and num_tiles [1]. P = T * top_k.
struct MoeAlignParams {
  const int32_t* ids = nullptr;
  const float* weights = nullptr;
  int T = 0, top_k = 0, first_local = 0, num_local = 0, tile_rows = 8;
  int32_t* sorted_token = nullptr;
  float* sorted_weight = nullptr;
  int32_t* pair_pos = nullptr;
  int32_t* tile_expert = nullptr;
  int32_t* tile_begin = nullptr;
  int32_t* tile_end = nullptr;
  int32_t* num_tiles = nullptr;
  // Optional scratch (any workspace free until the align is done; moe_experts passes the
  // per-pair output rows): from kAlignMultiMinPairs pairs, when it holds (blocks + 1) x
  // num_local ints, the align runs as three multi-block kernels instead of one block.
  int32_t* scratch = nullptr;
  size_t scratch_bytes = 0;
};
constexpr int64_t kAlignMultiMinPairs = 8192;
void launch_moe_align(const MoeAlignParams& p, cudaStream_t s);
// Tiles of <= tile_rows pairs, one expert each: sum_e ceil(c_e / R) <= ceil(P / R) + (experts
// with c_e > 0) <= ceil(P / R) + min(P, E_local). The min matters for decode: batch 1 has 9
// tiles at most, not 257, so the grid holds no hundreds of idle blocks per expert kernel.
inline int moe_max_tiles(int pairs, int tile_rows, int num_local) {
  return (pairs + tile_rows - 1) / tile_rows + (pairs < num_local ? pairs : num_local);
}
// out[t, h] = sum_k ypair[pair_pos[t*k + j], h] (fixed order; missing pairs add 0).
void launch_moe_combine(const float* ypair, const int32_t* pair_pos, int T, int top_k, int H,
                        void* out, bool out_bf16, cudaStream_t s);
// Same sum, 4 columns per thread (H % 4 == 0, 16-byte aligned buffers); ypair f32 or bf16
// (the grouped-GEMM path's moe_ypair_bf16).
void launch_moe_combine4(const void* ypair, bool ypair_bf16, const int32_t* pair_pos, int T, int top_k, int H,
                         void* out, bool out_bf16, cudaStream_t s);

// ---- attention (k_attention.cu) ----
struct AttnParams {
  const void* q = nullptr;  // [T, Hq*D] bf16
  const void* k_cache = nullptr;  // [blocks, bs, Hkv, D] bf16, or e4m3 when kv_fp8
  const void* v_cache = nullptr;
  // FP8 KV cache: K = e4m3 * k_scale, V = e4m3 * v_scale (per-tensor scales of the layer).
  // launch_attention and launch_attention_verify read it (dequantised in registers; k_scale
  // folded into the scores, v_scale into the output); the other kernels' supported() refuse it.
  bool kv_fp8 = false;
  float k_scale = 1.f, v_scale = 1.f;
  void* out = nullptr;  // [T, Hq*D] bf16
  const int32_t* query_start = nullptr;
  const int32_t* context_lens = nullptr;
  const int32_t* block_tables = nullptr;
  int num_seqs = 0, T = 0, max_query_len = 0, max_blocks_per_seq = 0, block_size = 0;
  int Hq = 0, Hkv = 0, D = 0;
  float scale = 1.f;
  int64_t kv_rows = 0;  // rows of each cache tensor (blocks x block_size; 0: unknown), for TMA maps
  int splits = 1;  // > 1: split-KV partials in `part_o` [splits, T, Hq, D] and `part_ml` [splits, T, Hq, 2]
  float* part_o = nullptr;
  float* part_ml = nullptr;
  // splits > 1: zeroed ints, one per (sequence, query tile, kv head). With them the last
  // split block of each group merges the partials itself (no combine kernel).
  int* counters = nullptr;
  // Optional L2 prefetch (fused decode kernel only): weights read by the following ops.
  static constexpr int kMaxPf = 5;
  const void* pf_ptr[kMaxPf] = {};
  uint64_t pf_bytes[kMaxPf] = {};
};
// Query tokens per block for a GQA group size.
int attn_query_tile(int group);
void launch_attention(const AttnParams& p, cudaStream_t s);
// Merges p.splits split-KV partials (part_o / part_ml, base-2 (max, sum)) into out.
void launch_attention_combine(const AttnParams& p, cudaStream_t s);
// Decode-like steps on tensor cores (k_attn_verify.cu): every sequence 1..32 / G query rows
// (decode, speculative verify), bf16 or e4m3 cache, head_dim 64 or 128; one read of a sequence's
// KV per kv head for all its query rows. p.splits > 1: partials + the combine kernel.
bool attention_verify_supported(const AttnParams& p);
int attention_verify_splits(int num_sms, int kv_groups, int max_context);
void launch_attention_verify(const AttnParams& p, cudaStream_t s);
// Tensor-core prefill attention (k_attn_tc.cu): head_dim 128, >= 64 query tokens, no splits.
bool attention_tc_supported(const AttnParams& p);
void launch_attention_tc(const AttnParams& p, cudaStream_t s);

// Fused decode attention (k_attn_decode.cu, sm_90+): QK-norm + RoPE of q and k (n), the KV
// write of k/v (n.kc/vc/slots) and split-KV attention (a) with an in-cluster split merge, for
// batches of one query token per sequence. `splits` (1, 2, 4 or 8) blocks per (sequence, kv head).
bool attn_decode_supported(const AttnParams& a, const QkNormRopeParams& n);
int attn_decode_splits(int num_sms, int kv_groups, int max_context);
void launch_attn_decode(const AttnParams& a, const QkNormRopeParams& n, int splits, cudaStream_t s);
// Version 2 (k_attn_decode2.cu): same contract, tensor-core key loop, 8 warps per block, split
// merge by remote stores + one cluster barrier; `splits` 1..16 (powers of two).
// attn_decode2_max_cluster(16): how many 16-block clusters the device co-schedules.
bool attn_decode2_supported(const AttnParams& a, const QkNormRopeParams& n);
int attn_decode2_splits(int num_sms, int kv_groups, int max_context, int max_splits);
int attn_decode2_max_cluster(int want);
void launch_attn_decode2(const AttnParams& a, const QkNormRopeParams& n, int splits, cudaStream_t s);

// ---- random fill (k_fill.cu): kind 0 f32, 1 bf16, 2 fp8 e4m3; uniform in [-scale, scale] ----
void launch_fill_random(void* p, int kind, int64_t n, uint64_t seed, float scale, cudaStream_t s);

// ---- sampling (k_sample.cu) ----
struct SampleRowParams {
  float temperature;  // <= 0: greedy
  int top_k;          // <= 0: off
  float top_p;        // >= 1: off
  uint64_t seed;
  int32_t mask_row;   // row of SampleLaunch::masks (-1: unmasked)
};
// Sampling (k_sample.cu): rows are cut into sub-chunks of kSampleChunk tokens whose partial
// results are combined in a fixed order, so a row's token does not depend on the batch.
constexpr int kSampleChunk = 4096;
constexpr int kSampleRowsPerLaunch = 256;  // bounds the scratch (larger batches: more launches)
struct SampleScratch {  // per launch row and sub-chunk
  float* pmax;
  int* parg;
  float* pmass;
  float* hist;  // [2][rows][sub-chunks][256] radix histograms (double-buffered passes)
};
struct SampleLaunch {
  const void* logits = nullptr;  // [rows, vocab] F32 or BF16
  bool logits_bf16 = false;
  int rows = 0, vocab = 0;
  const SampleRowParams* params = nullptr;  // [rows] device
  int32_t* out_ids = nullptr;               // [rows] device
  void* scratch = nullptr;                  // sample_scratch_bytes(rows, vocab) device bytes
  // [*, mask_words] uint32 allowed-token bitsets (bit t%32 of word t/32 = token t allowed),
  // mask_words = ceil(vocab / 32); null when no row is masked. A masked row samples as if its
  // disallowed logits were -inf (an all-zero mask gives -1 like an all -inf row).
  const uint32_t* masks = nullptr;
  int mask_words = 0;
  // Launch-uniform: some row samples (else all greedy), uses top-k, uses top-p. They decide
  // which passes run; a row that does not use a filter skips its work in that pass.
  bool any_sampling = true, any_topk = true, any_topp = true;
  // Blocks of the cooperative kernel resident at once (sample_max_resident(); DeviceCaps).
  int max_resident = 0;
};
// Blocks of the cooperative sampling kernel resident at once on the current device.
int sample_max_resident();
size_t sample_scratch_bytes(int rows, int vocab);
void launch_sample(const SampleLaunch& launch, cudaStream_t s);

}  // namespace moeserve::cuda
