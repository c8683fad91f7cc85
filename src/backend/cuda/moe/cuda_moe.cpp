// CudaBackend MoE ops (router, experts) and GPU sampling.
//
// moe_experts: align (group (token, k) pairs by local expert, build a tile table) ->
// gate/up with fused SiLU*mul -> down scaled by the routing weight into per-pair f32 rows ->
// ordered combine over k. Decode-sized batches use the GEMV kernels (tiles of <= 8 pairs of
// one expert: every active expert's weights are read once per tile), larger ones the
// tensor-core grouped GEMM (tiles of 64 pairs; 128 for the FP8 wgmma 128 x 256 / 128 x 192
// tiles). From 8,192 pairs the align runs multi-block with the pair-row buffer as scratch.
// Device-side tile tables mean no host sync,
// so the whole op is capture-safe once workspaces are sized.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/kernels_generic.h"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/moe/kernels_int4.h"
#include "core/error.h"


namespace moeserve {
using namespace cuda;

// Device array of per-expert pointers plus the shared geometry, built once per MoeWeights.
struct CudaBackend::ExpertTable {
  ExpertPtrs* dev = nullptr;
  int I = 0, H = 0, bo = 128, bi = 128, s_cols_up = 0, s_cols_down = 0;
  bool fp8 = false;
  bool int4 = false;  // packed W4A16 (bi = group size; ExpertPtrs s* hold the BF16 scales)
  uint64_t signature = 0;  // of every expert's pointers and shapes, to detect a changed MoeWeights
  ~ExpertTable() {
    if (dev) cudaFree(dev);
  }
};

namespace {
// FNV-1a over every pointer and shape the table is built from: a MoeWeights at a reused
// address (a new layer object, freed and re-allocated weights) never hits a stale table.
uint64_t expert_signature(const MoeWeights& moe) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(moe.experts.size());
  for (const ExpertWeights& e : moe.experts)
    for (const LinearWeight* w : {&e.w1, &e.w3, &e.w2}) {
      mix(reinterpret_cast<uintptr_t>(w->weight.data));
      mix(reinterpret_cast<uintptr_t>(w->scale_inv.data));
      mix(uint64_t(w->weight.numel()));
      mix(uint64_t(w->out_features()));
    }
  return h;
}
}  // namespace

