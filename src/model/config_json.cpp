#include "model/config_json.h"

#include <cmath>
#include <fstream>

#include "core/bounded_json.h"
#include "core/error.h"
#include "model/int4.h"

namespace moeserve::config_json {

namespace {
const char* type_name(const json& v) { return v.type_name(); }
}  // namespace

// Typed field readers: absent -> fallback (or error when required), wrong type -> error.
int get_int(const json& j, const char* key, std::optional<int> fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    fail("config.json: required field '{}' is missing", key);
  }
  const json& v = j[key];
  // Integers (or integral floats such as 128.0) that fit in an int; anything else is an error.
  const bool integral = v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  MS_CHECK(integral, "config.json: field '{}' must be an integer, got {} ({})", key, type_name(v), v.dump());
  const double d = v.get<double>();
  MS_CHECK(d >= -2147483648.0 && d <= 2147483647.0, "config.json: field '{}' = {} is out of range", key, v.dump());
  return v.is_number_integer() ? v.get<int>() : int(d);
}

double get_double(const json& j, const char* key, std::optional<double> fallback) {
  if (!j.contains(key) || j[key].is_null()) {
    if (fallback) return *fallback;
    fail("config.json: required field '{}' is missing", key);
  }
  const json& v = j[key];
  MS_CHECK(v.is_number(), "config.json: field '{}' must be a number, got {} ({})", key, type_name(v), v.dump());
  return v.get<double>();
}

bool get_bool(const json& j, const char* key, bool fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  MS_CHECK(j[key].is_boolean(), "config.json: field '{}' must be a boolean, got {}", key, j[key].dump());
  return j[key].get<bool>();
}

std::string get_string(const json& j, const char* key, const std::string& fallback) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  MS_CHECK(j[key].is_string(), "config.json: field '{}' must be a string, got {}", key, j[key].dump());
  return j[key].get<std::string>();
}

std::optional<int> get_token_id(const json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& v = j[key];
  // eos_token_id may be a list; the first entry is the primary stop token.
  if (v.is_array()) {
    if (v.empty()) return std::nullopt;
    MS_CHECK(v[0].is_number_integer(), "config.json: field '{}' must hold integers", key);
    return v[0].get<int>();
  }
  MS_CHECK(v.is_number_integer(), "config.json: field '{}' must be an integer, got {}", key, v.dump());
  return v.get<int>();
}

QuantizationConfig parse_quantization(const json& q) {
  MS_CHECK(q.is_object(), "config.json: 'quantization_config' must be an object");
  QuantizationConfig c;
  c.quant_method = get_string(q, "quant_method", "");
  if (c.quant_method == "compressed-tensors") return parse_compressed_tensors(q);
  MS_CHECK(c.quant_method == "fp8",
           "config.json: quantization_config.quant_method '{}' is not supported (fp8, or compressed-tensors "
           "pack-quantized INT4)",
           c.quant_method);
  c.fmt = get_string(q, "fmt", "float8_e4m3fn");
  MS_CHECK(c.fmt == "float8_e4m3fn" || c.fmt == "e4m3",
           "config.json: quantization_config.fmt '{}' is not supported (only float8_e4m3fn)", c.fmt);
  c.activation_scheme = get_string(q, "activation_scheme", "dynamic");
  MS_CHECK(c.activation_scheme == "dynamic",
           "config.json: quantization_config.activation_scheme '{}' is not supported (only dynamic)",
           c.activation_scheme);
  MS_CHECK(q.contains("weight_block_size"), "config.json: quantization_config.weight_block_size is missing");
  const json& b = q["weight_block_size"];
  MS_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer(),
           "config.json: quantization_config.weight_block_size must be [out, in] integers, got {}", b.dump());
  const int64_t bo = b[0].get<int64_t>(), bi = b[1].get<int64_t>();
  MS_CHECK(bo > 0 && bi > 0 && bo <= (1 << 20) && bi <= (1 << 20),
           "config.json: quantization_config.weight_block_size {} must be positive (and at most 2^20)", b.dump());
  c.block_out = int(bo);
  c.block_in = int(bi);
  MS_CHECK(c.block_out > 0 && c.block_in > 0, "config.json: quantization_config.weight_block_size {} must be positive",
           b.dump());
  if (q.contains("modules_to_not_convert") && !q["modules_to_not_convert"].is_null()) {
    const json& m = q["modules_to_not_convert"];
    MS_CHECK(m.is_array(), "config.json: quantization_config.modules_to_not_convert must be a list");
    for (const auto& x : m) {
      MS_CHECK(x.is_string(), "config.json: quantization_config.modules_to_not_convert must hold strings");
      c.modules_to_not_convert.push_back(x.get<std::string>());
    }
  }
  return c;
}

std::vector<int> get_int_list(const json& j, const char* key) {
  std::vector<int> out;
  if (!j.contains(key) || j[key].is_null()) return out;
  MS_CHECK(j[key].is_array(), "config.json: field '{}' must be a list, got {}", key, j[key].dump());
  for (const auto& x : j[key]) {
    MS_CHECK(x.is_number_integer(), "config.json: field '{}' must hold integers, got {}", key, x.dump());
    out.push_back(x.get<int>());
  }
  return out;
}

json quantization_to_json(const QuantizationConfig& quantization) {
  if (quantization.int4()) return quantization.raw;
  json q = json::object();
  q["activation_scheme"] = quantization.activation_scheme.empty() ? "dynamic" : quantization.activation_scheme;
  q["fmt"] = quantization.fmt.empty() ? "float8_e4m3fn" : quantization.fmt;
  q["quant_method"] = quantization.quant_method;
  q["weight_block_size"] = {quantization.block_out, quantization.block_in};
  q["modules_to_not_convert"] = quantization.modules_to_not_convert;
  return q;
}

