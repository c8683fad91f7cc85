// The architecture-neutral model interface. An architecture file (model/arch/<arch>.cpp)
// provides a typed config (an ArchConfig) and a Model; the runtime (src/runtime/), inspect and
// plan use only what is declared here, and get both from the registry (model/registry.h).
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/capabilities.h"
#include "io/safetensors.h"
#include "model/config_json.h"
#include "model/weights.h"

namespace moeserve {

struct ParallelConfig {
  int rank = 0;
  int world = 1;
  bool expert_parallel = false;  // experts owned whole by one rank (EP) vs sliced (expert TP)
};

// In-place sum of a device tensor over all ranks (a Communicator's all-reduce).
using AllReduceFn = std::function<void(Tensor&)>;

// The numbers of a parsed config that code outside the architecture file reads (inspect,
// plan, the runtime's bounds). Sizes are global (not per rank).
struct ModelDesc {
  std::string architecture;  // architectures[0] as the registry knows it
  std::string model_type;
  int hidden_size = 0;
  int num_layers = 0;
  int num_attention_heads = 0;
  int num_key_value_heads = 0;
  int head_dim = 0;    // q/K
  int v_head_dim = 0;  // V
  int rotary_dim = 0;
  int num_experts = 0;
  int experts_per_token = 0;
  int expert_intermediate_size = 0;
  int num_dense_layers = 0;  // layers with a dense MLP instead of experts
  int dense_intermediate_size = 0;
  int vocab_size = 0;
  int max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::optional<int> bos_token_id, eos_token_id;
  QuantizationConfig quantization;
  int num_shared_experts = 0;               // always-on experts of each MoE layer (DeepSeek-V3)
  int shared_expert_intermediate_size = 0;  // their fused width (moe_intermediate_size * n_shared)
  // Multi-head latent attention (DeepSeek-V3 family; 0 otherwise): head_dim above is
  // qk_nope + qk_rope, v_head_dim the value width, rotary_dim qk_rope; the KV cache holds
  // kv_lora_rank + rotary_dim values per token per layer (not per head).
  int kv_lora_rank = 0;
  int q_lora_rank = 0;  // 0: no q low-rank projection (q_proj)
  int num_mtp_modules = 0;  // declared in config.json (not loaded)
  bool use_mtp = false;
};

// A typed config as an architecture file parsed it.
class ArchConfig {
 public:
  virtual ~ArchConfig() = default;
  virtual ModelDesc desc() const = 0;
  // Every tensor of the main model with its global shape, accepted dtypes and shard spec.
  virtual std::vector<WeightDecl> weights(const ParallelConfig& par) const = 0;
  // "" when the sizes split over `par`, else a user-facing message naming the size.
  virtual std::string shard_problem(const ParallelConfig& par) const = 0;
  // "" unless an FP8 checkpoint's split cuts weight blocks (exact, but the fast kernels want
  // whole blocks), else a message naming the tensor and what to use instead.
  virtual std::string fp8_split_problem(const ParallelConfig& par) const = 0;
  // Checkpoint tensors the model knowingly skips (MTP modules): not reported as unexpected.
  virtual bool is_skipped_tensor(const std::string& /*name*/) const { return false; }
  virtual nlohmann::json to_json() const = 0;  // hub-style config.json
  // One rank's KV cache per layer under `par` (what the built Model's kv_layout() returns), for
  // the tools that size the cache from the config alone (inspect, plan): KV bytes per token =
  // kv_layout(par).bytes_per_block(1, element bytes). Default: GQA, KV heads split over the
  // ranks (one per rank, replicated, past the KV head count); MLA overrides it (one latent).
  virtual KvLayout kv_layout(const ParallelConfig& par) const {
    const ModelDesc d = desc();
    const int w = par.world > 0 ? par.world : 1;
    const int kvh = d.num_key_value_heads >= w ? d.num_key_value_heads / w : 1;
    return KvLayout{d.num_layers, kvh, d.head_dim, d.v_head_dim > 0 ? d.v_head_dim : d.head_dim};
  }
};

// This rank's tensor for a declaration, made elsewhere than a checkpoint (random dummy weights):
// the local slice (shape local_shape(decl), a dtype of decl.dtypes; FP8 with its scales and
// block sizes). An undefined tensor only for lm_head.weight: a rank that produces no logits.
using WeightSource = std::function<LoadedTensor(const WeightDecl& decl)>;

// Speculative decoding: hidden states the target's forward keeps for a draft head
// (runtime/spec_runner.h). `residual_taps`: boundary indices b (0 <= b <= num_layers): the
// un-normalised residual stream ENTERING layer b (b = 0: the embeddings; b = num_layers: the
// last layer's output before the final norm), HF's hidden_states[b]. `final_hidden`: the
// last layer's output after the final norm (DeepSeek-V3 MTP's h^0).
struct HiddenCapture {
  std::vector<int> residual_taps;
  bool final_hidden = false;
  bool empty() const { return residual_taps.empty() && !final_hidden; }
};

// One MTP module step (DeepSeek-V3 / GLM layout; model/layers/decoder.h):
//   x   = eh_proj(cat([enorm(E(ids)), hnorm(h_prev)], -1))
//   h   = DecoderLayer_{L + module}(x)          (attention over `kv` at meta's slots)
//   logits[rows] = lm_head(shared_head.norm(h)[rows])
struct MtpStepArgs {
  int module = 0;                     // 0-based module index
  const Tensor* ids = nullptr;        // [T] I32 (device)
  const Tensor* h_prev = nullptr;     // [T, H] activation dtype (device)
  const AttentionMeta* meta = nullptr;
  std::vector<KVCacheLayer>* kv = nullptr;  // the MTP cache: one layer per module
  Tensor* h_out = nullptr;            // [T, H]: this module's output before shared_head.norm
  const Tensor* rows = nullptr;       // [R] I32: rows to produce logits for (may be empty)
};

// One rank's model: weights, step workspace, KV layout and the forward pass.
class Model {
 public:
  virtual ~Model() = default;
  virtual const ArchConfig& config() const = 0;
  ModelDesc desc() const { return config().desc(); }
  // Checks every declared tensor, loads this rank's slices and uploads them.
  virtual void load(const Checkpoint& ckpt) = 0;
  // The same from `source` for every declared tensor (this rank's declarations): checks the
  // shapes and dtypes and uploads as load does (serve --load-format dummy, bench-model).
  virtual void load_from(const WeightSource& source) = 0;
  // This rank's KV cache per layer (allocate_kv_cache below allocates it).
  virtual KvLayout kv_layout() const = 0;
  // Upper bounds for the backend's own workspaces (Backend::reserve_workspaces).
  virtual BackendWorkspaceDims backend_workspace_dims(int max_tokens) const = 0;
  // Allocates the step buffers for up to max_tokens tokens and max_rows logits rows (grows
  // only; forward grows them on demand too, bumping workspace_epoch()).
  virtual void reserve_workspace(int64_t max_tokens, int64_t max_rows) = 0;
  // Changes whenever a step buffer was reallocated (graphs captured before are stale).
  virtual int64_t workspace_epoch() const = 0;
  virtual int64_t workspace_bytes() const = 0;
  // Profiling: when set, forward calls it after each op with the op's name. Not for captured
  // steps.
  virtual void set_op_hook(std::function<void(const char*)> hook) = 0;
  // ids [T] I32 (device), meta for the batch, the KV cache (written at meta.slot_mapping),
  // rows [R] I32: which token rows to produce logits for. Returns logits [R, V], a view of the
  // workspace (valid until the next forward). Allocates nothing when the workspace fits.
  virtual Tensor forward(const Tensor& ids, const AttentionMeta& meta, std::vector<KVCacheLayer>& kv,
                         const Tensor& rows) = 0;