const CudaBackend::ExpertTable& CudaBackend::expert_table(const MoeWeights& moe) {
  MS_CHECK(!moe.experts.empty(), "moe_experts: no local experts");
  const uint64_t sig = expert_signature(moe);
  auto it = expert_tables_.find(&moe);
  if (it != expert_tables_.end() && it->second->signature == sig) return *it->second;
  MS_CHECK(!capturing_, "moe_experts: expert table built during graph capture (run the step once first)");
  auto t = std::make_shared<ExpertTable>();
  const ExpertWeights& e0 = moe.experts[0];
  t->I = int(e0.w1.out_features());
  t->H = int(e0.w1.in_features());
  t->fp8 = e0.w1.fp8();
  t->int4 = e0.w1.int4();
  t->signature = sig;
  if (t->fp8 || t->int4) t->bo = e0.w1.block_out, t->bi = e0.w1.block_in;
  t->s_cols_up = ceil_div(t->H, t->bi);
  t->s_cols_down = ceil_div(t->I, t->bi);
  std::vector<ExpertPtrs> host;
  host.reserve(moe.experts.size());
  for (size_t i = 0; i < moe.experts.size(); ++i) {
    const ExpertWeights& e = moe.experts[i];
    for (const LinearWeight* w : {&e.w1, &e.w3, &e.w2}) {
      MS_CHECK(w->weight.device == Device::CUDA, "moe_experts: expert {} weight not on the GPU", i);
      MS_CHECK(w->fp8() == t->fp8 && w->int4() == t->int4 && (w->fp8() || w->int4() || w->weight.dtype == DType::BF16),
               "moe_experts: expert {} weights must all be FP8, all INT4 or all BF16", i);
      if (t->int4) {
        MS_CHECK(w->block_out == 1 && w->block_in == t->bi && w->scale_inv.dtype == DType::BF16 &&
                     w->scale_inv.device == Device::CUDA &&
                     w->scale_inv.numel() == w->out_features() * (w->in_features() / t->bi),
                 "moe_experts: expert {} INT4 group scales {} (group {}) must be BF16 on the GPU in expert 0's layout", i,
                 shape_str(w->scale_inv.shape), w->block_in);
      }
      if (t->fp8) {
        MS_CHECK(w->block_out == t->bo && w->block_in == t->bi && w->scale_inv.dtype == DType::F32 &&
                     w->scale_inv.device == Device::CUDA,
                 "moe_experts: expert {} block scales differ from expert 0", i);
        MS_CHECK(w->scale_inv.numel() == int64_t(ceil_div(w->out_features(), t->bo)) * ceil_div(w->in_features(), t->bi),
                 "moe_experts: expert {} scale_inv shape {}", i, shape_str(w->scale_inv.shape));
      }
    }
    MS_CHECK(e.w1.out_features() == t->I && e.w3.out_features() == t->I && e.w1.in_features() == t->H &&
                 e.w3.in_features() == t->H && e.w2.out_features() == t->H && e.w2.in_features() == t->I,
             "moe_experts: expert {} shapes differ from expert 0 (I={}, H={})", i, t->I, t->H);
    // INT4: the BF16 scales travel in the float-typed fields (k_moe_int4.cu reads them as bf16).
    auto sc = [&](const LinearWeight& w) {
      return t->fp8 || t->int4 ? static_cast<const float*>(w.scale_inv.data) : nullptr;
    };
    ExpertPtrs p{e.w1.weight.data, e.w3.weight.data, e.w2.weight.data, sc(e.w1), sc(e.w3), sc(e.w2)};
    host.push_back(p);
  }
  CUDA_CHECK(cudaMalloc(&t->dev, host.size() * sizeof(ExpertPtrs)));
  CUDA_CHECK(cudaMemcpy(t->dev, host.data(), host.size() * sizeof(ExpertPtrs), cudaMemcpyHostToDevice));
  expert_tables_[&moe] = t;
  return *t;
}

const ExpertPtrs* CudaBackend::expert_ptrs_fp8(const MoeWeights& moe, int* I) {
  const ExpertTable& et = expert_table(moe);
  *I = et.I;
  return et.fp8 && et.bo == 128 && et.bi == 128 ? et.dev : nullptr;
}

// Only routed experts have W4A16 kernels (int4_experts_packed); a quantised attention, shared
// expert, dense MLP or lm_head would need them in every linear path, so it is refused rather
// than silently widened to bf16.
std::string CudaBackend::int4_weights_problem(const std::string& tensor) const {
  return fmt::format("INT4 tensor '{}' (compressed-tensors pack-quantized) is not a routed expert: the CUDA backend "
                     "runs INT4 only in the routed experts (W4A16 MoE kernels); run this checkpoint with --device cpu "
                     "(the CPU reference dequantises INT4 exactly)",
                     tensor);
}

MoeRouteOpDesc CudaBackend::route_desc(const Tensor& x, const MoeWeights& moe) const {
  MoeRouteOpDesc d;
  d.T = x.rank() == 1 ? 1 : int(x.numel() / x.dim(-1));
  d.H = int(x.dim(-1)), d.E = moe.num_experts, d.top_k = moe.top_k;
  d.x_bf16 = x.dtype == DType::BF16, d.gate_f32 = moe.gate.dtype == DType::F32;
  d.sigmoid_renorm = moe.route.sigmoid_renorm();
  d.sigmoid = moe.route.scoring == RouteScoring::Sigmoid;
  d.n_group = moe.route.n_group, d.topk_group = moe.route.topk_group;
  d.gate_aligned = aligned16({moe.gate.data});
  d.x_aligned = reinterpret_cast<uintptr_t>(x.data) % (x.dtype == DType::BF16 ? 8 : 16) == 0;
  d.experts_fp8 = !moe.experts.empty() && moe.experts[0].w1.fp8();
  d.ws = workspace_view();
  return d;
}

