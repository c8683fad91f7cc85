// CudaBackend: argument checks, workspace management and kernel dispatch (kernels.h).
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "backend/cuda/cublaslt.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/kernels_generic.h"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/kernels_fp8.h"
#include "backend/cuda/kernels_prefill.h"
#include "core/debug_flags.h"
#include "core/error.h"
#include "core/log.h"


namespace moeserve {
namespace cuda {
void throw_cuda_error(cudaError_t err, const char* file, int line, const char* expr) {
  fail("CUDA error {} at {}:{}: {}", cudaGetErrorString(err), file, line, expr);
}
void throw_error(const std::string& msg) { throw Error(msg); }

bool pdl_enabled() {
  static const bool on = debug_flags().pdl;  // MOESERVE_PDL=0: off (debugging)
  return on && code_arch() >= 900;           // griddepcontrol is compiled only for sm_90+
}
}  // namespace cuda
using namespace cuda;

namespace {

void check_dev(const Tensor& t, const char* op, const char* what) {
  MS_CHECK(t.defined(), "{}: {} is empty", op, what);
  MS_CHECK(t.device == Device::CUDA, "{}: {} is not a CUDA tensor", op, what);
}
// Activations and small weights: bf16 or f32.
bool is_bf16(const Tensor& t, const char* op, const char* what) {
  MS_CHECK(t.dtype == DType::BF16 || t.dtype == DType::F32, "{}: {} must be BF16 or F32, got {}", op, what,
           dtype_name(t.dtype));
  return t.dtype == DType::BF16;
}
int rows_of(const Tensor& t) { return t.rank() == 1 ? 1 : int(t.numel() / t.dim(-1)); }

}  // namespace

// ---- CudaGraph ----
CudaGraph& CudaGraph::operator=(CudaGraph&& o) noexcept {
  std::swap(graph_, o.graph_);
  std::swap(exec_, o.exec_);
  return *this;
}
CudaGraph::~CudaGraph() {
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
}
void CudaGraph::replay(cudaStream_t s) const {
  MS_CHECK(exec_, "CudaGraph: replay of an empty graph");
  CUDA_CHECK(cudaGraphLaunch(exec_, s));
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

CudaDeviceInfo cuda_device_info(int index) {
  cudaDeviceProp p{};
  CudaDeviceInfo info;
  if (cudaGetDeviceProperties(&p, index) != cudaSuccess) {
    cudaGetLastError();
    return info;
  }
  info.name = p.name;
  info.total_bytes = p.totalGlobalMem;
  return info;
}

std::unique_ptr<CudaBackend> make_cuda_backend(int device) { return std::make_unique<CudaBackend>(device); }

namespace {
// Capabilities (backend/capabilities.h) over the CudaBackend's own methods.
class CudaCapturedGraph final : public CapturedGraph {
 public:
  CudaCapturedGraph(CudaGraph g, cudaStream_t s) : g_(std::move(g)), s_(s) {}
  void replay() override { g_.replay(s_); }

 private:
  CudaGraph g_;
  cudaStream_t s_;
};
class CudaGraphCapture final : public GraphCapture {
 public:
  explicit CudaGraphCapture(CudaBackend& b) : b_(b) {}
  void begin_capture() override { b_.begin_capture(); }
  std::unique_ptr<CapturedGraph> end_capture() override {
    return std::make_unique<CudaCapturedGraph>(b_.end_capture(), b_.stream());
  }
  uint64_t workspace_generation() const override { return b_.workspace_generation(); }

 private:
  CudaBackend& b_;
};
class CudaDeviceSampler final : public DeviceSampler {
 public:
  explicit CudaDeviceSampler(CudaBackend& b) : b_(b) {}
  void sample(const Tensor& logits, const std::vector<DeviceSampleRow>& rows, const DeviceMasks& masks,
              Tensor& out_ids) override {
    std::vector<GpuSamplingParams> p(rows.size());
    for (size_t i = 0; i < rows.size(); ++i)
      p[i] = GpuSamplingParams{rows[i].temperature, rows[i].top_k, rows[i].top_p, rows[i].seed, rows[i].mask_row};
    b_.sample(logits, p, out_ids, masks);
  }

 private:
  CudaBackend& b_;
};
}  // namespace

void CudaBackend::reserve_workspaces(const BackendWorkspaceDims& d) {
  WorkspacePlan p;
  p.max_tokens = d.max_tokens;
  p.hidden = d.hidden;
  p.intermediate = d.intermediate;
  p.top_k = d.top_k;
  p.num_local_experts = d.num_local_experts;
  p.num_q_heads = d.num_q_heads;
  p.head_dim = d.head_dim;
  p.fp8 = d.fp8;
  reserve(p);
}

CudaBackend::CudaBackend(int device) : device_(device) {
  capture_cap_ = std::make_unique<CudaGraphCapture>(*this);
  sampler_cap_ = std::make_unique<CudaDeviceSampler>(*this);
  MS_CHECK(device >= 0 && device < cuda_device_count(), "cuda: device {} not available ({} devices)", device,
           cuda_device_count());
  CUDA_CHECK(cudaSetDevice(device));
  CUDA_CHECK(cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, device));
  int major = 0, minor = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  cc_ = major * 10 + minor;
  cuda::attention_wgmma_available();  // probes (a synchronous copy) here, never inside a capture
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const size_t cbytes = size_t(kAttnCounterBase + kAttnCounterSlots) * sizeof(int);
  CUDA_CHECK(cudaMalloc(&counters_, cbytes));
  CUDA_CHECK(cudaMemsetAsync(counters_, 0, cbytes, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  // The debug registry's narrowing switches (core/debug_flags.h; read once per process).
  // Tests set these fields per instance after construction instead.
  const DebugFlags& f = debug_flags();
  decode_mega = f.decode_mega;
  if (f.decode_off_has("router")) fuse_router = false;
  if (f.decode_off_has("moe")) moe_direct_max_tokens = 0;
  if (f.decode_off_has("qkv")) fuse_linear_multi = false;
  if (f.decode_off_has("qk_kv")) fuse_qk_write_kv = false;
  if (f.decode_off_has("attn_decode")) attn_decode_max_tokens = 0;
  if (f.decode_off_has("dense_gemv")) gemv_dense_max_tokens = 0;
  if (f.decode_off_has("dense_norm")) fuse_norm_dense = false;
  if (f.decode_off_has("route_dense")) route_norm_dense = false;
  // MOESERVE_PREFILL_OFF: accuracy narrowing (scripts/realshape_check.py); each item names the
  // fallback it runs instead in debug_flags.cpp's table.
  if (f.prefill_off_has("fp8_act")) use_fp8_act_gemm = false;
  if (f.prefill_off_has("lt")) use_lt_fp8 = false;
  if (f.prefill_off_has("attn")) use_attention_prefill = false;
  if (f.prefill_off_has("attn_wgmma")) use_attention_wgmma = false;
  if (f.prefill_off_has("gemm_wgmma")) cuda::g_fp8_gemm_wgmma = false;
  if (f.prefill_off_has("router")) router_gemm_min_tokens = 0;
  if (f.prefill_off_has("router_split")) router_split_bf16 = false;
  if (f.prefill_off_has("gate_cache")) gate_split_cache = false;
  if (f.prefill_off_has("moe_nq")) prefill_moe_norm_quant = false;
  if (f.prefill_off_has("moe_quant_vec")) prefill_moe_quant_vec = false;
  if (f.prefill_off_has("topk")) cuda::g_route_topk_warp = 0;
  if (f.prefill_off_has("topk_redux")) cuda::g_route_topk_warp = 1;
  if (f.prefill_off_has("norm_quant")) prefill_norm_quant = false;
  if (f.prefill_off_has("qk_rope")) cuda::g_qk_rope_vec = false;
  if (f.prefill_off_has("quant_vec")) prefill_quant_vec = false;
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  print_mega_timing();
  if (mega_timing_) cudaFree(mega_timing_);
  for (auto& b : ws_)
    if (b.ptr) cudaFree(b.ptr);
  if (pinned_) cudaFreeHost(pinned_);
  if (pinned_copied_) cudaEventDestroy(pinned_copied_);
  if (counters_) cudaFree(counters_);
  for (auto& w : mega_ws_) cudaFree(w.second);
  expert_tables_.clear();
  gate_splits_.clear();
  lt_.reset();
  if (stream_) cudaStreamDestroy(stream_);
}

std::string CudaBackend::device_name() const {
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  return prop.name;
}

void CudaBackend::mem_info(size_t* free_bytes, size_t* total_bytes) const {
  CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

Tensor CudaBackend::alloc(DType t, const Shape& shape) {
  MS_CHECK(!capturing_, "cuda alloc {} during graph capture", shape_str(shape));
  Tensor out;
  out.dtype = t;
  out.shape = shape;
  out.device = Device::CUDA;
  size_t bytes = std::max<size_t>(out.nbytes(), 1);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  MS_CHECK(err == cudaSuccess, "cuda alloc of {} bytes ({} {}) failed: {}", bytes, dtype_name(t), shape_str(shape),
           cudaGetErrorString(err));
  // On the backend's (non-blocking) stream: a legacy-stream memset is not ordered with the
  // kernels that use this memory next.
  CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  out.data = p;
  out.owner = std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  return out;
}

Tensor CudaBackend::upload(const Tensor& host) {
  MS_CHECK(host.device == Device::CPU, "upload: source must be a host tensor");
  Tensor d = alloc(host.dtype, host.shape);
  // A pageable H2D cudaMemcpy may return before the DMA lands, and the legacy stream does not
  // order our non-blocking stream: copy on the stream and wait (a test saw kernels read
  // half-uploaded rows once launches got faster).
  if (host.nbytes()) {
    CUDA_CHECK(cudaMemcpyAsync(d.data, host.data, host.nbytes(), cudaMemcpyHostToDevice, stream_));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  return d;
}

std::vector<float> CudaBackend::download_f32(const Tensor& t) {
  check_dev(t, "download_f32", "tensor");
  MS_CHECK(!capturing_, "download_f32 during graph capture");
  std::vector<uint8_t> raw(t.nbytes());
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (!raw.empty()) CUDA_CHECK(cudaMemcpy(raw.data(), t.data, raw.size(), cudaMemcpyDeviceToHost));
  std::vector<float> out(size_t(t.numel()));
  if (t.dtype == DType::I32) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = float(reinterpret_cast<const int32_t*>(raw.data())[i]);
  } else if (t.dtype == DType::I64) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = float(reinterpret_cast<const int64_t*>(raw.data())[i]);
  } else {
    convert_to_f32(t.dtype, raw.data(), out.data(), out.size());
  }
  return out;
}

void CudaBackend::copy_from_host(Tensor& dst, const void* src, size_t bytes) {
  check_dev(dst, "copy_from_host", "dst");
  MS_CHECK(bytes == dst.nbytes(), "copy_from_host: {} bytes into a tensor of {} bytes", bytes, dst.nbytes());
  MS_CHECK(!capturing_, "copy_from_host during graph capture");
  // Ordered after earlier work on the stream; synchronous for the host buffer's sake.
  CUDA_CHECK(cudaMemcpyAsync(dst.data, src, bytes, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::copy_from_host_2d(Tensor& dst, size_t dst_pitch, const void* src, size_t src_pitch,
                                    size_t row_bytes, size_t rows) {
  check_dev(dst, "copy_from_host_2d", "dst");
  check_copy_2d(dst, dst_pitch, src_pitch, row_bytes, rows);
  MS_CHECK(!capturing_, "copy_from_host_2d during graph capture");
  if (rows == 0 || row_bytes == 0) return;
  CUDA_CHECK(cudaMemcpy2DAsync(dst.data, dst_pitch, src, src_pitch, row_bytes, rows, cudaMemcpyHostToDevice, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void* CudaBackend::workspace(Slot s, size_t bytes) {
  Buf& b = ws_[s];
  if (b.bytes >= bytes) return b.ptr;
  MS_CHECK(!capturing_, "cuda workspace {} needs {} bytes during graph capture (have {}); call reserve()", int(s),
           bytes, b.bytes);
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (s != kSample && s != kSampleScratch && s != kSampleMask) ++ws_generation_;  // the sampler is not in any graph
  if (b.ptr) CUDA_CHECK(cudaFree(b.ptr));
  b.ptr = nullptr;
  b.bytes = 0;
  const size_t want = std::max<size_t>(bytes, 1 << 20);
  CUDA_CHECK(cudaMalloc(&b.ptr, want));
  b.bytes = want;
  return b.ptr;
}

void CudaBackend::reserve(const WorkspacePlan& p) {
  const size_t P = size_t(p.max_tokens) * p.top_k;
  const size_t tiles = size_t(moe_max_tiles(int(P), kGemvTile, p.num_local_experts));
  workspace(kMoeMeta, (3 * P + 3 * tiles + 1) * 4 + 64);
  workspace(kMoeAct, P * p.intermediate * 2);
  workspace(kMoeY, P * p.hidden * 4);
  // Router logits [T, E]: E is the global expert count, at least the local one (256 for M2.5).
  // (x2: the split-bf16 router GEMM writes [T, 2E].)
  workspace(kRouter, size_t(p.max_tokens) * std::max(p.num_local_experts, 256) * 4 *
                         (router_gemm_min_tokens > 0 && router_split_bf16 ? 2 : 1));
  // Split-KV partials: splits > 1 only when (kv heads x sequences x query tiles) is below
  // 2 x SMs, i.e. for few tokens; 16 splits of 512 tokens covers that (clamped at launch
  // during capture, grown on demand otherwise).
  workspace(kAttnPart, size_t(16) * std::min(std::max(p.max_tokens, 1), 512) * p.num_q_heads * (p.head_dim + 2) * 4);
  // FP8-activation path (cuda_prefill.cpp) at >= fp8_act_min_tokens rows: the largest
  // quantised input of a linear ([T, max(H, heads x head_dim)] e4m3 + one f32 per 128
  // columns; the experts' [T, H] is smaller), the experts' SiLU output [T x top_k, I], the
  // cuBLASLt workspace and the router GEMM's f32 copy of x. Sized here so that warm-ups of the
  // large decode buckets do not reallocate (which would drop every captured graph).
  if (p.fp8 && use_fp8_act_gemm && p.max_tokens >= fp8_act_min_tokens) {
    auto q8 = [](size_t rows, size_t k) { return (rows * k + 255) / 256 * 256 + rows * (k / 128) * 4; };
    const size_t T = size_t(p.max_tokens);
    const size_t kmax = std::max<size_t>(size_t(p.hidden), size_t(p.num_q_heads) * p.head_dim);
    workspace(kQuantX, q8(T, kmax) + T * (kmax / 128) * 4);  // (+ attention's second scale layout)
    workspace(kQuantAct, q8(P, size_t(p.intermediate)));
    if (cc_ == 90 && (use_lt_fp8 || router_gemm_min_tokens > 0)) workspace(kLt, LtGemm::kWorkspaceBytes);
    if (router_gemm_min_tokens > 0)  // f32 copy of x, or the split gate [2E, H] bf16
      workspace(kRouterX, std::max(T * p.hidden * 4, size_t(2) * std::max(p.num_local_experts, 256) * p.hidden * 2));
  }
}

void CudaBackend::fill_random(Tensor& t, uint64_t seed, float scale) {
  check_dev(t, "fill_random", "tensor");
  int kind = t.dtype == DType::F32 ? 0 : t.dtype == DType::BF16 ? 1 : t.dtype == DType::F8_E4M3 ? 2 : -1;
  MS_CHECK(kind >= 0, "fill_random: dtype {} unsupported", dtype_name(t.dtype));
  launch_fill_random(t.data, kind, t.numel(), seed, scale, stream_);
}

void CudaBackend::begin_capture() {
  MS_CHECK(!capturing_, "begin_capture: already capturing");
  CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

CudaGraph CudaBackend::end_capture() {
  MS_CHECK(capturing_, "end_capture without begin_capture");
  capturing_ = false;
  cudaGraph_t g = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(stream_, &g));
  cudaGraphExec_t e = nullptr;
  cudaError_t err = cudaGraphInstantiate(&e, g, 0);
  if (err != cudaSuccess) {
    cudaGraphDestroy(g);
    fail("cudaGraphInstantiate failed: {}", cudaGetErrorString(err));
  }
  return CudaGraph(g, e);
}

// ---- ops ----
void CudaBackend::embedding(const Tensor& table, const Tensor& ids, Tensor& out) {
  check_dev(table, "embedding", "table");
  check_dev(ids, "embedding", "ids");
  check_dev(out, "embedding", "out");
  MS_CHECK(ids.dtype == DType::I32, "embedding: ids must be I32");
  MS_CHECK(table.rank() == 2 && out.numel() == ids.numel() * table.dim(1), "embedding: table {} ids {} out {}",
           shape_str(table.shape), shape_str(ids.shape), shape_str(out.shape));
  launch_embedding(table.data, is_bf16(table, "embedding", "table"), ids.ptr<int32_t>(), int(ids.numel()),
                   int(table.dim(1)), int(table.dim(0)), out.data, is_bf16(out, "embedding", "out"), stream_);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  check_dev(x, "rms_norm", "x");
  check_dev(weight, "rms_norm", "weight");
  check_dev(out, "rms_norm", "out");
  MS_CHECK(weight.numel() == x.dim(-1) && out.numel() == x.numel(), "rms_norm: x {} weight {} out {}",
           shape_str(x.shape), shape_str(weight.shape), shape_str(out.shape));
  RmsNormParams p;
  p.x = x.data, p.x_bf16 = is_bf16(x, "rms_norm", "x");
  p.weight = weight.data, p.weight_bf16 = is_bf16(weight, "rms_norm", "weight");
  p.out = out.data, p.out_bf16 = is_bf16(out, "rms_norm", "out");
  p.rows = rows_of(x), p.cols = int(x.dim(-1)), p.eps = eps;
  launch_rms_norm(p, stream_);
}

void CudaBackend::add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out) {
  prequant_ = {};
  check_dev(residual, "add_rms_norm", "residual");
  check_dev(x, "add_rms_norm", "x");
  check_dev(weight, "add_rms_norm", "weight");
  check_dev(out, "add_rms_norm", "out");
  MS_CHECK(residual.numel() == x.numel() && out.numel() == x.numel() && weight.numel() == x.dim(-1),
           "add_rms_norm: residual {} x {} weight {} out {}", shape_str(residual.shape), shape_str(x.shape),
           shape_str(weight.shape), shape_str(out.shape));
  RmsNormParams p;
  p.x = x.data, p.x_bf16 = is_bf16(x, "add_rms_norm", "x");
  p.residual = residual.data, p.residual_bf16 = is_bf16(residual, "add_rms_norm", "residual");
  p.weight = weight.data, p.weight_bf16 = is_bf16(weight, "add_rms_norm", "weight");
  p.out = out.data, p.out_bf16 = is_bf16(out, "add_rms_norm", "out");
  p.rows = rows_of(x), p.cols = int(x.dim(-1)), p.eps = eps;
  launch_rms_norm(p, stream_);
}

// Checks one linear and fills its GEMV/GEMM parameters (single-matrix fields). Not file-local:
// cuda_prefill.cpp uses it too.
LinParams linear_params(const Tensor& x, const LinearWeight& w, Tensor& out, bool tc) {
  check_dev(x, "linear", "x");
  check_dev(w.weight, "linear", "weight");
  check_dev(out, "linear", "out");
  MS_CHECK(x.dtype == DType::BF16, "linear: activations must be BF16, got {}", dtype_name(x.dtype));
  MS_CHECK(w.weight.rank() == 2, "linear: weight must be 2-D, got {}", shape_str(w.weight.shape));
  const int N = int(w.out_features()), K = int(w.in_features()), T = rows_of(x);
  MS_CHECK(x.dim(-1) == K && out.numel() == int64_t(T) * N, "linear: x {} weight {} out {}", shape_str(x.shape),
           shape_str(w.weight.shape), shape_str(out.shape));
  LinParams p;
  p.tc = tc;
  p.mode = LinMode::kStore;
  p.x = x.data, p.ldx = K, p.M = T;
  p.w = w.weight.data, p.N = N, p.K = K;
  if (w.fp8()) {
    check_dev(w.scale_inv, "linear", "scale_inv");
    MS_CHECK(w.scale_inv.dtype == DType::F32 && w.block_out > 0 && w.block_in > 0, "linear: bad FP8 block scales");
    MS_CHECK(w.scale_inv.rank() == 2 && w.scale_inv.dim(0) == ceil_div(N, w.block_out) &&
                 w.scale_inv.dim(1) == ceil_div(K, w.block_in),
             "linear: scale_inv {} does not match weight {} with blocks [{}, {}]", shape_str(w.scale_inv.shape),
             shape_str(w.weight.shape), w.block_out, w.block_in);
    p.fp8 = true, p.s = w.scale_inv.ptr<float>(), p.bo = w.block_out, p.bi = w.block_in;
    p.s_cols = int(w.scale_inv.dim(1));
  } else {
    MS_CHECK(w.weight.dtype == DType::BF16, "linear: weight dtype {} unsupported on CUDA (BF16 or F8_E4M3)",
             dtype_name(w.weight.dtype));
    p.fp8 = false, p.bo = p.bi = 128;
  }
  p.out = out.data, p.ldo = N, p.out_f32 = !is_bf16(out, "linear", "out");
  return p;
}

void CudaBackend::linear(const Tensor& x, const LinearWeight& w, Tensor& out) {
  const LinParams p = linear_params(x, w, out, use_gemv_tc);
  const int T = p.M, N = p.N;
  // x's FP8 form from the op before (prefill attention), if made.
  if (const Prequant pq = take_prequant(p.x, T, p.K); pq.q && linear_prequant(p, pq)) {
    ++prequant_uses_;
    return;
  }
  // Narrow outputs (k/v projections: N = 1024) give the 64 x 128 GEMM tiles too few blocks at
  // decode batch sizes; the GEMV path (8-row tiles sharing weight rows through L2) measured
  // ~3x faster there at 64 rows on the H200, and slower for wide N, so only narrow N uses it.
  // FP8 linears the tensor-core GEMV supports take it up to linear_gemv_tc_max_tokens rows:
  // at 64 rows the 64 x 128 GEMM gives q/o projections only 24-48 blocks (~140 GB/s).
  if (T >= fp8_act_min_tokens && linear_fp8_act(p)) return;
  if (dense_gemv(p)) return;
  if (T <= linear_gemv_max_tokens || (T <= 64 && N <= linear_gemv_narrow_n) ||
      (T <= linear_gemv_tc_max_tokens && gemv_tc_supported(p)))
    launch_gemv(p, stream_);
  else
    launch_gemm(p, stream_);
}

// The dense decode GEMV (k_gemv_dense.cu) for q/k/v (several weights or the fused norm)
// where it applies; false: nothing launched. Single linears (o_proj) measured slower on it
// than on k_gemv_tc.cu inside the batch-1 graph and keep that kernel.
bool CudaBackend::dense_gemv(const LinParams& p) {
  if (p.nseg == 0 && !p.norm) return false;
  if (!(use_gemv_tc && p.M <= gemv_dense_max_tokens && p.M <= linear_gemv_tc_max_tokens && gemv_dense_supported(p)))
    return false;
  launch_gemv_dense(p, num_sms_, stream_);
  ++gemv_dense_launches;
  return true;
}

namespace {
// One tensor-core GEMV launch over all weights (q/k/v at decode: 256 blocks instead of
// 192 + 32 + 32 in three dependent launches) when every weight takes that path.
bool multi_params(const Tensor& x, const LinearWeight* const* ws, Tensor* const* outs, int n, int max_tokens,
                  LinParams* m) {
  if (n < 1 || n > LinParams::kMaxSegs) return false;
  for (int i = 0; i < n; ++i) {
    const LinParams p = linear_params(x, *ws[i], *outs[i], true);
    if (i == 0) *m = p;
    if (!(p.M <= max_tokens && gemv_tc_supported(p) && p.K == m->K && p.out_f32 == m->out_f32)) return false;
    m->seg[i] = {p.w, p.s, p.out, p.N, p.s_cols, p.ldo};
    m->seg_block[i + 1] = m->seg_block[i] + ceil_div(p.N, 32) * ceil_div(p.M, kGemvTile);
  }
  m->nseg = n;
  return true;
}
}  // namespace

void CudaBackend::linear_multi(const Tensor& x, const LinearWeight* const* ws, Tensor* const* outs, int n) {
  if (rows_of(x) >= fp8_act_min_tokens && linear_multi_fp8_act(x, nullptr, ws, outs, n)) return;
  LinParams m;
  if (fuse_linear_multi && n > 1 && use_gemv_tc && multi_params(x, ws, outs, n, linear_gemv_tc_max_tokens, &m)) {
    if (!dense_gemv(m)) launch_gemv_tc(m, stream_);
    return;
  }
  for (int i = 0; i < n; ++i) linear(x, *ws[i], *outs[i]);
}

void CudaBackend::add_rms_norm_linear_multi(Tensor& residual, const Tensor& x, const Tensor& weight, float eps,
                                            Tensor& out, const LinearWeight* const* ws, Tensor* const* outs, int n) {
  const bool bf = residual.dtype == DType::BF16 && x.dtype == DType::BF16 && weight.dtype == DType::BF16 &&
                  out.dtype == DType::BF16;
  LinParams m;
  const bool dense_norm = fuse_norm_dense && gemv_dense_max_tokens > 0;
  if (dense_norm && use_gemv_tc && bf && residual.device == Device::CUDA && x.device == Device::CUDA &&
      weight.device == Device::CUDA && out.device == Device::CUDA && residual.numel() == x.numel() &&
      out.numel() == x.numel() && out.shape == x.shape && weight.numel() == x.dim(-1) &&
      aligned16({residual.data, x.data, weight.data, out.data}) &&
      multi_params(out, ws, outs, n, linear_gemv_tc_max_tokens, &m)) {
    m.norm = true;
    m.x = x.data;
    m.norm_res = residual.data, m.norm_w = weight.data, m.norm_out = out.data, m.eps = eps;
    m.norm_counter = counters_ + 1;
    if (dense_gemv(m)) return;
  }
  if (bf && rows_of(x) >= fp8_act_min_tokens && residual.numel() == x.numel() && out.numel() == x.numel() &&
      out.shape == x.shape && weight.numel() == x.dim(-1)) {
    check_dev(residual, "add_rms_norm_linear_multi", "residual");
    check_dev(x, "add_rms_norm_linear_multi", "x");
    check_dev(weight, "add_rms_norm_linear_multi", "weight");
    check_dev(out, "add_rms_norm_linear_multi", "out");
    NormFuse nf{&residual, &x, &weight, eps};
    if (linear_multi_fp8_act(out, &nf, ws, outs, n)) return;
  }
  add_rms_norm(residual, x, weight, eps, out);
  linear_multi(out, ws, outs, n);
}

void CudaBackend::row_sum_squares(const Tensor& x, Tensor& out) {
  check_dev(x, "row_sum_squares", "x");
  check_dev(out, "row_sum_squares", "out");
  MS_CHECK(out.dtype == DType::F32 && out.numel() == rows_of(x), "row_sum_squares: out must be F32 [{}]", rows_of(x));
  launch_row_sum_squares(x.data, is_bf16(x, "row_sum_squares", "x"), rows_of(x), int(x.dim(-1)), out.ptr<float>(),
                         stream_);
}

void CudaBackend::qk_norm_rope(const QkNormRopeArgs& a) { qk_norm_rope_impl(a, nullptr, nullptr, nullptr); }

void CudaBackend::qk_norm_rope_write_kv(const QkNormRopeArgs& a, const Tensor& v, KVCacheLayer& kv,
                                        const AttentionMeta& meta) {
  if (!fuse_qk_write_kv) {
    qk_norm_rope_impl(a, nullptr, nullptr, nullptr);
    write_kv(*a.k, v, kv, meta);
    return;
  }
  qk_norm_rope_impl(a, &v, &kv, &meta);
}

void CudaBackend::qk_norm_rope_attention(const QkNormRopeArgs& qk, const Tensor& v, KVCacheLayer& kv,
                                         const AttentionMeta& meta, const AttentionArgs& attn) {
  MS_CHECK(attn.q == qk.q && attn.kv == &kv && attn.meta == &meta,
           "qk_norm_rope_attention: attention must read the normed q and the written cache");
  // The fused decode kernels implement full-width QK-norm with plain NeoX RoPE only.
  if (!qk_fast_spec(qk)) return Backend::qk_norm_rope_attention(qk, v, kv, meta, attn);
  if (meta.num_tokens > 0 && meta.num_tokens <= attn_decode_max_tokens && meta.max_query_len == 1) {
    const QkNormRopeParams n = qk_norm_rope_params(qk, &v, &kv, &meta);
    const AttnParams p = attention_params(attn);
    if (attn_decode_version == 2 && attn_decode2_supported(p, n)) {
      const int groups = p.num_seqs * p.Hkv;
      int splits = attn_decode2_splits(num_sms_, groups, meta.max_context_len, attn_decode_max_splits);
      // 16-block clusters only when all of them fit on the device at once.
      if (splits == 16 && attn_decode2_max_cluster(16) < groups) splits = 8;
      launch_attn_decode2(p, n, splits, stream_);
      return;
    }
    if (attn_decode_supported(p, n)) {
      launch_attn_decode(p, n, attn_decode_splits(num_sms_, p.num_seqs * p.Hkv, meta.max_context_len), stream_);
      return;
    }
  }
  qk_norm_rope_write_kv(qk, v, kv, meta);
  attention(attn);
}

bool CudaBackend::qk_fast_spec(const QkNormRopeArgs& a) {
  return a.norm == QkNormMode::FullWidth && a.rope.plain();
}

void CudaBackend::qk_norm_rope_impl(const QkNormRopeArgs& a, const Tensor* v, KVCacheLayer* kv,
                                    const AttentionMeta* meta) {
  if (qk_fast_spec(a)) {
    launch_qk_norm_rope(qk_norm_rope_params(a, v, kv, meta), stream_);
    return;
  }
  // Other QK-norm modes / RoPE specs: the generic kernel, then the KV write.
  MS_CHECK(a.q && a.k && a.positions && (a.norm == QkNormMode::None || (a.q_norm_weight && a.k_norm_weight)),
           "qk_norm_rope: missing argument");
  check_dev(*a.q, "qk_norm_rope", "q");
  check_dev(*a.k, "qk_norm_rope", "k");
  check_dev(*a.positions, "qk_norm_rope", "positions");
  MS_CHECK(a.positions->dtype == DType::I32, "qk_norm_rope: positions must be I32");
  GenericQkNormRopeParams p;
  p.q = a.q->data, p.k = a.k->data;
  p.positions = a.positions->ptr<int32_t>();
  p.act_bf16 = is_bf16(*a.q, "qk_norm_rope", "q");
  MS_CHECK(a.k->dtype == a.q->dtype, "qk_norm_rope: q/k must share a dtype");
  p.T = int(rows_of(*a.q));
  p.q_width = int(a.q->dim(-1)), p.k_width = int(a.k->dim(-1));
  MS_CHECK(rows_of(*a.k) == p.T && a.positions->numel() == p.T, "qk_norm_rope: q {} k {} positions {}",
           shape_str(a.q->shape), shape_str(a.k->shape), shape_str(a.positions->shape));
  const RopeSpec& r = a.rope;
  MS_CHECK(r.head_dim > 0 && p.q_width % r.head_dim == 0 && p.k_width % r.head_dim == 0 && r.rotary_dim % 2 == 0 &&
               r.rotary_dim <= r.head_dim && (r.scaling != RopeScaling::Yarn || r.original_max_position > 0),
           "qk_norm_rope: head_dim {} rotary_dim {} widths {} / {}", r.head_dim, r.rotary_dim, p.q_width, p.k_width);
  if (a.norm != QkNormMode::None) {
    check_dev(*a.q_norm_weight, "qk_norm_rope", "q_norm_weight");
    check_dev(*a.k_norm_weight, "qk_norm_rope", "k_norm_weight");
    MS_CHECK(a.k_norm_weight->dtype == a.q_norm_weight->dtype, "qk_norm_rope: q/k norm weights must share a dtype");
    p.q_w = a.q_norm_weight->data, p.k_w = a.k_norm_weight->data;
    p.w_bf16 = is_bf16(*a.q_norm_weight, "qk_norm_rope", "q_norm_weight");
    const int64_t wq = a.norm == QkNormMode::PerHead ? r.head_dim : p.q_width;
    const int64_t wk = a.norm == QkNormMode::PerHead ? r.head_dim : p.k_width;
    MS_CHECK(a.q_norm_weight->numel() == wq && a.k_norm_weight->numel() == wk,
             "qk_norm_rope: norm weights {} / {} must have {} / {} elements", a.q_norm_weight->numel(),
             a.k_norm_weight->numel(), wq, wk);
  }
  p.norm = a.norm, p.rope = r, p.eps = a.eps;
  p.q_sumsq = a.q_sum_squares ? a.q_sum_squares->ptr<float>() : nullptr;
  p.k_sumsq = a.k_sum_squares ? a.k_sum_squares->ptr<float>() : nullptr;
  p.q_full = a.q_full_width > 0 ? a.q_full_width : p.q_width;
  p.k_full = a.k_full_width > 0 ? a.k_full_width : p.k_width;
  launch_qk_norm_rope_generic(p, stream_);
  if (kv) write_kv(*a.k, *v, *kv, *meta);
}

void CudaBackend::silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) {
  prequant_ = {};  // out is rewritten: no FP8 form of an earlier tensor may be taken for it
  check_dev(gate, "silu_mul", "gate");
  check_dev(up, "silu_mul", "up");
  check_dev(out, "silu_mul", "out");
  MS_CHECK(gate.numel() == up.numel() && gate.numel() == out.numel() && gate.dtype == up.dtype &&
               gate.dtype == out.dtype,
           "silu_mul: gate {} up {} out {} must match", shape_str(gate.shape), shape_str(up.shape),
           shape_str(out.shape));
  launch_silu_mul(gate.data, up.data, out.data, is_bf16(gate, "silu_mul", "gate"), gate.numel(), stream_);
}

QkNormRopeParams CudaBackend::qk_norm_rope_params(const QkNormRopeArgs& a, const Tensor* v, KVCacheLayer* kv,
                                                  const AttentionMeta* meta) {
  MS_CHECK(a.q && a.k && a.q_norm_weight && a.k_norm_weight && a.positions, "qk_norm_rope: missing argument");
  check_dev(*a.q, "qk_norm_rope", "q");
  check_dev(*a.k, "qk_norm_rope", "k");
  check_dev(*a.positions, "qk_norm_rope", "positions");
  QkNormRopeParams p;
  p.q = a.q->data, p.k = a.k->data;
  p.act_bf16 = is_bf16(*a.q, "qk_norm_rope", "q");
  MS_CHECK(a.k->dtype == a.q->dtype && a.k_norm_weight->dtype == a.q_norm_weight->dtype,
           "qk_norm_rope: q/k (and their weights) must share a dtype");
  p.q_w = a.q_norm_weight->data, p.k_w = a.k_norm_weight->data;
  p.w_bf16 = is_bf16(*a.q_norm_weight, "qk_norm_rope", "q_norm_weight");
  p.positions = a.positions->ptr<int32_t>();
  p.T = rows_of(*a.q);
  p.q_width = int(a.q->dim(-1)), p.k_width = int(a.k->dim(-1));
  MS_CHECK(rows_of(*a.k) == p.T && a.positions->numel() == p.T, "qk_norm_rope: q {} k {} positions {}",
           shape_str(a.q->shape), shape_str(a.k->shape), shape_str(a.positions->shape));
  MS_CHECK(a.q_norm_weight->numel() == p.q_width && a.k_norm_weight->numel() == p.k_width,
           "qk_norm_rope: norm weights {} / {} vs widths {} / {}", a.q_norm_weight->numel(), a.k_norm_weight->numel(),
           p.q_width, p.k_width);
  const RopeSpec& r = a.rope;
  MS_CHECK(r.head_dim > 0 && p.q_width % r.head_dim == 0 && p.k_width % r.head_dim == 0 && r.rotary_dim % 2 == 0 &&
               r.rotary_dim <= r.head_dim,
           "qk_norm_rope: head_dim {} rotary_dim {} widths {} / {}", r.head_dim, r.rotary_dim, p.q_width, p.k_width);
  p.head_dim = r.head_dim, p.rotary_dim = r.rotary_dim, p.theta = r.theta, p.eps = a.eps;
  p.q_sumsq = a.q_sum_squares ? a.q_sum_squares->ptr<float>() : nullptr;
  p.k_sumsq = a.k_sum_squares ? a.k_sum_squares->ptr<float>() : nullptr;
  p.q_full = a.q_full_width > 0 ? a.q_full_width : p.q_width;
  p.k_full = a.k_full_width > 0 ? a.k_full_width : p.k_width;
  if (kv) {
    // Same checks as write_kv; the cache rows are the k rows after norm + RoPE.
    check_dev(*v, "qk_norm_rope_write_kv", "v");
    check_dev(kv->k, "qk_norm_rope_write_kv", "k cache");
    check_dev(kv->v, "qk_norm_rope_write_kv", "v cache");
    check_dev(meta->slot_mapping, "qk_norm_rope_write_kv", "slot_mapping");
    MS_CHECK(kv->k.rank() == 4 && kv->k.shape == kv->v.shape && kv->k.dtype == kv->v.dtype,
             "qk_norm_rope_write_kv: cache must be [blocks, bs, Hkv, D]");
    MS_CHECK(kv->k.dim(2) * kv->k.dim(3) == p.k_width && v->numel() == a.k->numel() && v->dtype == a.k->dtype &&
                 meta->slot_mapping.numel() >= p.T,
             "qk_norm_rope_write_kv: k {} v {} cache {}", shape_str(a.k->shape), shape_str(v->shape),
             shape_str(kv->k.shape));
    p.v = v->data, p.kc = kv->k.data, p.vc = kv->v.data;
    p.cache_fp8 = kv->fp8();
    p.cache_bf16 = !p.cache_fp8 && is_bf16(kv->k, "qk_norm_rope_write_kv", "cache");
    p.k_scale = kv->k_scale, p.v_scale = kv->v_scale;
    p.slots = meta->slot_mapping.ptr<int32_t>();
    p.num_slots = kv->k.dim(0) * kv->k.dim(1);
  }
  return p;
}

void CudaBackend::write_kv(const Tensor& k, const Tensor& v, KVCacheLayer& kv, const AttentionMeta& meta) {
  check_dev(k, "write_kv", "k");
  check_dev(v, "write_kv", "v");
  check_dev(kv.k, "write_kv", "k cache");
  check_dev(kv.v, "write_kv", "v cache");
  check_dev(meta.slot_mapping, "write_kv", "slot_mapping");
  MS_CHECK(kv.k.rank() == 4 && kv.k.shape == kv.v.shape, "write_kv: cache must be [blocks, bs, Hkv, D]");
  const int width = int(kv.k.dim(2) * kv.k.dim(3));
  const int T = rows_of(k);
  MS_CHECK(k.dim(-1) == width && v.numel() == k.numel() && meta.slot_mapping.numel() >= T,
           "write_kv: k {} v {} cache {}", shape_str(k.shape), shape_str(v.shape), shape_str(kv.k.shape));
  MS_CHECK(k.dtype == v.dtype, "write_kv: k/v dtypes differ");
  MS_CHECK(kv.k.dtype == kv.v.dtype, "write_kv: K / V cache dtypes differ");
  KvStoreSpec cs;
  cs.fp8 = kv.fp8();
  cs.bf16 = !cs.fp8 && is_bf16(kv.k, "write_kv", "cache");
  cs.k_scale = kv.k_scale, cs.v_scale = kv.v_scale;
  launch_write_kv(k.data, v.data, is_bf16(k, "write_kv", "k"), kv.k.data, kv.v.data, cs, meta.slot_mapping.ptr<int32_t>(),
                  T, width, kv.k.dim(0) * kv.k.dim(1), stream_);
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  prequant_ = {};
  check_dev(a, "add", "a");
  check_dev(b, "add", "b");
  check_dev(out, "add", "out");
  MS_CHECK(a.numel() == b.numel() && a.numel() == out.numel(), "add: shapes {} {} {}", shape_str(a.shape),
           shape_str(b.shape), shape_str(out.shape));
  launch_add(a.data, is_bf16(a, "add", "a"), b.data, is_bf16(b, "add", "b"), out.data, is_bf16(out, "add", "out"),
             a.numel(), stream_);
}

}  // namespace moeserve