RopeSpec parse_rope(const json& j, int head_dim, double default_theta, int max_position_embeddings) {
  // As HF v5: a non-empty rope_scaling replaces rope_parameters; values inside the dict win
  // over top-level rope_theta / partial_rotary_factor.
  const json* rp = nullptr;
  const char* where = "rope_parameters";
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    if (!j.contains(key) || j[key].is_null()) continue;
    MS_CHECK(j[key].is_object(), "config.json: '{}' must be an object, got {}", key, j[key].dump());
    if (j[key].empty()) continue;
    rp = &j[key];
    where = key;
  }
  RopeSpec r;
  r.head_dim = head_dim;
  double theta = default_theta;
  if (rp && rp->contains("rope_theta") && !(*rp)["rope_theta"].is_null())
    theta = get_double(*rp, "rope_theta");
  else if (j.contains("rope_theta") && !j["rope_theta"].is_null())
    theta = get_double(j, "rope_theta");
  MS_CHECK(theta > 0, "config.json: rope_theta must be positive");
  r.theta = float(theta);
  double factor = 1.0;
  if (rp && rp->contains("partial_rotary_factor") && !(*rp)["partial_rotary_factor"].is_null())
    factor = get_double(*rp, "partial_rotary_factor");
  else if (j.contains("partial_rotary_factor") && !j["partial_rotary_factor"].is_null())
    factor = get_double(j, "partial_rotary_factor");
  MS_CHECK(factor > 0 && factor <= 1, "config.json: partial_rotary_factor {} must be in (0, 1]", factor);
  r.rotary_dim = int(double(head_dim) * factor);  // HF: int(head_dim * partial_rotary_factor)
  MS_CHECK(r.rotary_dim > 0 && r.rotary_dim % 2 == 0, "config.json: rotary width {} (head_dim {} x {}) must be even",
           r.rotary_dim, head_dim, factor);
  if (!rp) return r;
  const std::string type = get_string(*rp, "rope_type", get_string(*rp, "type", "default"));
  if (type == "default") return r;
  if (type == "linear" || type == "yarn") {
    MS_CHECK(rp->contains("factor"), "config.json: {}.factor is required for rope_type {}", where, type);
    r.factor = float(get_double(*rp, "factor"));
    MS_CHECK(r.factor >= 1.f, "config.json: {}.factor {} must be >= 1", where, r.factor);
  }
  if (type == "linear") {
    r.scaling = RopeScaling::Linear;
    return r;
  }
  if (type == "yarn") {
    r.scaling = RopeScaling::Yarn;
    r.original_max_position = get_int(*rp, "original_max_position_embeddings", max_position_embeddings);
    MS_CHECK(r.original_max_position > 0, "config.json: {}.original_max_position_embeddings must be positive", where);
    r.beta_fast = float(get_double(*rp, "beta_fast", 32.0));
    r.beta_slow = float(get_double(*rp, "beta_slow", 1.0));
    r.truncate = get_bool(*rp, "truncate", true);
    if (rp->contains("attention_factor") && !(*rp)["attention_factor"].is_null())
      r.attention_factor = float(get_double(*rp, "attention_factor"));
    else
      r.attention_factor =
          yarn_attention_factor(r.factor, get_double(*rp, "mscale", 0.0), get_double(*rp, "mscale_all_dim", 0.0));
    return r;
  }
  fail("config.json: {}.rope_type '{}' is not supported (default, linear, yarn)", where, type);
}

void bound(const char* field, int64_t v, int64_t max) {
  MS_CHECK(v <= max, "config.json: {} = {} is implausibly large (limit {})", field, v, max);
}

json read_file(const std::string& path, const std::string& overrides_json) {
  std::ifstream in(path);
  MS_CHECK(in.good(), "cannot open model config {}", path);
  json j;
  try {
    j = parse_json_bounded<json>(std::string(std::istreambuf_iterator<char>(in), {}), path);
  } catch (const json::exception& e) {
    fail("{}: invalid JSON: {}", path, e.what());
  }
  if (!overrides_json.empty()) {
    json patch;
    try {
      patch = parse_json_bounded<json>(overrides_json, "--hf-overrides");
    } catch (const json::exception& e) {
      fail("--hf-overrides: invalid JSON: {}", e.what());
    }
    MS_CHECK(patch.is_object(), "--hf-overrides: expected a JSON object");
    j.merge_patch(patch);
    // Fewer layers (the usual benchmarking override): per-layer lists the override does not
    // replace keep their first num_hidden_layers entries, as the model reads only those.
    if (patch.contains("num_hidden_layers") && patch["num_hidden_layers"].is_number_integer()) {
      const int64_t n = patch["num_hidden_layers"].get<int64_t>();
      for (const char* key : {"attn_type_list", "layer_types", "mlp_layer_types"})
        if (!patch.contains(key) && j.contains(key) && j[key].is_array() && int64_t(j[key].size()) > n && n > 0)
          j[key].erase(j[key].begin() + n, j[key].end());
      // mlp_only_layers lists layer ids: drop those past the new count.
      if (!patch.contains("mlp_only_layers") && j.contains("mlp_only_layers") && j["mlp_only_layers"].is_array()) {
        json kept = json::array();
        for (const auto& x : j["mlp_only_layers"])
          if (!x.is_number_integer() || x.get<int64_t>() < n) kept.push_back(x);
        j["mlp_only_layers"] = kept;
      }
    }
  }
  return j;
}

}  // namespace moeserve::config_json