void CudaBackend::add_rms_norm_route(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                                     const MoeWeights& moe, MoeRouting& routing) {
  const bool bf = residual.dtype == DType::BF16 && x.dtype == DType::BF16 && weight.dtype == DType::BF16 &&
                  out.dtype == DType::BF16;
  MoeRouteOpDesc d = route_desc(x, moe);
  d.x_bf16 = out.dtype == DType::BF16;
  d.with_norm = true;
  d.norm_ok = bf && residual.device == Device::CUDA && x.device == Device::CUDA && weight.device == Device::CUDA &&
              out.device == Device::CUDA && residual.numel() == x.numel() && out.numel() == x.numel() &&
              weight.numel() == x.dim(-1);
  d.aligned = aligned16({residual.data, x.data, weight.data, out.data});
  const MoeRouteKernel k = select(d);
  if (k.norm == MoeRouteKernel::kNormFused) {
    NormFuse nf{&residual, &x, &weight, eps};
    moe_route_impl(out, moe, routing, &nf, &k);
    return;
  }
  if (k.norm == MoeRouteKernel::kNormQuant) {
    norm_quant_for_experts(residual, x, weight, eps, out);
  } else {
    add_rms_norm(residual, x, weight, eps, out);
  }
  moe_route_impl(out, moe, routing, nullptr, &k);
}

void CudaBackend::moe_route(const Tensor& x, const MoeWeights& moe, MoeRouting& out) {
  moe_route_impl(x, moe, out, nullptr, nullptr);
}

