// Shared config.json reading for every architecture (model/arch/*): the file with
// --hf-overrides merged in, typed field readers whose errors name the field, and the FP8
// quantization block. An architecture's typed config is parsed with these in its own file.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/op_specs.h"

namespace moeserve {

// One compressed-tensors config_groups entry: INT4 symmetric group-wise weights (W4A16) for the
// modules its `targets` match (class names such as "Linear", exact module names, "re:" regexes).
struct Int4Group {
  std::vector<std::string> targets;
  int group_size = 0;  // inputs per bf16 scale
};

struct QuantizationConfig {
  std::string quant_method;       // "fp8", "compressed-tensors" or "" (none)
  std::string fmt;                // fp8: "float8_e4m3fn"; compressed-tensors: "pack-quantized"
  std::string activation_scheme;  // "dynamic"
  int block_out = 0, block_in = 0;  // fp8 weight_block_size [out, in]
  std::vector<std::string> modules_to_not_convert;
  // compressed-tensors pack-quantized (model/int4.h): the groups and the `ignore` list (module
  // names or "re:" regexes), and the block as read (written back by to_json).
  std::vector<Int4Group> int4_groups;
  std::vector<std::string> ignore;
  nlohmann::json raw;
  bool enabled() const { return !quant_method.empty(); }
  bool fp8() const { return quant_method == "fp8"; }
  bool int4() const { return quant_method == "compressed-tensors"; }
};

namespace config_json {
using json = nlohmann::json;
// Typed field readers: absent or null -> fallback (or an error naming the field when there is
// none), wrong type -> an error naming the field and what it holds.
int get_int(const json& j, const char* key, std::optional<int> fallback = std::nullopt);
double get_double(const json& j, const char* key, std::optional<double> fallback = std::nullopt);
bool get_bool(const json& j, const char* key, bool fallback);
std::string get_string(const json& j, const char* key, const std::string& fallback);
// bos/eos ids: an integer, or a list whose first entry is the primary one.
std::optional<int> get_token_id(const json& j, const char* key);
// A list of integers (or absent: empty).
std::vector<int> get_int_list(const json& j, const char* key);
QuantizationConfig parse_quantization(const json& q);
json quantization_to_json(const QuantizationConfig& q);
// config.json at `path` with `overrides_json` (--hf-overrides: a JSON object, RFC 7386 merge
// patch as vLLM applies it) merged in. Fewer layers by override trims per-layer lists the
// override does not replace (attn_type_list, layer_types, mlp_layer_types, mlp_only_layers
// entries past the new count).
json read_file(const std::string& path, const std::string& overrides_json = "");
// RoPE as HF transformers reads it: theta from rope_parameters (v5) / rope_scaling (v4) or the
// top-level rope_theta (else default_theta); rotary width head_dim * partial_rotary_factor;
// rope_type default, linear (factor) or yarn (factor, original_max_position_embeddings
// (default max_position_embeddings), beta_fast, beta_slow, attention_factor or mscale /
// mscale_all_dim, truncate). Other types fail naming the field.
RopeSpec parse_rope(const json& j, int head_dim, double default_theta, int max_position_embeddings);
// Fails "<field> = <v> is implausibly large" past `max` (corrupt configs fail at load).
void bound(const char* field, int64_t v, int64_t max);
}  // namespace config_json

}  // namespace moeserve
