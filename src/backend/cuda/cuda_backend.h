// CudaBackend: the Backend op interface on one CUDA device, with bf16 activations.
//
// Capture safety: every op only launches kernels on the backend's stream; none allocates,
// synchronises or reads device memory on the host, provided the workspaces were sized
// beforehand (reserve(), or one un-captured run of the same shapes). So a model's decode
// step can be captured into a CUDA graph (begin_capture / end_capture) and replayed with
// new metadata written into the same device buffers. Allocation during capture throws.
//
// Extra CUDA-only ops (not in backend.h): sample() (greedy / temperature / top-k / top-p
// on the GPU; not capture-safe: it uploads per-row parameters), memory queries and graphs.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/decode_layer_op.h"
#include "backend/cuda/attention/select_attention.h"
#include "backend/cuda/common/tuning.h"
#include "backend/cuda/linear/select_linear.h"
#include "backend/cuda/moe/select_moe.h"
#include "backend/cuda/norm_rope/select_norm_rope.h"
#include "backend/cuda/sampling/select_sampling.h"

namespace moeserve {
namespace cuda {
class LtGemm;
struct LinParams;
struct AttnParams;
struct QkNormRopeParams;
struct RouteParams;
struct QuantParams;
struct ExpertPtrs;
struct DecodeLayerParams;
}  // namespace cuda

struct GpuSamplingParams {
  float temperature = 1.f;  // <= 0: greedy
  int top_k = 0;            // <= 0: off
  float top_p = 1.f;        // >= 1: off
  uint64_t seed = 0;        // per row and step (the engine mixes the request seed and step)
  int32_t mask_row = -1;    // row of the DeviceMasks given to sample() (-1: unmasked)
};

// Upper bounds used to pre-size workspaces so that later steps (and graph capture) never
// allocate.
struct WorkspacePlan {
  int max_tokens = 0;
  int hidden = 0;
  int intermediate = 0;  // per-expert I (local slice)
  int top_k = 0;
  int num_local_experts = 0;
  int num_q_heads = 0;
  int head_dim = 0;
  // FP8 block-scaled weights: also size the FP8-activation path's buffers (quantised
  // activations and scales, the cuBLASLt workspace, the router's f32 input) when max_tokens
  // reaches fp8_act_min_tokens, so decode graphs of >= 128 rows capture that path.
  bool fp8 = false;
};

// A captured CUDA graph (instantiated), replayed on a stream.
class CudaGraph {
 public:
  CudaGraph() = default;
  CudaGraph(cudaGraph_t g, cudaGraphExec_t e) : graph_(g), exec_(e) {}
  CudaGraph(CudaGraph&& o) noexcept { *this = std::move(o); }
  CudaGraph& operator=(CudaGraph&& o) noexcept;
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph();
  bool valid() const { return exec_ != nullptr; }
  void replay(cudaStream_t s) const;

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device = 0);
  ~CudaBackend() override;