// nf: fused add + RMSNorm whose output is x (the kernel reads nf's tensors and writes x).
// sel: the selector's choice when the caller made it (add_rms_norm_route), else made here.
void CudaBackend::moe_route_impl(const Tensor& x, const MoeWeights& moe, MoeRouting& out, const NormFuse* nf,
                                 const MoeRouteKernel* sel) {
  MS_CHECK(x.defined() && x.device == Device::CUDA && moe.gate.device == Device::CUDA, "moe_route: tensors must be on the GPU");
  const int T = x.rank() == 1 ? 1 : int(x.numel() / x.dim(-1));
  const int H = int(x.dim(-1)), E = moe.num_experts, k = moe.top_k;
  MS_CHECK(moe.gate.rank() == 2 && moe.gate.dim(0) == E && moe.gate.dim(1) == H, "moe_route: gate {} for E={} H={}",
           shape_str(moe.gate.shape), E, H);
  MS_CHECK(k > 0 && k <= E, "moe_route: top_k {} of {} experts", k, E);
  MS_CHECK(moe.gate.dtype == DType::F32 || moe.gate.dtype == DType::BF16, "moe_route: gate dtype {} unsupported",
           dtype_name(moe.gate.dtype));
  MS_CHECK(x.dtype == DType::F32 || x.dtype == DType::BF16, "moe_route: x dtype {}", dtype_name(x.dtype));
  if (out.expert_ids.empty()) out.expert_ids = alloc(DType::I32, {T, k});
  if (out.weights.empty()) out.weights = alloc(DType::F32, {T, k});
  MS_CHECK(out.expert_ids.numel() >= int64_t(T) * k && out.weights.numel() >= int64_t(T) * k &&
               out.expert_ids.dtype == DType::I32 && out.weights.dtype == DType::F32,
           "moe_route: routing buffers too small or wrong dtype");
  if (moe.score_bias.defined())
    MS_CHECK(moe.score_bias.dtype == DType::F32 && moe.score_bias.numel() == E && moe.score_bias.device == Device::CUDA,
             "moe_route: score_bias must be F32 [{}] on the GPU", E);
  // (Workspaces are as they were when the caller selected: nothing above allocates one.)
  const MoeRouteKernel r = sel ? *sel : select(route_desc(x, moe));
  if (r.capture_fallback) ++graph_fallbacks_;
  if (r.id == MoeRouteKernel::kGeneric || r.id == MoeRouteKernel::kGrouped) {
    // Softmax / grouped / unnormalised / scaled routing (no fused norm).
    GenericRouteParams g;
    g.x = x.data, g.x_bf16 = x.dtype == DType::BF16;
    g.gate = moe.gate.data, g.gate_bf16 = moe.gate.dtype == DType::BF16;
    g.bias = moe.score_bias.defined() ? moe.score_bias.ptr<float>() : nullptr;
    g.T = T, g.H = H, g.E = E, g.top_k = k, g.spec = moe.route;
    g.ids = out.expert_ids.ptr<int32_t>(), g.weights = out.weights.ptr<float>();
    if (r.id == MoeRouteKernel::kGeneric) {
      launch_moe_route_generic(g, stream_);
      return;
    }
    // DeepSeek-V3 family (k_route_grouped.cu): the logits by its GEMV or, at prefill, the router
    // GEMM the selector named, then the grouped top-k per token.
    RouteParams lp;
    lp.x = g.x, lp.x_bf16 = g.x_bf16, lp.gate = g.gate, lp.T = T, lp.H = H, lp.E = E, lp.top_k = k;
    MoeRouteKernel gemm = r;
    gemm.id = r.grouped_logits;
    if (r.grouped_logits != MoeRouteKernel::kGrouped && route_logits_gemm(moe.gate, lp, gemm)) {
      g.logits = lp.logits, g.logits_split = lp.logits_split;
    } else {
      g.logits = static_cast<float*>(workspace(kRouter, size_t(T) * E * sizeof(float)));
      launch_route_grouped_logits(g, stream_);
    }
    launch_route_grouped_topk(g, stream_);
    return;
  }
  RouteParams p;
  p.x = x.data, p.x_bf16 = x.dtype == DType::BF16;
  p.gate = moe.gate.data, p.gate_bf16 = moe.gate.dtype == DType::BF16;
  p.bias = moe.score_bias.defined() ? moe.score_bias.ptr<float>() : nullptr;
  p.T = T, p.H = H, p.E = E, p.top_k = k;
  p.ids = out.expert_ids.ptr<int32_t>(), p.weights = out.weights.ptr<float>();
  p.logits = static_cast<float*>(workspace(kRouter, size_t(T) * E * sizeof(float)));
  p.counter = tuning.fuse_router ? counters_ : nullptr;
  p.topk_warp = r.topk == MoeRouteKernel::kTopkRedux ? 2 : r.topk == MoeRouteKernel::kTopkShfl ? 1 : 0;
  if (r.id == MoeRouteKernel::kRouteNormDense) {  // k_route_dense.cu
    MS_CHECK(nf, "moe_route: the fused norm + router kernel without its norm");
    p.norm = true;
    p.x = nf->addend->data, p.x_bf16 = true;
    p.residual = nf->residual->data, p.norm_w = nf->weight->data, p.norm_out = x.data, p.eps = nf->eps;
    p.fast_tail = r.one_token_tail;
    launch_route_norm_decode(p, stream_);
    ++route_dense_launches;
    return;
  }
  // Prefill (>= router_gemm_min_tokens, no fused norm): logits as a GEMM, then top-k alone; a
  // shape cuBLASLt has no algorithm for takes the kernels below.
  if ((r.id == MoeRouteKernel::kGemmSplit || r.id == MoeRouteKernel::kGemmF32) && route_logits_gemm(moe.gate, p, r))
    launch_moe_route_topk(p, stream_);
  else
    launch_moe_route(p, stream_);
}

