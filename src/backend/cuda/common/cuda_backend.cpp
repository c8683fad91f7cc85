// CudaBackend: argument checks, workspace management and kernel dispatch (kernels.h).
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include "backend/cuda/linear/cublaslt.h"
#include "backend/cuda/common/cuda_check.h"
#include "backend/cuda/common/kernels.h"
#include "backend/cuda/common/kernels_generic.h"
#include "backend/cuda/common/pdl.cuh"
#include "backend/cuda/linear/kernels_fp8.h"
#include "backend/cuda/common/kernels_prefill.h"
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
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  const size_t cbytes = size_t(kAttnCounterBase + kAttnCounterSlots) * sizeof(int);
  CUDA_CHECK(cudaMalloc(&counters_, cbytes));
  CUDA_CHECK(cudaMemsetAsync(counters_, 0, cbytes, stream_));
  CUDA_CHECK(cudaStreamSynchronize(stream_));
  // What the device runs, probed once here (never inside a capture): the selectors read it.
  caps_.name = device_name();
  caps_.code_arch = code_arch();
  caps_.sm90a = code_has_sm90a();
  caps_.cc = major * 10 + minor;
  caps_.num_sms = num_sms_;
  caps_.attn_wgmma = cuda::attention_wgmma_available();
  caps_.fp8_wgmma = cuda::fp8_wgmma_available();
  caps_.sample_resident = cuda::sample_max_resident();
  // The debug registry's narrowing switches (core/debug_flags.h; read once per process).
  // Tests set these fields per instance after construction instead.
  tuning.apply_debug_flags(debug_flags());
  check_tuning();
}

void CudaBackend::check_tuning() const {
  const std::string e = tuning.validate();
  MS_CHECK(e.empty(), "cuda backend: {}", e);
}

void CudaBackend::set_tuning(const CudaTuning& t) {
  const std::string e = t.validate();
  MS_CHECK(e.empty(), "cuda backend: {}", e);
  tuning = t;
}