  Device device() const override { return Device::CUDA; }
  std::string name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::BF16; }

  Tensor alloc(DType t, const Shape& shape) override;
  Tensor upload(const Tensor& host) override;
  std::vector<float> download_f32(const Tensor& t) override;
  void copy_from_host(Tensor& dst, const void* src, size_t bytes) override;
  void copy_from_host_2d(Tensor& dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t row_bytes,
                         size_t rows) override;
  void synchronize() override;

  void embedding(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out) override;
  void linear(const Tensor& x, const LinearWeight& w, Tensor& out) override;
  void row_sum_squares(const Tensor& x, Tensor& out) override;
  void qk_norm_rope(const QkNormRopeArgs& args) override;
  void write_kv(const Tensor& k, const Tensor& v, KVCacheLayer& kv, const AttentionMeta& meta) override;
  void attention(const AttentionArgs& args) override;
  // MLA (DeepSeek-V3 family): k_mla.cu (latent norm / RoPE / cache write; absorbed attention).
  void mla_rope_write_kv(const MlaArgs& args) override;
  void mla_attention(const MlaArgs& args) override;
  void moe_route(const Tensor& x, const MoeWeights& moe, MoeRouting& out) override;
  void moe_experts(const Tensor& x, const MoeWeights& moe, const MoeRouting& routing, Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override;
  void linear_multi(const Tensor& x, const LinearWeight* const* ws, Tensor* const* outs, int n) override;
  void add_rms_norm_linear_multi(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                                 const LinearWeight* const* ws, Tensor* const* outs, int n) override;
  void qk_norm_rope_write_kv(const QkNormRopeArgs& args, const Tensor& v, KVCacheLayer& kv,
                             const AttentionMeta& meta) override;
  void qk_norm_rope_attention(const QkNormRopeArgs& qk, const Tensor& v, KVCacheLayer& kv, const AttentionMeta& meta,
                              const AttentionArgs& attn) override;
  void add_rms_norm_route(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out,
                          const MoeWeights& moe, MoeRouting& routing) override;
  // One token, every linear FP8 128x128, head_dim 128, one rank, decode_mega on: one
  // persistent kernel (k_decode_layer.cu, cuda_decode_layer.cpp); else the default body.
  // (decode_layers keeps Backend's body: one decode_layer per layer.)
  void decode_layer(const DecodeLayerArgs& a) override;

  // ---- CUDA-only ----
  // out_ids [R] I32 (device) = a token per row of logits [R, V] (f32 or bf16, device).
  // masks: the masked rows' allowed-token bitsets in host memory (capabilities.h), staged with
  // the parameters and uploaded into the kSampleMask workspace (one fixed address once grown
  // to the largest batch; the kernel reads it through SampleRowParams::mask_row).
  void sample(const Tensor& logits, const std::vector<GpuSamplingParams>& params, Tensor& out_ids,
              const DeviceMasks& masks = {});
  void reserve(const WorkspacePlan& plan);
  // Fills a F32 / BF16 / F8_E4M3 tensor with uniform values in [-scale, scale] (synthetic weights).
  void fill_random(Tensor& t, uint64_t seed, float scale);
  void begin_capture();
  CudaGraph end_capture();
  bool capturing() const { return capturing_; }
  // Bumped whenever a workspace a forward step uses is reallocated (graphs captured before
  // then point at freed memory and must be recaptured). The sampling workspace is not counted.
  uint64_t workspace_generation() const { return ws_generation_; }
  // Cached split-bf16 router gates (tests: the cache must not outlive its gates).
  size_t gate_split_count() const { return gate_splits_.size(); }
  // FP8 activations taken from the op before (attention -> o_proj, norm -> experts) so far.
  uint64_t prequant_uses() const { return prequant_uses_; }
  cudaStream_t stream() const { return stream_; }
  int device_index() const override { return device_; }
  std::string device_name() const override;
  int num_sms() const { return num_sms_; }
  void mem_info(size_t* free_bytes, size_t* total_bytes) const;
  // Capabilities (backend/capabilities.h).
  GraphCapture* graph_capture() override { return capture_cap_.get(); }
  DeviceSampler* device_sampler() override { return sampler_cap_.get(); }
  bool memory_info(size_t* free_bytes, size_t* total_bytes) override {
    mem_info(free_bytes, total_bytes);
    return true;
  }
  void reserve_workspaces(const BackendWorkspaceDims& dims) override;
  // V head dim != K head dim: the CUDA attention kernels read K and V with one head dim.
  std::string attention_layout_problem(const KvLayout& layout) const override;
  // Routed experts' INT4 weights run packed on the W4A16 kernels (k_moe_int4.cu); any other
  // INT4 linear (attention, shared expert, dense MLP, lm_head) is refused naming the tensor.
  std::string int4_weights_problem(const std::string& tensor) const override;
  bool int4_experts_packed() const override { return true; }
  bool device_queue(DeviceQueue* out) override {
    out->device = device_;
    out->native = static_cast<void*>(stream_);
    return true;
  }

  // Every threshold and kernel toggle of this instance (common/tuning.h): the debug registry's
  // narrowing lists are applied when the backend is made; tests set fields here per instance.
  // Checked (validate(), an Error naming the field) by set_tuning(), reserve() and
  // begin_capture().
  CudaTuning tuning;
  void set_tuning(const CudaTuning& t);
  // What this device runs (the loaded code, its features), as the kernel selectors read it.
  const DeviceCaps& caps() const { return caps_; }
  // The workspaces as a selector sees them now (a capture cannot grow them).
  cuda::WorkspaceView workspace_view() const;
  // The kernel each op family's selector picks for an op on this backend (the same function
  // dispatch calls, so a supports query and the launch cannot disagree).
  cuda::LinearKernel select(const cuda::LinearOpDesc& d) const { return cuda::select_linear(d, caps_, tuning); }
  cuda::AttentionKernel select(const cuda::AttentionOpDesc& d) const {
    return cuda::select_attention(d, caps_, tuning);
  }
  cuda::MoeExpertsKernel select(const cuda::MoeExpertsOpDesc& d) const {
    return cuda::select_moe_experts(d, caps_, tuning);
  }
  cuda::MoeRouteKernel select(const cuda::MoeRouteOpDesc& d) const { return cuda::select_moe_route(d, caps_, tuning); }
  // Launch counts of the dense decode GEMV and the fused norm + router (tests check a path ran).
  uint64_t gemv_dense_launches = 0, route_dense_launches = 0;
  // Layers run by the persistent decode_layer kernel / refused (default body), and why the last
  // refusal (tests, logs).
  uint64_t decode_mega_launches() const { return mega_launches_; }
  uint64_t decode_mega_refusals() const { return mega_refusals_; }
  const std::string& decode_mega_last_refusal() const { return mega_why_; }
  // FP8-activation / cuBLASLt / router-GEMM launches recorded while capturing, and ops that
  // fell back to their previous kernel during a capture (tests, logs).
  uint64_t graph_fp8_ops() const { return graph_fp8_ops_; }
  uint64_t graph_fallbacks() const { return graph_fallbacks_; }

 private:
  enum Slot { kAttnPart, kMoeMeta, kMoeAct, kMoeY, kSample, kSampleScratch, kSampleMask, kRouter, kQuantX, kQuantAct, kLt, kRouterX, kNumSlots };
  void* workspace(Slot s, size_t bytes);
  size_t workspace_capacity(Slot s) const { return ws_[s].bytes; }
  struct ExpertTable;
  const ExpertTable& expert_table(const MoeWeights& moe);
  struct NormFuse {
    Tensor* residual;
    const Tensor* addend;
    const Tensor* weight;
    float eps;
  };
  void moe_route_impl(const Tensor& x, const MoeWeights& moe, MoeRouting& out, const NormFuse* nf,
                      const cuda::MoeRouteKernel* sel);
  cuda::MoeRouteOpDesc route_desc(const Tensor& x, const MoeWeights& moe) const;
  cuda::LinearOpDesc multi_desc(cuda::LinearOp op, const Tensor& x, const LinearWeight* const* ws, Tensor* const* outs,
                                int n) const;
  void dense_gemv(const cuda::LinParams& p);
  // Fills the QK-norm parameters (with the KV write when kv is given); launches nothing.
  cuda::QkNormRopeParams qk_norm_rope_params(const QkNormRopeArgs& a, const Tensor* v, KVCacheLayer* kv,
                                             const AttentionMeta* meta);
  // The QK-norm/RoPE spec the fast kernels implement (full-width norm, plain NeoX RoPE).
  static bool qk_fast_spec(const QkNormRopeArgs& a);
  void qk_norm_rope_impl(const QkNormRopeArgs& a, const Tensor* v, KVCacheLayer* kv, const AttentionMeta* meta);
  cuda::AttnParams attention_params(const AttentionArgs& a);
  bool run_moe_direct(const Tensor& x, const MoeWeights& moe, const MoeRouting& routing, Tensor& out);
  // Prefill paths (cuda_prefill.cpp); each returns false when it does not apply.
  bool linear_fp8_act(const cuda::LinParams& p, const cuda::LinearKernel& k);
  // An FP8 activation made by the op before (the attention epilogue, the fused post-attention
  // norm) in kQuantX for x (still written as bf16 too): codes [T, K], scales token-fastest
  // (s_tok; null if not made) and row-major (s_row). Taken by the next linear() / moe_experts()
  // on the same x; any linear, experts or q/k/v call drops it, as do add() and add_rms_norm().
  struct Prequant {
    const void* x = nullptr;
    int T = 0, K = 0;
    uint8_t* q = nullptr;
    float* s_tok = nullptr;
    float* s_row = nullptr;
  };
  Prequant prequant_;
  uint64_t prequant_uses_ = 0;
  Prequant take_prequant(const void* x, int T, int K) {
    const Prequant p = prequant_;
    prequant_ = {};
    return p.x && p.x == x && p.T == T && p.K == K ? p : Prequant{};
  }
  // linear() from prequant_; false (nothing launched) when no FP8 GEMM takes this weight.
  bool linear_prequant(const cuda::LinParams& p, const Prequant& pq, const cuda::LinearKernel& k);
  // add_rms_norm_route() at prefill: the add + norm also quantising for the experts.
  void norm_quant_for_experts(Tensor& residual, const Tensor& x, const Tensor& weight, float eps, Tensor& out);
  void moe_experts_fp8_act(cuda::LinParams up, cuda::LinParams down, int T, const Prequant& pq,
                           const cuda::MoeExpertsKernel& k);
  // Router logits as a GEMM (p: x, T, H, E set); sets p.logits (and p.logits_split) on success.
  bool route_logits_gemm(const Tensor& gate, cuda::RouteParams& p, const cuda::MoeRouteKernel& k);
  // The split-bf16 router's gate halves [2E, H] per f32 gate tensor, made on its first use
  // outside a capture and kept while the gate's owner lives (a gate is a weight: it never
  // changes); null (split per call) for borrowed gates or inside a capture on a miss.
  struct GateSplit {
    std::weak_ptr<void> owner;
    Tensor split;
  };
  std::unordered_map<const void*, GateSplit> gate_splits_;
  const void* gate_split(const Tensor& gate, int E, int H);
  // q/k/v-style linears sharing x at prefill: x (optionally with its fused add + RMSNorm)
  // quantised to FP8 once, then one cuBLASLt block-scaled GEMM per weight.
  void linear_multi_fp8_act(const Tensor& x, const NormFuse* nf, const LinearWeight* const* ws, Tensor* const* outs,
                            int n, const cuda::LinearKernel& k);
  cuda::LtGemm* lt();
  void quant_fp8(const cuda::QuantParams& q, bool vec_on);
  // The device table of expert pointers (built outside capture); null if the experts are not
  // FP8 128x128 blocks. *I = intermediate size.
  const cuda::ExpertPtrs* expert_ptrs_fp8(const MoeWeights& moe, int* I);
  bool decode_layer_mega(const DecodeLayerArgs& a);
  // Fills *p for the kernel (workspace included); false (why in mega_why_) if it does not apply.
  bool mega_params(const DecodeLayerArgs& a, cuda::DecodeLayerParams* p);
  // decode_layer kernel workspaces (zeroed accumulators + barrier words) by shape.
  std::unordered_map<std::string, void*> mega_ws_;
  int mega_grid_ = -1;
  uint64_t mega_launches_ = 0, mega_refusals_ = 0;
  void* mega_timing_ = nullptr;  // MOESERVE_MEGA_TIMING=1 (diagnostic build): phase times, printed at destruction
  void print_mega_timing();
  std::string mega_why_;

  int device_ = 0;
  int num_sms_ = 0;
  cudaStream_t stream_ = nullptr;
  bool capturing_ = false;
  uint64_t ws_generation_ = 0;
  std::unique_ptr<GraphCapture> capture_cap_;   // made in the constructor (cuda_backend.cpp)
  std::unique_ptr<DeviceSampler> sampler_cap_;
  uint64_t graph_fp8_ops_ = 0, graph_fallbacks_ = 0;
  DeviceCaps caps_;
  void check_tuning() const;
  struct Buf {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  std::array<Buf, kNumSlots> ws_{};
  // Zeroed ints for the kernels' last-block counters (each kernel resets what it used):
  // [0] router, [1] norm + linear_multi, [kMoeCounterBase, +kMoeCounterSlots) the fused MoE combine, then attention.
  static constexpr int kMoeCounterBase = 64, kMoeCounterSlots = 1 << 15;
  static constexpr int kAttnCounterBase = kMoeCounterBase + kMoeCounterSlots, kAttnCounterSlots = 1 << 15;
  int* counters_ = nullptr;
  void* pinned_ = nullptr;  // host staging for sampling parameters
  size_t pinned_bytes_ = 0;
  // Recorded after the parameters' upload: the next sample() waits for that copy only (it
  // rewrites the staging buffer), not for the forward queued before it, so the upload and the
  // sampling kernel are queued behind the step and the GPU never idles between them.
  cudaEvent_t pinned_copied_ = nullptr;
  std::unordered_map<const void*, std::shared_ptr<ExpertTable>> expert_tables_;
  std::unique_ptr<cuda::LtGemm> lt_;
};

std::unique_ptr<CudaBackend> make_cuda_backend(int device = 0);
// Every pointer 16-byte aligned (the fused norms load rows as 16-byte vectors).
inline bool aligned16(std::initializer_list<const void*> ps) {
  for (const void* p : ps)
    if (reinterpret_cast<uintptr_t>(p) % 16) return false;
  return true;
}
// Number of CUDA devices (0 when the driver or a device is missing; never throws).
int cuda_device_count();
// Name and total memory of device `index` (cudaGetDeviceProperties; no context is created).
struct CudaDeviceInfo {
  std::string name;
  size_t total_bytes = 0;
};
CudaDeviceInfo cuda_device_info(int index);

}  // namespace moeserve