void CudaBackend::moe_experts(const Tensor& x, const MoeWeights& moe, const MoeRouting& routing, Tensor& out) {
  MS_CHECK(x.defined() && x.device == Device::CUDA && out.device == Device::CUDA, "moe_experts: tensors must be on the GPU");
  MS_CHECK(x.dtype == DType::BF16, "moe_experts: x must be BF16");
  const ExpertTable& et = expert_table(moe);
  const int T = x.rank() == 1 ? 1 : int(x.numel() / x.dim(-1));
  const int H = int(x.dim(-1)), k = moe.top_k, E_local = int(moe.experts.size());
  MS_CHECK(H == et.H && out.numel() == x.numel(), "moe_experts: x {} out {} vs expert hidden {}", shape_str(x.shape),
           shape_str(out.shape), et.H);
  MS_CHECK(routing.expert_ids.numel() >= int64_t(T) * k && routing.weights.numel() >= int64_t(T) * k,
           "moe_experts: routing for fewer than {} tokens", T);
  const Prequant pq = take_prequant(x.data, T, H);  // x's FP8 form from add_rms_norm_route, if made
  if (T == 0) return;
  const int P = T * k;
  MS_CHECK(out.dtype == DType::BF16 || out.dtype == DType::F32, "moe_experts: out dtype {}", dtype_name(out.dtype));
  MoeExpertsOpDesc d;
  d.T = T, d.top_k = k, d.H = H, d.I = et.I, d.E_local = E_local;
  d.fp8 = et.fp8, d.int4 = et.int4, d.bo = et.bo, d.bi = et.bi;
  d.prequant = pq.q != nullptr;
  d.aligned = aligned16({x.data}), d.out_aligned = aligned16({out.data});
  d.ws = workspace_view();
  const MoeExpertsKernel sel = select(d);
  if (sel.capture_fallback) ++graph_fallbacks_;
  if (sel.id == MoeExpertsKernel::kDirect) {
    MS_CHECK(run_moe_direct(x, moe, routing, out), "moe_experts: the direct path refused the shapes its selector took");
    return;
  }
  MS_CHECK(sel.id != MoeExpertsKernel::kUnsupported, "moe_experts: {}", moe_int4_problem(H, et.I, et.bi));
  const int tile_rows = sel.tile_rows;
  const int max_tiles = moe_max_tiles(P, tile_rows, E_local);

  // Workspaces (the ints first, then sorted weights).
  const size_t meta_words = size_t(2 * P + 3 * max_tiles + 1);
  int32_t* meta = static_cast<int32_t*>(workspace(kMoeMeta, (meta_words + P) * 4 + 64));
  MoeAlignParams a;
  a.ids = routing.expert_ids.ptr<int32_t>(), a.weights = routing.weights.ptr<float>();
  a.T = T, a.top_k = k, a.first_local = moe.first_local_expert, a.num_local = E_local, a.tile_rows = tile_rows;
  a.sorted_token = meta;
  a.pair_pos = meta + P;
  a.tile_expert = meta + 2 * P;
  a.tile_begin = a.tile_expert + max_tiles;
  a.tile_end = a.tile_begin + max_tiles;
  a.num_tiles = a.tile_end + max_tiles;
  a.sorted_weight = reinterpret_cast<float*>(meta + meta_words);
  void* act = workspace(kMoeAct, size_t(P) * et.I * 2);
  float* ypair = static_cast<float*>(workspace(kMoeY, size_t(P) * H * 4));
  // The multi-block align's scratch (the pair rows are not written before the down GEMM).
  a.scratch = reinterpret_cast<int32_t*>(ypair);
  a.scratch_bytes = size_t(P) * H * 4;
  launch_moe_align(a, stream_);

  LinParams up;
  up.tc = tuning.use_gemv_tc;
  up.fp8_wgmma = tuning.fp8_gemm_wgmma;
  up.mode = LinMode::kSwiglu;
  up.x = x.data, up.ldx = H, up.x_rows = a.sorted_token, up.M = P;
  up.experts = et.dev, up.fp8 = et.fp8, up.N = et.I, up.K = H, up.bo = et.bo, up.bi = et.bi, up.s_cols = et.s_cols_up;
  up.tile_expert = a.tile_expert, up.tile_begin = a.tile_begin, up.tile_end = a.tile_end, up.num_tiles = a.num_tiles;
  up.max_tiles = max_tiles, up.tile_rows = tile_rows;
  up.out = act, up.ldo = et.I;
  LinParams down = up;
  down.mode = LinMode::kDown;
  down.x = act, down.ldx = et.I, down.x_rows = nullptr;
  down.N = H, down.K = et.I, down.s_cols = et.s_cols_down;
  // f32 pair rows, summed by the combine (4 columns per thread where aligned).
  down.out = ypair, down.ldo = H, down.out_f32 = true, down.row_scale = a.sorted_weight;
  switch (sel.id) {
    case MoeExpertsKernel::kInt4Gemv:
    case MoeExpertsKernel::kInt4Gemm:
      // W4A16 (k_moe_int4.cu): the decode GEMV tiles (<= 8 pairs) or the prefill GEMM tiles (64).
      launch_moe_int4(up, stream_);
      launch_moe_int4(down, stream_);
      break;
    case MoeExpertsKernel::kGemv:
      up.tc = sel.up == LinearKernel::kGemvTc, down.tc = sel.down == LinearKernel::kGemvTc;
      launch_gemv(up, stream_);
      launch_gemv(down, stream_);
      break;
    case MoeExpertsKernel::kFp8Wide:
    case MoeExpertsKernel::kFp8:
      moe_experts_fp8_act(up, down, T, pq, sel);
      break;
    default:
      launch_gemm(up, stream_);
      launch_gemm(down, stream_);
  }
  if (sel.combine4 && aligned16({ypair}))
    launch_moe_combine4(ypair, false, a.pair_pos, T, k, H, out.data, out.dtype == DType::BF16, stream_);
  else
    launch_moe_combine(ypair, a.pair_pos, T, k, H, out.data, out.dtype == DType::BF16, stream_);
}