  // ---- speculative decoding (optional; the default refuses) ----
  // What the next forwards capture (an empty capture turns it off). Throws naming what the
  // architecture cannot capture.
  virtual void set_capture(const HiddenCapture& c) {
    if (!c.empty()) fail("{}: this architecture cannot capture hidden states for a draft head", desc().architecture);
  }
  // The last forward's captures, [T, H] each (device; valid until the next forward): the
  // residual taps in the order asked, then the final hidden state if asked.
  virtual const std::vector<Tensor>& captured() const {
    static const std::vector<Tensor> none;
    return none;
  }
  // The token embedding [V, H] (device): shared with draft heads that ship none.
  virtual const Tensor& embedding_table() const { fail("{}: no embedding table to share", desc().architecture); }
  // Loads `num_modules` MTP modules from the checkpoint; throws naming the missing or
  // misshaped tensors (a config that declares modules its checkpoint does not ship).
  virtual void load_mtp(const Checkpoint& ckpt, int num_modules) {
    (void)ckpt, (void)num_modules;
    fail("{}: MTP modules are not implemented for this architecture", desc().architecture);
  }
  // The MTP cache layout (one layer per loaded module, a decoder layer's K/V shape).
  virtual KvLayout mtp_kv_layout() const { return KvLayout{0, 0, 0, 0}; }
  // One module step (MtpStepArgs); returns logits [R, V] (a workspace view) or an empty tensor.
  virtual Tensor mtp_forward(const MtpStepArgs& a) {
    (void)a;
    fail("{}: no MTP modules loaded", desc().architecture);
  }
};

// K/V tensors of every layer of `layout` on `backend`: [num_blocks, block_size, kv_heads, dim].
std::vector<KVCacheLayer> allocate_kv_cache(Backend& backend, const KvLayout& layout, int num_blocks, int block_size,
                                            DType dtype);

}  // namespace moeserve