WorkspaceView CudaBackend::workspace_view() const {
  WorkspaceView v;
  if (!capturing_) return v;  // every slot grows on demand
  v.capturing = true;
  v.quant_x = ws_[kQuantX].bytes, v.quant_act = ws_[kQuantAct].bytes, v.lt = ws_[kLt].bytes;
  v.router = ws_[kRouter].bytes, v.router_x = ws_[kRouterX].bytes, v.attn_part = ws_[kAttnPart].bytes;
  v.lt_handle = lt_ != nullptr;
  return v;
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
  check_tuning();
  const CudaTuning& t = tuning;
  const size_t P = size_t(p.max_tokens) * p.top_k;
  const size_t tiles = size_t(moe_max_tiles(int(P), kGemvTile, p.num_local_experts));
  workspace(kMoeMeta, (3 * P + 3 * tiles + 1) * 4 + 64);
  workspace(kMoeAct, P * p.intermediate * 2);
  workspace(kMoeY, P * p.hidden * 4);
  // Router logits [T, E]: E is the global expert count, at least the local one (256 for M2.5).
  // (x2: the split-bf16 router GEMM writes [T, 2E].)
  workspace(kRouter, size_t(p.max_tokens) * std::max(p.num_local_experts, 256) * 4 *
                         (t.router_gemm_min_tokens > 0 && t.router_split_bf16 ? 2 : 1));
  // Split-KV partials: splits > 1 only when (kv heads x sequences x query tiles) is below
  // 2 x SMs, i.e. for few tokens; 16 splits of 512 tokens covers that (clamped at launch
  // during capture, grown on demand otherwise).
  workspace(kAttnPart, size_t(16) * std::min(std::max(p.max_tokens, 1), 512) * p.num_q_heads * (p.head_dim + 2) * 4);
  // FP8-activation path (cuda_prefill.cpp) at >= fp8_act_min_tokens rows: the largest
  // quantised input of a linear ([T, max(H, heads x head_dim)] e4m3 + one f32 per 128
  // columns; the experts' [T, H] is smaller), the experts' SiLU output [T x top_k, I], the
  // cuBLASLt workspace and the router GEMM's f32 copy of x. Sized here so that warm-ups of the
  // large decode buckets do not reallocate (which would drop every captured graph).
  if (p.fp8 && t.use_fp8_act_gemm && p.max_tokens >= t.fp8_act_min_tokens) {
    auto q8 = [](size_t rows, size_t k) { return (rows * k + 255) / 256 * 256 + rows * (k / 128) * 4; };
    const size_t T = size_t(p.max_tokens);
    const size_t kmax = std::max<size_t>(size_t(p.hidden), size_t(p.num_q_heads) * p.head_dim);
    workspace(kQuantX, q8(T, kmax) + T * (kmax / 128) * 4);  // (+ attention's second scale layout)
    workspace(kQuantAct, q8(P, size_t(p.intermediate)));
    if (caps_.cc == 90 && (t.use_lt_fp8 || t.router_gemm_min_tokens > 0)) workspace(kLt, LtGemm::kWorkspaceBytes);
    if (t.router_gemm_min_tokens > 0)  // f32 copy of x, or the split gate [2E, H] bf16
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
  check_tuning();
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
  if (!tuning.fuse_qk_write_kv) {
    qk_norm_rope_impl(a, nullptr, nullptr, nullptr);
    write_kv(*a.k, v, kv, meta);
    return;
  }
  qk_norm_rope_impl(a, &v, &kv, &meta);
}

namespace {
AttentionOpDesc attention_desc(const AttnParams& p, const AttentionMeta& m, const WorkspaceView& ws) {
  AttentionOpDesc d;
  d.T = p.T, d.num_seqs = p.num_seqs, d.max_query_len = p.max_query_len, d.max_context_len = m.max_context_len;
  d.Hq = p.Hq, d.Hkv = p.Hkv, d.D = p.D, d.block_size = p.block_size, d.kv_fp8 = p.kv_fp8;
  d.ws = ws;
  return d;
}
}  // namespace

void CudaBackend::qk_norm_rope_attention(const QkNormRopeArgs& qk, const Tensor& v, KVCacheLayer& kv,
                                         const AttentionMeta& meta, const AttentionArgs& attn) {
  MS_CHECK(attn.q == qk.q && attn.kv == &kv && attn.meta == &meta,
           "qk_norm_rope_attention: attention must read the normed q and the written cache");
  // The fused decode kernels implement full-width QK-norm with plain NeoX RoPE only.
  if (!qk_fast_spec(qk)) return Backend::qk_norm_rope_attention(qk, v, kv, meta, attn);
  if (meta.num_tokens > 0 && meta.num_tokens <= tuning.attn_decode_max_tokens && meta.max_query_len == 1) {
    const QkNormRopeParams n = qk_norm_rope_params(qk, &v, &kv, &meta);
    const AttnParams p = attention_params(attn);
    DecodeAttnOpDesc d;
    d.attn = attention_desc(p, meta, workspace_view());
    d.attn.kv_fp8 = p.kv_fp8 || n.cache_fp8 || !n.cache_bf16;
    d.act_bf16 = n.act_bf16, d.w_bf16 = n.w_bf16;
    d.rope_head_dim = n.head_dim, d.rotary_dim = n.rotary_dim, d.q_width = n.q_width, d.k_width = n.k_width;
    d.qk_T = n.T;
    // 16-block clusters: ask the device once whether they all fit (only when allowed at all).
    if (tuning.attn_decode_max_splits >= 16 && caps_.max_clusters16 < 0)
      caps_.max_clusters16 = attn_decode2_max_cluster(16);
    const AttentionKernel k = select_decode_attention(d, caps_, tuning);
    if (k.id == AttentionKernel::kDecode2) return launch_attn_decode2(p, n, k.splits, stream_);
    if (k.id == AttentionKernel::kDecode1) return launch_attn_decode(p, n, k.splits, stream_);
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
    QkNormRopeParams p = qk_norm_rope_params(a, v, kv, meta);
    QkNormRopeOpDesc d;
    d.T = p.T, d.act_bf16 = p.act_bf16, d.w_bf16 = p.w_bf16, d.write_kv = p.kc != nullptr, d.cache_bf16 = p.cache_bf16;
    d.head_dim = p.head_dim, d.rotary_dim = p.rotary_dim, d.q_width = p.q_width, d.k_width = p.k_width;
    d.aligned = aligned16({p.q, p.k, p.q_w, p.k_w, p.v, p.kc, p.vc});
    CudaTuning t = tuning;
    t.fuse_qk_write_kv = true;  // (qk_norm_rope_write_kv decided that: kv is null when not fused)
    const QkNormRopeKernel k = select_qk_norm_rope(d, caps_, t);
    p.rope_vec = k.id == QkNormRopeKernel::kRopeVec;
    launch_qk_norm_rope(p, stream_);
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