// Decode at very few tokens: no align step and no combine kernel. Tile t of both GEMVs is
// routing pair t (T * top_k tiles of one row; a top-k never repeats an expert within a
// token, so each active expert's weights are still read once per token), and the down GEMV
// sums each token's pairs in k order in its last-arriving block. Returns false (nothing
// launched) where the tensor-core GEMV does not apply.
bool CudaBackend::run_moe_direct(const Tensor& x, const MoeWeights& moe, const MoeRouting& routing, Tensor& out) {
  const ExpertTable& et = expert_table(moe);
  const int T = x.rank() == 1 ? 1 : int(x.numel() / x.dim(-1));
  const int H = int(x.dim(-1)), k = moe.top_k, P = T * k;
  const int down_blocks = ceil_div(H, 32);
  if (int64_t(T) * down_blocks > kMoeCounterSlots) return false;
  LinParams up;
  up.tc = tuning.use_gemv_tc;
  up.mode = LinMode::kSwiglu;
  up.x = x.data, up.ldx = H, up.M = P, up.x_row_div = k;
  up.experts = et.dev, up.fp8 = et.fp8, up.N = et.I, up.K = H, up.bo = et.bo, up.bi = et.bi, up.s_cols = et.s_cols_up;
  up.pair_ids = routing.expert_ids.ptr<int32_t>();
  up.first_local = moe.first_local_expert, up.num_local = int(moe.experts.size());
  LinParams down = up;
  down.mode = LinMode::kDown;
  down.ldx = et.I, down.x_row_div = 1;
  down.N = H, down.K = et.I, down.s_cols = et.s_cols_down;
  if (!gemv_tc_supported(up) || !gemv_tc_supported(down)) return false;
  void* act = workspace(kMoeAct, size_t(P) * et.I * 2);
  float* ypair = static_cast<float*>(workspace(kMoeY, size_t(P) * H * 4));
  up.out = act, up.ldo = et.I;
  down.x = act;
  down.out = ypair, down.ldo = H, down.out_f32 = true, down.row_scale = routing.weights.ptr<float>();
  down.combine_out = out.data, down.combine_bf16 = out.dtype == DType::BF16;
  down.top_k = k, down.counters = counters_ + kMoeCounterBase;
  down.ids_ready = true;  // router -> up -> down: the ids are two launches back
  launch_gemv_tc(up, stream_);
  launch_gemv_tc(down, stream_);
  return true;
}

