// `moeserve plan`: which parallel layouts of a MoE checkpoint fit N GPUs of a given size, from
// config.json and model.safetensors.index.json only (no weights are read).
//
// Where every number comes from:
//   shapes      config.json (hidden, layers, heads, kv heads, head_dim, experts, intermediate
//               sizes, vocab, tied embeddings, MTP modules)
//   dtypes      config.json: block-FP8 (1 byte per element + one fp32 scale per
//               weight_block_size block) for the linear layers when quantization_config says
//               fp8 and the module is not in modules_to_not_convert; torch_dtype for the rest;
//               the MiniMax router gate and its bias are fp32 (as the checkpoint stores them
//               and vLLM keeps them)
//   cross-check the index's metadata.total_size against the byte total computed from the
//               shapes (a warning when they differ by more than 1%); weight_map names give
//               which MTP modules are present (they are never loaded, as `inspect`/`serve`)
//
// Memory model per GPU (like vLLM's --gpu-memory-utilization):
//   usable  = gpu_memory * utilization
//   weights = this rank's slice of every tensor (see ShardRole in plan.cpp)
//   reserve = fixed overhead (CUDA context, GEMM/NCCL workspaces; default 1 GiB)
//           + activations: max_num_batched_tokens * 2 B * (4*hidden + q_local + 2*kv_local
//                          + top_k * 3 * moe_inter_local + 3 * shared_inter_local)
//           + logits:      max_num_seqs * vocab * 4 B
//   kv      = usable - weights - reserve, in blocks of block_size tokens of
//             kv_layers * 2 * kv_heads_local * head_dim * kv_dtype_bytes each; MLA:
//             kv_layers * (kv_lora_rank + qk_rope_head_dim) * kv_dtype_bytes (one latent vector per
//             token per layer, not per head, replicated on every TP rank as vLLM does)
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/parse.h"

namespace moeserve::plan {

// The model dimensions the plan needs, read from a config.json of any of the MoE families
// below (MiniMax-M2, Mixtral, Qwen2/3-MoE, DeepSeek-style without MLA) or a dense model.
struct ModelShape {
  std::string model_type;
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0;
  int64_t kv_layers = 0;        // layers with a paged KV cache (attn_type_list == 1, else all)
  int64_t experts = 0, top_k = 0;
  int64_t moe_inter = 0;        // per routed expert
  int64_t shared_inter = 0;     // shared expert(s) of a MoE layer, 0 = none
  int64_t dense_inter = 0;      // MLP of dense layers
  int64_t dense_layers = 0;     // layers with a dense MLP instead of experts
  bool tied_embeddings = false;
  bool router_bias = false;
  bool router_fp32 = false;     // MiniMax: gate weight and bias are fp32
  bool qk_norm = false, qk_norm_full_width = false;
  std::string dtype = "bfloat16";
  int dtype_bytes = 2;
  bool fp8 = false;
  int64_t block_out = 0, block_in = 0;
  std::vector<std::string> not_converted;  // modules_to_not_convert
  int64_t mtp_declared = 0;
  int64_t max_position = 0;
  // MLA (DeepSeek-V3 / Kimi-K2: kv_lora_rank in config.json). q_lora 0: a plain q_proj.
  bool mla = false;
  int64_t q_lora = 0, kv_lora = 0, qk_nope = 0, qk_rope = 0, v_head = 0;
  // compressed-tensors pack-quantized INT4 (W4A16): weight_packed int32 [out, in/8] + bf16
  // weight_scale [out, in/group] + int32 weight_shape [2] per linear not in `ignore`.
  bool int4 = false;
  int64_t int4_group = 0;
  std::vector<std::string> int4_ignore;  // plain module names or "re:" regexes (re.match)
  bool vision_tower = false;  // a vision_config next to text_config: not loaded, not counted

  static ModelShape from_config(const nlohmann::json& config);  // throws naming the field
};

// What model.safetensors.index.json (or a single model.safetensors header) says.
struct IndexInfo {
  std::optional<int64_t> total_size;  // metadata.total_size
  int64_t tensors = 0;                // weight_map entries
  int64_t fp8_scales = 0;             // entries ending in weight_scale_inv
  int64_t mtp_present = 0;            // MTP modules with at least one tensor
  std::string source;                 // "model.safetensors.index.json", ...
};
IndexInfo read_index(const nlohmann::json& index, const ModelShape& shape);

struct PlanOptions {
  int gpus = 1;
  int64_t gpu_memory = 0;  // bytes per GPU
  double utilization = 0.9;
  int64_t max_model_len = 0;  // 0: max_position_embeddings
  std::string kv_cache_dtype = "auto";  // auto (model dtype) | fp8 | fp8_e4m3 (serve's values)
  int64_t block_size = 16;
  int64_t max_num_batched_tokens = 8192;  // vLLM's default on H100/H200-class GPUs
  int64_t max_num_seqs = 256;
  int64_t overhead = int64_t(1) << 30;  // fixed per-GPU reserve
  bool vocab_parallel = true;  // embedding and lm_head split by vocab over the attention TP group (vLLM)
};

// One candidate: attention TP within each of `dp` replicas, experts either sliced over the
// TP group (ep == 1) or owned whole by one of `ep` == gpus ranks.
struct Layout {
  std::string name;  // "TP4", "TP8+EP8", "DP2xTP4+EP8"
  int tp = 1, dp = 1, ep = 1;
};
std::vector<Layout> candidate_layouts(int gpus);

// The whole report (described in src/tools/README.md, "tools: plan and service"). `index` may be null.
nlohmann::json make_plan(const nlohmann::json& config, const nlohmann::json* index, const PlanOptions& opt);
std::string format_plan(const nlohmann::json& plan);
// The recommended `moeserve serve MODEL ...` command line for a plan (empty when none is
// recommended): the layout's flags plus --max-model-len, --gpu-memory-utilization and a
// non-default --kv-cache-dtype, every flag spelled through serve's flag table.
std::string recommended_command(const nlohmann::json& plan, const std::string& model);

// "96GB" = 96e9, "80GiB" = 80 * 2^30, "1.5TB", "512MiB", plain numbers = bytes.
int64_t parse_size(const std::string& s);
using ::moeserve::parse_human_int;  // core/parse.h: --max-model-len values (32k, 32K)

// Fetches `file` of a hub model repo (plan_fetch.cpp, libcurl): GET
// {HF_ENDPOINT}/{repo}/resolve/{revision}/{file} with `authorization: Bearer $HF_TOKEN`.
// Returns nullopt on 404 (file not in the repo); throws on any other failure.
struct FetchOptions {
  std::string endpoint;  // empty: $HF_ENDPOINT, else https://huggingface.co
  std::string token;     // empty: $HF_TOKEN, else $HUGGING_FACE_HUB_TOKEN
  std::string revision = "main";
  long timeout_s = 30;
};
std::optional<std::string> fetch_repo_file(const std::string& repo, const std::string& file, const FetchOptions& opt);
bool looks_like_repo_id(const std::string& s);  // "org/name", not an existing path

}  // namespace moeserve::plan