void CudaBackend::sample(const Tensor& logits, const std::vector<GpuSamplingParams>& params, Tensor& out_ids,
                         const DeviceMasks& masks) {
  MS_CHECK(!capturing_, "sample: not capture-safe (uploads parameters)");
  MS_CHECK(logits.device == Device::CUDA && out_ids.device == Device::CUDA && logits.rank() == 2,
           "sample: logits [R, V] and out_ids [R] must be on the GPU");
  MS_CHECK(logits.dtype == DType::F32 || logits.dtype == DType::BF16, "sample: logits must be F32 or BF16");
  const int R = int(logits.dim(0)), V = int(logits.dim(1));
  MS_CHECK(int(params.size()) == R && out_ids.dtype == DType::I32 && out_ids.numel() >= R,
           "sample: {} parameter rows / out {} for {} logit rows", params.size(), shape_str(out_ids.shape), R);
  const int W = (V + 31) / 32;
  MS_CHECK(masks.num_rows == 0 || (masks.words && masks.words_per_row == W),
           "sample: masks of {} words per row for a vocabulary of {} (want {})", masks.words_per_row, V, W);
  for (const auto& p : params)
    MS_CHECK(p.mask_row < masks.num_rows, "sample: mask row {} of {}", p.mask_row, masks.num_rows);
  // One pinned staging buffer: the row parameters, then the masks (16-byte aligned).
  const size_t param_bytes = (size_t(R) * sizeof(SampleRowParams) + 15) & ~size_t(15);
  const size_t mask_bytes = size_t(masks.num_rows) * size_t(W) * sizeof(uint32_t);
  const size_t bytes = param_bytes + mask_bytes;
  if (!pinned_copied_) CUDA_CHECK(cudaEventCreateWithFlags(&pinned_copied_, cudaEventDisableTiming));
  if (pinned_bytes_ < bytes) {
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (pinned_) CUDA_CHECK(cudaFreeHost(pinned_));
    pinned_ = nullptr;
    pinned_bytes_ = std::max<size_t>(bytes, 4096);
    CUDA_CHECK(cudaMallocHost(&pinned_, pinned_bytes_));
  }
  // The staging buffer is rewritten here: wait for the previous call's upload only (long done
  // in steady state: the step's results were downloaded since), not for the queued forward.
  CUDA_CHECK(cudaEventSynchronize(pinned_copied_));
  auto* hp = static_cast<SampleRowParams*>(pinned_);
  for (int r = 0; r < R; ++r)
    hp[r] = {params[r].temperature, params[r].top_k, params[r].top_p, params[r].seed, params[r].mask_row};
  auto* dp = static_cast<SampleRowParams*>(workspace(kSample, param_bytes));
  CUDA_CHECK(cudaMemcpyAsync(dp, hp, param_bytes, cudaMemcpyHostToDevice, stream_));
  SampleLaunch l;
  if (mask_bytes > 0) {
    // [masked rows, W] words (64 rows at V = 200,064: 1.6 MB) into the kSampleMask workspace,
    // copied behind the forward still queued on the stream.
    auto* hm = reinterpret_cast<uint32_t*>(static_cast<char*>(pinned_) + param_bytes);
    std::memcpy(hm, masks.words, mask_bytes);
    auto* dm = static_cast<uint32_t*>(workspace(kSampleMask, mask_bytes));
    CUDA_CHECK(cudaMemcpyAsync(dm, hm, mask_bytes, cudaMemcpyHostToDevice, stream_));
    l.masks = dm, l.mask_words = W;
  }
  CUDA_CHECK(cudaEventRecord(pinned_copied_, stream_));
  l.logits = logits.data, l.logits_bf16 = logits.dtype == DType::BF16, l.rows = R, l.vocab = V;
  l.params = dp, l.out_ids = out_ids.ptr<int32_t>();
  l.scratch = workspace(kSampleScratch, sample_scratch_bytes(R, V));
  l.max_resident = caps_.sample_resident;
  l.any_sampling = l.any_topk = l.any_topp = false;
  for (const auto& p : params) {
    l.any_sampling |= p.temperature > 0.f;
    l.any_topk |= p.temperature > 0.f && p.top_k > 0 && p.top_k < V;
    l.any_topp |= p.temperature > 0.f && p.top_p > 0.f && p.top_p < 1.f;
  }
  launch_sample(l, stream_);
}

}  // namespace moeserve
