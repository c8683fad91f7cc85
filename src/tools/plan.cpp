#include "tools/plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <regex>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "core/kv_cache_dtype.h"
#include "tools/serve_flags.h"

namespace moeserve::plan {
namespace {

using json = nlohmann::json;

int64_t ceil_div(int64_t a, int64_t b) { return b <= 0 ? 0 : (a + b - 1) / b; }

bool has(const json& j, const char* k) { return j.contains(k) && !j[k].is_null(); }

int64_t get_int(const json& j, const char* key, std::optional<int64_t> fallback = std::nullopt) {
  if (!has(j, key)) {
    if (fallback) return *fallback;
    fail("config.json: required field '{}' is missing", key);
  }
  const json& v = j[key];
  const bool integral = v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  MS_CHECK(integral, "config.json: field '{}' must be an integer, got {}", key, v.dump());
  const double d = v.get<double>();
  MS_CHECK(d >= 0 && d < 9e15, "config.json: field '{}' = {} is out of range", key, v.dump());
  return v.is_number_integer() ? v.get<int64_t>() : int64_t(d);
}

std::string get_str(const json& j, const char* key, const std::string& fallback) {
  if (!has(j, key)) return fallback;
  MS_CHECK(j[key].is_string(), "config.json: field '{}' must be a string, got {}", key, j[key].dump());
  return j[key].get<std::string>();
}

bool get_bool(const json& j, const char* key, bool fallback) {
  if (!has(j, key)) return fallback;
  MS_CHECK(j[key].is_boolean(), "config.json: field '{}' must be a boolean, got {}", key, j[key].dump());
  return j[key].get<bool>();
}

int dtype_bytes_of(const std::string& d, const char* what) {
  if (d == "bfloat16" || d == "float16" || d == "half" || d == "bf16" || d == "fp16") return 2;
  if (d == "float32" || d == "float" || d == "fp32") return 4;
  if (d == "fp8" || d == "fp8_e4m3" || d == "fp8_e5m2" || d == "float8_e4m3fn") return 1;
  fail("{}: dtype '{}' is not known (bfloat16, float16, float32, fp8)", what, d);
}

// modules_to_not_convert entries match whole dotted components of a module name, so "gate"
// matches "...block_sparse_moe.gate" but not "...experts.0.gate_proj".
bool module_matches(const std::string& name, const std::string& entry) {
  if (entry.empty()) return false;
  for (size_t pos = name.find(entry); pos != std::string::npos; pos = name.find(entry, pos + 1)) {
    const size_t end = pos + entry.size();
    if ((pos == 0 || name[pos - 1] == '.') && (end == name.size() || name[end] == '.')) return true;
  }
  return false;
}

// compressed-tensors `ignore` entries: "re:PATTERN" is Python re.match (anchored at the start),
// anything else the module name itself.
bool int4_ignored(const ModelShape& m, const std::string& module) {
  for (const auto& e : m.int4_ignore) {
    if (e.rfind("re:", 0) == 0) {
      if (std::regex_search(module, std::regex(e.substr(3)), std::regex_constants::match_continuous)) return true;
    } else if (module == e) {
      return true;
    }
  }
  return false;
}

bool is_quantized(const ModelShape& m, const std::string& module) {
  if (m.int4) return !int4_ignored(m, module);
  if (!m.fp8) return false;
  for (const auto& e : m.not_converted)
    if (module_matches(module, e)) return false;
  return true;
}

// How a tensor is split across the ranks of a layout.
enum class Role {
  Replicated,  // whole on every rank (norms, router)
  Col,         // rows split over attention TP (q_proj, shared/dense w1/w3, q_norm)
  Row,         // columns split over attention TP (o_proj, shared/dense w2)
  KvCol,       // rows = kv heads * head_dim split over attention TP; one head per rank when TP > kv heads
  Vocab,       // rows = vocab split over attention TP (ceil), or replicated without vocab parallelism
  ExpertCol,   // routed expert w1/w3: rows split over TP (expert TP) or whole on the owning EP rank
  ExpertRow,   // routed expert w2: columns split over TP, or whole on the owning EP rank
};

struct Group {
  std::string category;  // attention, norms, router, experts, shared_experts, dense_mlp, embedding, lm_head
  std::string module;    // representative module name (for modules_to_not_convert)
  Role role;
  int64_t rows, cols;  // global shape (cols 1 for 1-D tensors)
  int64_t count;       // tensors of this kind in the model
  bool fp8;
  int elem_bytes;  // when not FP8 / INT4
  bool int4 = false;  // pack-quantized: weight_packed + weight_scale + weight_shape
};

bool is_mixtral_style(const ModelShape& m) {
  return m.model_type.rfind("minimax", 0) == 0 || m.model_type == "mixtral";
}

std::vector<Group> build_groups(const ModelShape& m) {
  const int64_t H = m.hidden, D = m.head_dim, Hq = m.heads * D, Hkv = m.kv_heads * D, L = m.layers;
  const int64_t moe_layers = m.experts > 0 ? L - m.dense_layers : 0;
  const std::string lp = "model.layers.0.";
  const bool mix = is_mixtral_style(m);
  const std::string moe = lp + (mix ? "block_sparse_moe." : "mlp.");
  const std::string up = mix ? "w1" : "gate_proj", up2 = mix ? "w3" : "up_proj", down = mix ? "w2" : "down_proj";
  auto quant = [&](const std::string& module) { return is_quantized(m, module); };
  std::vector<Group> g;
  auto lin = [&](std::string cat, std::string mod, Role r, int64_t rows, int64_t cols, int64_t count) {
    if (count <= 0 || rows <= 0 || cols <= 0) return;
    const bool q = quant(mod);
    g.push_back({std::move(cat), std::move(mod), r, rows, cols, count, q && m.fp8, m.dtype_bytes, q && m.int4});
  };
  auto vec = [&](std::string cat, std::string mod, Role r, int64_t n, int64_t count, int bytes) {
    if (count <= 0 || n <= 0) return;
    g.push_back({std::move(cat), std::move(mod), r, n, 1, count, false, bytes, false});
  };
  g.push_back({"embedding", "model.embed_tokens", Role::Vocab, m.vocab, H, 1, false, m.dtype_bytes, false});
  if (m.mla) {
    // MLA: the down-projections (q_a, kv_a) and their norms are replicated, the per-head
    // up-projections split by heads over TP (vLLM's ReplicatedLinear / ColumnParallelLinear).
    const int64_t qk = m.qk_nope + m.qk_rope;
    const std::string a = lp + "self_attn.";
    if (m.q_lora > 0) {
      lin("attention", a + "q_a_proj", Role::Replicated, m.q_lora, H, L);
      vec("norms", a + "q_a_layernorm", Role::Replicated, m.q_lora, L, m.dtype_bytes);
      lin("attention", a + "q_b_proj", Role::Col, m.heads * qk, m.q_lora, L);
    } else {
      lin("attention", a + "q_proj", Role::Col, m.heads * qk, H, L);
    }
    lin("attention", a + "kv_a_proj_with_mqa", Role::Replicated, m.kv_lora + m.qk_rope, H, L);
    vec("norms", a + "kv_a_layernorm", Role::Replicated, m.kv_lora, L, m.dtype_bytes);
    lin("attention", a + "kv_b_proj", Role::Col, m.heads * (m.qk_nope + m.v_head), m.kv_lora, L);
    lin("attention", a + "o_proj", Role::Row, H, m.heads * m.v_head, L);
  } else {
    lin("attention", lp + "self_attn.q_proj", Role::Col, Hq, H, L);
    lin("attention", lp + "self_attn.k_proj", Role::KvCol, Hkv, H, L);
    lin("attention", lp + "self_attn.v_proj", Role::KvCol, Hkv, H, L);
    lin("attention", lp + "self_attn.o_proj", Role::Row, H, Hq, L);
  }
  vec("norms", lp + "input_layernorm", Role::Replicated, H, 2 * L, m.dtype_bytes);  // + post_attention_layernorm
  if (m.qk_norm) {
    if (m.qk_norm_full_width) {
      vec("norms", lp + "self_attn.q_norm", Role::Col, Hq, L, m.dtype_bytes);
      vec("norms", lp + "self_attn.k_norm", Role::KvCol, Hkv, L, m.dtype_bytes);
    } else {
      vec("norms", lp + "self_attn.q_norm", Role::Replicated, D, 2 * L, m.dtype_bytes);  // q_norm and k_norm [D]
    }
  }
  const int router_bytes = m.router_fp32 ? 4 : m.dtype_bytes;
  g.push_back({"router", moe + "gate", Role::Replicated, m.experts, H, moe_layers, false, router_bytes, false});
  if (m.router_bias) vec("router", moe + "e_score_correction_bias", Role::Replicated, m.experts, moe_layers, 4);
  const int64_t E = m.experts, I = m.moe_inter;
  lin("experts", moe + "experts.0." + up, Role::ExpertCol, I, H, E * moe_layers);
  lin("experts", moe + "experts.0." + up2, Role::ExpertCol, I, H, E * moe_layers);
  lin("experts", moe + "experts.0." + down, Role::ExpertRow, H, I, E * moe_layers);
  const std::string sh = moe + (m.model_type == "qwen2_moe" ? "shared_expert." : "shared_experts.");
  lin("shared_experts", sh + up, Role::Col, m.shared_inter, H, moe_layers);
  lin("shared_experts", sh + up2, Role::Col, m.shared_inter, H, moe_layers);
  lin("shared_experts", sh + down, Role::Row, H, m.shared_inter, moe_layers);
  lin("dense_mlp", lp + "mlp.gate_proj", Role::Col, m.dense_inter, H, m.dense_layers);
  lin("dense_mlp", lp + "mlp.up_proj", Role::Col, m.dense_inter, H, m.dense_layers);
  lin("dense_mlp", lp + "mlp.down_proj", Role::Row, H, m.dense_inter, m.dense_layers);
  vec("norms", "model.norm", Role::Replicated, H, 1, m.dtype_bytes);
  if (!m.tied_embeddings) {
    const bool q = m.int4 && is_quantized(m, "lm_head");  // INT4 unless ignored (Kimi ignores it)
    g.push_back({"lm_head", "lm_head", Role::Vocab, m.vocab, H, 1, false, m.dtype_bytes, q});
  }
  std::erase_if(g, [](const Group& x) { return x.count <= 0 || x.rows <= 0; });
  return g;
}

// Bytes of one [rows, cols] slice: FP8 = 1 B per element + fp32 scale per block (one per
// tensor when the config has no block size), else elem_bytes per element.
int64_t slice_bytes(const ModelShape& m, const Group& g, int64_t rows, int64_t cols) {
  // INT4: int32 words of 8 values along the input dimension, a bf16 scale per group of
  // int4_group inputs, and the int32 [2] weight_shape.
  if (g.int4) return rows * ceil_div(cols, 8) * 4 + rows * ceil_div(cols, m.int4_group) * 2 + 8;
  if (!g.fp8) return rows * cols * g.elem_bytes;
  const int64_t scales = m.block_out > 0 ? ceil_div(rows, m.block_out) * ceil_div(cols, m.block_in) : 1;
  return rows * cols + scales * 4;
}

// This rank's bytes of group g under layout l (rank 0; every rank holds as much in a valid layout).
int64_t rank_bytes(const ModelShape& m, const Group& g, const Layout& l, bool vocab_parallel) {
  const int64_t t = l.tp;
  int64_t rows = g.rows, cols = g.cols, count = g.count;
  switch (g.role) {
    case Role::Replicated: break;
    case Role::Col: rows = ceil_div(rows, t); break;
    case Role::Row: cols = ceil_div(cols, t); break;
    case Role::KvCol: rows = (t <= m.kv_heads ? ceil_div(m.kv_heads, t) : 1) * m.head_dim; break;
    case Role::Vocab: if (vocab_parallel) rows = ceil_div(rows, t); break;
    case Role::ExpertCol:
    case Role::ExpertRow:
      if (l.ep > 1) count = ceil_div(count, l.ep);  // E/ep whole experts per MoE layer
      else if (g.role == Role::ExpertCol) rows = ceil_div(rows, t);
      else cols = ceil_div(cols, t);
      break;
  }
  return count * slice_bytes(m, g, rows, cols);
}

int64_t count_tensors(const std::vector<Group>& groups) {
  int64_t n = 0;
  // FP8 weights carry a scale tensor; INT4 ones weight_packed, weight_scale and weight_shape.
  for (const auto& g : groups) n += g.count * (g.int4 ? 3 : g.fp8 ? 2 : 1);
  // norms: input_layernorm and post_attention_layernorm (or q_norm and k_norm) were one group of count 2L
  return n;
}

// Bytes for people: GB = 1e9 B (as GPU datasheets), MB below 1 GB.
std::string human(int64_t b) {
  return b >= 1000000000 ? fmt::format("{:.2f} GB", double(b) / 1e9) : fmt::format("{:.2f} MB", double(b) / 1e6);
}

void block_check_rows(std::vector<std::string>& why, const char* what, int64_t local, int64_t block) {
  if (block > 0 && local % block)
    why.push_back(fmt::format("block-FP8 {} per rank = {} is not a multiple of the {} weight block", what, local, block));
}

// Problems that make a layout impossible regardless of memory.
void structural_checks(const ModelShape& m, const Layout& l, std::vector<std::string>& why,
                       std::vector<std::string>& notes) {
  const int64_t t = l.tp, D = m.head_dim;
  if (m.heads % t) why.push_back(fmt::format("{} query heads do not split over TP {}", m.heads, t));
  if (m.mla) {
    // MLA: heads split over TP; the latent KV (one vector per token) is replicated.
    if (m.heads % t == 0 && m.fp8 && m.block_out > 0) {
      const std::string a = "model.layers.0.self_attn.";
      const int64_t hl = m.heads / t;
      if (is_quantized(m, a + (m.q_lora > 0 ? "q_b_proj" : "q_proj")))
        block_check_rows(why, "q_b_proj", hl * (m.qk_nope + m.qk_rope), m.block_out);
      if (is_quantized(m, a + "kv_b_proj")) block_check_rows(why, "kv_b_proj", hl * (m.qk_nope + m.v_head), m.block_out);
      if (is_quantized(m, a + "o_proj")) block_check_rows(why, "o_proj columns", hl * m.v_head, m.block_in);
    }
  } else if (t <= m.kv_heads) {
    if (m.kv_heads % t) why.push_back(fmt::format("{} KV heads do not split over TP {}", m.kv_heads, t));
  } else if (t % m.kv_heads) {
    why.push_back(fmt::format("TP {} is more than {} KV heads and not a multiple of them", t, m.kv_heads));
  } else {
    notes.push_back(fmt::format("TP {} > {} KV heads: each KV head is replicated on {} ranks (allowed, as vLLM does); "
                                "the KV cache per token no longer shrinks with TP",
                                t, m.kv_heads, t / m.kv_heads));
  }
  auto block_check = [&](const std::string& what, int64_t global, int64_t local, int64_t block, const char* dim) {
    if (block > 0 && local % block)
      why.push_back(fmt::format("block-FP8 {} {} per rank {}/{} = {} is not a multiple of the {} weight block", what,
                                dim, global, t, local, block));
  };
  if (m.heads % t == 0 && !m.mla) {
    // FP8 attention projections: a rank's slice must cover whole blocks.
    const int64_t q_local = m.heads / t * D, kv_local = (t <= m.kv_heads ? m.kv_heads / t : 1) * D;
    const std::string lp = "model.layers.0.self_attn.";
    if (is_quantized(m, lp + "q_proj")) block_check("q_proj", m.heads * D, q_local, m.block_out, "rows");
    if (is_quantized(m, lp + "k_proj") && m.kv_heads % std::min<int64_t>(t, m.kv_heads) == 0)
      block_check("k_proj/v_proj", m.kv_heads * D, kv_local, m.block_out, "rows");
    if (is_quantized(m, lp + "o_proj")) block_check("o_proj", m.heads * D, q_local, m.block_in, "columns");
  }
  if (m.experts > 0 && l.ep == 1 && t > 1) {
    if (m.moe_inter % t)
      why.push_back(fmt::format("expert intermediate size {} does not split over TP {}", m.moe_inter, t));
    else if (m.int4 && is_quantized(m, "model.layers.0.mlp.experts.0.down_proj") && (m.moe_inter / t) % m.int4_group)
      why.push_back(fmt::format("INT4 expert intermediate size {}/{} = {} is not a multiple of the {}-input scale "
                                "group (down_proj), so TP{} needs EP",
                                m.moe_inter, t, m.moe_inter / t, m.int4_group, t));
    else if (m.fp8) {
      const int64_t loc = m.moe_inter / t;
      const int64_t blk = std::max(m.block_out, m.block_in);
      if (blk > 0 && (loc % m.block_out || loc % m.block_in))
        why.push_back(fmt::format("block-FP8 expert intermediate size {}/{} = {} is not a multiple of the {} weight "
                                  "block, so TP{} needs EP",
                                  m.moe_inter, t, loc, blk, t));
    }
  }
  if (l.ep > 1 && m.experts % l.ep)
    why.push_back(fmt::format("{} experts do not split over EP {}", m.experts, l.ep));
  for (auto [what, inter] : {std::pair<const char*, int64_t>{"shared expert intermediate size", m.shared_inter},
                             {"dense MLP intermediate size", m.dense_layers > 0 ? m.dense_inter : 0}}) {
    if (inter <= 0 || t == 1) continue;
    if (inter % t) why.push_back(fmt::format("{} {} does not split over TP {}", what, inter, t));
    else if (m.fp8 && m.block_out > 0 && ((inter / t) % m.block_out || (inter / t) % m.block_in))
      why.push_back(fmt::format("block-FP8 {} {}/{} = {} is not a multiple of the {} weight block", what, inter, t,
                                inter / t, std::max(m.block_out, m.block_in)));
  }
}

}  // namespace

ModelShape ModelShape::from_config(const json& top) {
  MS_CHECK(top.is_object(), "config.json: top level must be an object");
  ModelShape m;
  m.model_type = get_str(top, "model_type", "");
  // Kimi-K2.5 (KimiK25ForConditionalGeneration): the text backbone's fields are in text_config;
  // the vision tower (vision_config) is not loaded by moeserve (text-only) and not counted.
  if (has(top, "text_config")) MS_CHECK(top["text_config"].is_object(), "config.json: text_config must be an object");
  const json& j = has(top, "text_config") ? top["text_config"] : top;
  m.vision_tower = has(top, "vision_config");
  if (has(j, "kv_lora_rank")) {
    m.mla = true;
    m.q_lora = get_int(j, "q_lora_rank", 0);
    m.kv_lora = get_int(j, "kv_lora_rank");
    m.qk_nope = get_int(j, "qk_nope_head_dim");
    m.qk_rope = get_int(j, "qk_rope_head_dim");
    m.v_head = get_int(j, "v_head_dim");
    MS_CHECK(m.kv_lora > 0 && m.qk_nope > 0 && m.qk_rope > 0 && m.v_head > 0,
             "config.json: kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim must be positive");
  }
  m.hidden = get_int(j, "hidden_size");
  m.layers = get_int(j, "num_hidden_layers");
  m.heads = get_int(j, "num_attention_heads");
  m.kv_heads = get_int(j, "num_key_value_heads", m.heads);
  MS_CHECK(m.hidden > 0 && m.layers > 0 && m.heads > 0 && m.kv_heads > 0,
           "config.json: hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads must be positive");
  MS_CHECK(m.heads % m.kv_heads == 0, "config.json: num_attention_heads {} is not a multiple of num_key_value_heads {}",
           m.heads, m.kv_heads);
  m.head_dim = m.mla ? m.qk_nope + m.qk_rope : get_int(j, "head_dim", m.hidden / m.heads);
  MS_CHECK(m.head_dim > 0, "config.json: head_dim must be positive");
  m.vocab = get_int(j, "vocab_size");
  MS_CHECK(m.vocab > 0, "config.json: vocab_size must be positive");
  m.tied_embeddings = get_bool(j, "tie_word_embeddings", false);
  m.max_position = get_int(j, "max_position_embeddings", 0);

  // Experts: num_local_experts (MiniMax, Mixtral), num_experts (Qwen-MoE), n_routed_experts (DeepSeek).
  for (const char* k : {"num_local_experts", "num_experts", "n_routed_experts"})
    if (has(j, k)) {
      m.experts = get_int(j, k);
      break;
    }
  const bool minimax = m.model_type.rfind("minimax", 0) == 0;
  if (m.experts > 0) {
    m.top_k = get_int(j, "num_experts_per_tok");
    MS_CHECK(m.top_k > 0 && m.top_k <= m.experts, "config.json: num_experts_per_tok {} must be in [1, {}]", m.top_k,
             m.experts);
    m.moe_inter = has(j, "moe_intermediate_size") ? get_int(j, "moe_intermediate_size") : get_int(j, "intermediate_size");
    MS_CHECK(m.moe_inter > 0, "config.json: expert intermediate size must be positive");
    m.dense_inter = get_int(j, "intermediate_size", 0);
    if (has(j, "shared_intermediate_size")) m.shared_inter = get_int(j, "shared_intermediate_size");
    else if (has(j, "shared_expert_intermediate_size")) m.shared_inter = get_int(j, "shared_expert_intermediate_size");
    else if (has(j, "n_shared_experts")) m.shared_inter = get_int(j, "n_shared_experts") * m.moe_inter;
    m.dense_layers = get_int(j, "first_k_dense_replace", 0);
    if (has(j, "mlp_only_layers") && j["mlp_only_layers"].is_array()) m.dense_layers += int64_t(j["mlp_only_layers"].size());
    MS_CHECK(m.dense_layers <= m.layers, "config.json: more dense layers ({}) than layers ({})", m.dense_layers, m.layers);
    MS_CHECK(m.dense_layers == 0 || m.dense_inter > 0, "config.json: dense layers need intermediate_size");
    m.router_bias = minimax ? get_bool(j, "use_routing_bias", true) : get_str(j, "topk_method", "") == "noaux_tc";
    m.router_fp32 = minimax;
  } else {
    m.dense_inter = get_int(j, "intermediate_size");
    m.dense_layers = m.layers;
  }
  m.qk_norm = minimax ? get_bool(j, "use_qk_norm", true) : m.model_type.rfind("qwen3", 0) == 0;
  m.qk_norm_full_width = minimax && get_str(j, "qk_norm_type", "per_layer") == "per_layer";

  m.dtype = get_str(j, "torch_dtype", get_str(j, "dtype", get_str(top, "torch_dtype", get_str(top, "dtype", "bfloat16"))));
  m.dtype_bytes = dtype_bytes_of(m.dtype, "config.json torch_dtype");
  const json* qc = has(j, "quantization_config") ? &j["quantization_config"]
                   : has(top, "quantization_config") ? &top["quantization_config"] : nullptr;
  if (qc && get_str(*qc, "quant_method", "") == "compressed-tensors") {
    const json& q = *qc;
    MS_CHECK(get_str(q, "format", "") == "pack-quantized",
             "config.json: compressed-tensors format '{}' is not modelled by `plan` (only pack-quantized INT4)",
             get_str(q, "format", ""));
    MS_CHECK(has(q, "config_groups") && q["config_groups"].is_object() && q["config_groups"].size() == 1,
             "config.json: compressed-tensors needs exactly one config_groups entry");
    const json& grp = q["config_groups"].begin().value();
    MS_CHECK(grp.is_object() && has(grp, "weights") && grp["weights"].is_object(),
             "config.json: config_groups entry without 'weights'");
    const json& w = grp["weights"];
    MS_CHECK(get_int(w, "num_bits") == 4 && get_str(w, "type", "") == "int" && get_bool(w, "symmetric", false) &&
                 get_str(w, "strategy", "") == "group",
             "config.json: compressed-tensors weights must be 4-bit symmetric int with group strategy, got {}", w.dump());
    m.int4 = true;
    m.int4_group = get_int(w, "group_size");
    MS_CHECK(m.int4_group > 0, "config.json: compressed-tensors group_size must be positive");
    if (has(q, "ignore")) {
      MS_CHECK(q["ignore"].is_array(), "config.json: quantization_config.ignore must be a list");
      for (const auto& x : q["ignore"]) {
        MS_CHECK(x.is_string(), "config.json: quantization_config.ignore must hold strings");
        m.int4_ignore.push_back(x.get<std::string>());
        if (m.int4_ignore.back().rfind("re:", 0) == 0) {
          try {
            std::regex re(m.int4_ignore.back().substr(3));
          } catch (const std::regex_error&) {
            fail("config.json: quantization_config.ignore entry '{}' is not a valid regex", m.int4_ignore.back());
          }
        }
      }
    }
  } else if (qc) {
    const json& q = *qc;
    MS_CHECK(q.is_object(), "config.json: quantization_config must be an object");
    const std::string method = get_str(q, "quant_method", "");
    MS_CHECK(method == "fp8",
             "config.json: quantization_config.quant_method '{}' is not modelled by `plan` (fp8, compressed-tensors)",
             method);
    m.fp8 = true;
    if (has(q, "weight_block_size")) {
      const json& b = q["weight_block_size"];
      MS_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer() &&
                   b[0].get<int64_t>() > 0 && b[1].get<int64_t>() > 0,
               "config.json: quantization_config.weight_block_size must be [out, in] positive integers, got {}", b.dump());
      m.block_out = b[0].get<int64_t>();
      m.block_in = b[1].get<int64_t>();
    }
    for (const char* k : {"modules_to_not_convert", "ignored_layers"})
      if (has(q, k)) {
        MS_CHECK(q[k].is_array(), "config.json: quantization_config.{} must be a list", k);
        for (const auto& x : q[k]) {
          MS_CHECK(x.is_string(), "config.json: quantization_config.{} must hold strings", k);
          m.not_converted.push_back(x.get<std::string>());
        }
      }
  }
  // MTP modules (MiniMax num_mtp_modules, DeepSeek num_nextn_predict_layers): declared here,
  // present only if the index names model.layers.{layers + i}.*.
  if (has(j, "num_mtp_modules") && get_bool(j, "use_mtp", true)) m.mtp_declared = get_int(j, "num_mtp_modules");
  else if (has(j, "num_nextn_predict_layers")) m.mtp_declared = get_int(j, "num_nextn_predict_layers");
  m.kv_layers = m.layers;
  if (has(j, "attn_type_list") && j["attn_type_list"].is_array() && !j["attn_type_list"].empty()) {
    m.kv_layers = 0;
    for (const auto& x : j["attn_type_list"]) m.kv_layers += (x.is_number_integer() && x.get<int>() == 1) ? 1 : 0;
  }
  return m;
}

IndexInfo read_index(const json& index, const ModelShape& m) {
  IndexInfo r;
  MS_CHECK(index.is_object(), "model.safetensors.index.json: top level must be an object");
  if (index.contains("metadata") && index["metadata"].is_object() && has(index["metadata"], "total_size")) {
    const json& t = index["metadata"]["total_size"];
    if (t.is_number_integer()) r.total_size = t.get<int64_t>();
    else if (t.is_string()) {
      const std::string v = t.get<std::string>();
      size_t used = 0;
      try {
        r.total_size = std::stoll(v, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      MS_CHECK(used == v.size() && used > 0, "model.safetensors.index.json: metadata.total_size '{}' is not a number", v);
    }
    else fail("model.safetensors.index.json: metadata.total_size must be an integer, got {}", t.dump());
  }
  if (index.contains("weight_map")) {
    MS_CHECK(index["weight_map"].is_object(), "model.safetensors.index.json: weight_map must be an object");
    std::set<int64_t> mtp;
    const std::string prefix = "model.layers.";
    for (const auto& [name, file] : index["weight_map"].items()) {
      ++r.tensors;
      if (name.size() > 16 && name.compare(name.size() - 16, 16, "weight_scale_inv") == 0) ++r.fp8_scales;
      if (name.rfind(prefix, 0) == 0) {
        size_t p = prefix.size(), q = p;
        while (q < name.size() && q - p < 9 && std::isdigit(static_cast<unsigned char>(name[q]))) ++q;
        if (q > p && q < name.size() && name[q] == '.') {
          const int64_t layer = std::stoll(name.substr(p, q - p));
          if (layer >= m.layers && layer < m.layers + m.mtp_declared) mtp.insert(layer);
        }
      }
    }
    r.mtp_present = int64_t(mtp.size());
  }
  return r;
}

std::vector<Layout> candidate_layouts(int n) {
  MS_CHECK(n >= 1 && n <= 4096, "--gpus {}: expected 1..4096", n);
  std::vector<Layout> v{{fmt::format("TP{}", n), n, 1, 1}};
  if (n == 1) return v;
  v.push_back({fmt::format("TP{}+EP{}", n, n), n, 1, n});
  for (int d = 2; d <= n; ++d)
    if (n % d == 0) v.push_back({fmt::format("DP{}xTP{}+EP{}", d, n / d, n), n / d, d, n});
  return v;
}

json make_plan(const json& config, const json* index, const PlanOptions& o) {
  const ModelShape m = ModelShape::from_config(config);
  MS_CHECK(o.gpu_memory > 0, "--gpu-memory must be positive");
  MS_CHECK(o.utilization > 0 && o.utilization <= 1, "--gpu-memory-utilization {}: expected a fraction in (0, 1]",
           o.utilization);
  MS_CHECK(o.block_size > 0 && o.max_num_batched_tokens > 0 && o.max_num_seqs > 0 && o.overhead >= 0,
           "block size, max_num_batched_tokens, max_num_seqs must be positive");
  const int64_t L = o.max_model_len > 0 ? o.max_model_len : m.max_position;
  MS_CHECK(L > 0, "--max-model-len is required: config.json has no max_position_embeddings");
  // serve's parser (core/kv_cache_dtype.h): plan models exactly the caches serve can allocate
  // (auto: the model dtype, as on CUDA; fp8: e4m3, one byte).
  const int kv_elem =
      parse_kv_cache_dtype(o.kv_cache_dtype) == KvCacheDtype::Auto ? m.dtype_bytes : int(dtype_size(DType::F8_E4M3));
  const auto groups = build_groups(m);

  json r;
  // Checkpoint bytes as config arithmetic computes them (one rank holding everything).
  int64_t computed = 0;
  json by_cat = json::object();
  for (const auto& g : groups) {
    const int64_t b = g.count * slice_bytes(m, g, g.rows, g.cols);
    computed += b;
    by_cat[g.category] = by_cat.value(g.category, int64_t(0)) + b;
  }
  json ck{{"computed_bytes", computed},
          {"computed_bytes_by_category", by_cat},
          {"computed_tensors", count_tensors(groups)},
          {"mtp", {{"declared_modules", m.mtp_declared}, {"present_modules", nullptr}, {"loaded", false}}}};
  json warnings = json::array();
  if (index) {
    const IndexInfo ii = read_index(*index, m);
    ck["index_tensors"] = ii.tensors;
    ck["index_fp8_scale_tensors"] = ii.fp8_scales;
    ck["index_total_size"] = ii.total_size ? json(*ii.total_size) : json(nullptr);
    ck["mtp"]["present_modules"] = ii.mtp_present;
    if (ii.total_size) {
      const int64_t diff = *ii.total_size - computed;
      ck["index_minus_computed_bytes"] = diff;
      if (std::llabs(diff) * 100 > computed)
        warnings.push_back(fmt::format("index total_size {} differs from config arithmetic {} by {:.1f}%: per-GPU "
                                       "weights may be off (shapes or dtypes not as config.json says)",
                                       *ii.total_size, computed, 100.0 * double(diff) / double(computed)));
    }
    if (m.fp8 && index->contains("weight_map") && ii.fp8_scales == 0)
      warnings.push_back("config.json declares FP8 but the index lists no weight_scale_inv tensors");
  }
  if (m.vision_tower)
    warnings.push_back("config.json has a vision_config: the vision tower is not loaded (text-only serving) and its "
                       "weights are not counted; the index's total_size includes them");
  r["checkpoint"] = ck;

  json model{{"model_type", m.model_type}, {"hidden_size", m.hidden}, {"num_layers", m.layers},
             {"kv_cache_layers", m.kv_layers}, {"num_attention_heads", m.heads}, {"num_key_value_heads", m.kv_heads},
             {"head_dim", m.head_dim}, {"vocab_size", m.vocab}, {"tie_word_embeddings", m.tied_embeddings},
             {"num_experts", m.experts}, {"experts_per_token", m.top_k}, {"expert_intermediate_size", m.moe_inter},
             {"shared_expert_intermediate_size", m.shared_inter}, {"dense_layers", m.dense_layers},
             {"dense_intermediate_size", m.dense_inter}, {"dtype", m.dtype},
             {"quantization", m.fp8    ? json{{"method", "fp8"}, {"weight_block_size", {m.block_out, m.block_in}},
                                              {"modules_to_not_convert", m.not_converted}}
                              : m.int4 ? json{{"method", "compressed-tensors pack-quantized int4"},
                                              {"group_size", m.int4_group}, {"ignore", m.int4_ignore}}
                                       : json(nullptr)},
             {"mla", m.mla ? json{{"q_lora_rank", m.q_lora}, {"kv_lora_rank", m.kv_lora},
                                  {"qk_nope_head_dim", m.qk_nope}, {"qk_rope_head_dim", m.qk_rope},
                                  {"v_head_dim", m.v_head}}
                           : json(nullptr)},
             {"max_position_embeddings", m.max_position}};
  r["model"] = model;

  const int64_t usable = std::llround(double(o.gpu_memory) * o.utilization);
  r["options"] = {{"gpus", o.gpus}, {"gpu_memory_bytes", o.gpu_memory}, {"gpu_memory_utilization", o.utilization},
                  {"usable_bytes_per_gpu", usable}, {"max_model_len", L}, {"kv_cache_dtype", o.kv_cache_dtype},
                  {"kv_cache_bytes_per_element", kv_elem}, {"block_size", o.block_size},
                  {"max_num_batched_tokens", o.max_num_batched_tokens}, {"max_num_seqs", o.max_num_seqs},
                  {"overhead_bytes", o.overhead}, {"vocab_parallel_embedding", o.vocab_parallel}};
  r["memory_model"] = json::array({
      "usable = gpu_memory * gpu_memory_utilization",
      "weights = this GPU's slice: attention q/k/v/o split over TP (KV heads replicated when TP > KV heads), "
      "embedding and lm_head split by vocab over TP, norms and router replicated, routed experts sliced over TP "
      "(expert TP) or whole experts spread over EP",
      "reserve = overhead + activations + logits; activations = max_num_batched_tokens * 2 B * (4*hidden + "
      "q_heads_local*head_dim + 2*kv_heads_local*head_dim + top_k*3*expert_inter_routed + "
      "3*shared_inter/TP), expert_inter_routed = expert_inter/TP (expert TP) or expert_inter*DP/EP (EP, balanced "
      "routing); logits = max_num_seqs * vocab * 4 B",
      "kv = usable - weights - reserve; blocks = floor(kv / (block_size * kv_layers * 2 * kv_heads_local * head_dim "
      "* kv_bytes)); kv_tokens = blocks * block_size per replica; sequences at max_model_len = floor(blocks / "
      "ceil(max_model_len / block_size)) per replica, times DP",
      "MLA (kv_lora_rank): q_a/kv_a projections and their norms replicated, q_b/kv_b split by heads, o_proj by "
      "columns; KV per token = kv_layers * (kv_lora_rank + qk_rope_head_dim) * kv_bytes on every GPU (one latent "
      "vector per layer, not per head, replicated over TP); attention activations q_lora + heads_local*(nope+rope) + "
      "kv_lora + rope + heads_local*(nope+v)",
      "INT4 (compressed-tensors pack-quantized): per linear not in `ignore`, out*ceil(in/8)*4 B weight_packed + "
      "out*ceil(in/group)*2 B weight_scale + 8 B weight_shape",
      "sources: shapes from config.json; dtypes from config.json (fp8 blocks + fp32 scales for linear layers unless "
      "in modules_to_not_convert, MiniMax router fp32, the rest torch_dtype); the index's total_size is a cross-check "
      "only; MTP modules are never loaded"});

  json layouts = json::array();
  int best = -1;
  int64_t best_seqs = -1;
  const auto cands = candidate_layouts(o.gpus);
  for (size_t i = 0; i < cands.size(); ++i) {
    const Layout& l = cands[i];
    if (l.ep > 1 && m.experts == 0) continue;  // EP needs experts
    std::vector<std::string> why, notes;
    structural_checks(m, l, why, notes);
    int64_t weights = 0;
    json wcat = json::object();
    for (const auto& g : groups) {
      const int64_t b = rank_bytes(m, g, l, o.vocab_parallel);
      weights += b;
      wcat[g.category] = wcat.value(g.category, int64_t(0)) + b;
    }
    const int64_t t = l.tp;
    const int64_t kv_local = m.mla ? 1 : t <= m.kv_heads ? ceil_div(m.kv_heads, t) : 1;
    const int64_t hl = ceil_div(m.heads, t);
    // Attention activations per token: q/k/v widths; MLA: q latent, q, kv latent, k_nope + v.
    const int64_t attn_w = m.mla ? m.q_lora + hl * (m.qk_nope + m.qk_rope) + m.kv_lora + m.qk_rope +
                                       hl * (m.qk_nope + m.v_head)
                                 : hl * m.head_dim + 2 * kv_local * m.head_dim;
    int64_t mlp_w = 0;
    if (m.experts > 0) {
      const int64_t routed = l.ep > 1 ? ceil_div(m.moe_inter * l.dp, l.ep) : ceil_div(m.moe_inter, t);
      mlp_w = m.top_k * 3 * routed + 3 * ceil_div(m.shared_inter, t);
    }
    if (m.dense_layers > 0) mlp_w = std::max(mlp_w, 3 * ceil_div(m.dense_inter, t));
    const int64_t act_per_token = 2 * (4 * m.hidden + attn_w + mlp_w);
    const int64_t activations = o.max_num_batched_tokens * act_per_token;
    const int64_t logits = o.max_num_seqs * m.vocab * 4;
    const int64_t reserve = o.overhead + activations + logits;
    const int64_t kv_per_token = m.mla ? m.kv_layers * (m.kv_lora + m.qk_rope) * kv_elem
                                       : m.kv_layers * 2 * kv_local * m.head_dim * kv_elem;
    const int64_t kv_bytes = usable - weights - reserve;
    const int64_t blocks = kv_bytes > 0 && kv_per_token > 0 ? kv_bytes / (o.block_size * kv_per_token) : 0;
    const int64_t kv_tokens = blocks * o.block_size;
    const int64_t seq_blocks = ceil_div(L, o.block_size);
    const int64_t seqs_per_replica = blocks / seq_blocks;
    if (weights + reserve > usable)
      why.push_back(fmt::format("weights {} + reserve {} exceed the usable {} per GPU", human(weights), human(reserve),
                                human(usable)));
    else if (kv_tokens < L)
      why.push_back(fmt::format("the KV cache holds {} tokens per replica, less than max_model_len {}", kv_tokens, L));
    // Spelled through serve's flag table (tools/serve_flags.h): only flags serve implements.
    std::string flags = fmt::format("{} {}", serve_flags::spelling("tensor-parallel-size"), l.tp);
    if (l.dp > 1) flags = fmt::format("{} {} ", serve_flags::spelling("data-parallel-size"), l.dp) + flags;
    if (l.ep > 1) flags += " " + serve_flags::spelling("enable-expert-parallel");
    json j{{"name", l.name}, {"tp", l.tp}, {"dp", l.dp}, {"ep", l.ep}, {"expert_parallel", l.ep > 1},
           {"valid", why.empty()}, {"reasons", why}, {"notes", notes}, {"flags", flags},
           {"weights_bytes_per_gpu", weights}, {"weights_bytes_by_category", wcat},
           {"reserve_bytes", {{"overhead", o.overhead}, {"activations", activations}, {"logits", logits},
                              {"total", reserve}, {"activation_bytes_per_token", act_per_token}}},
           {"kv_heads_per_gpu", kv_local}, {"kv_bytes_per_token_per_gpu", kv_per_token},
           {"kv_cache_bytes_per_gpu", std::max<int64_t>(kv_bytes, 0)}, {"kv_blocks_per_gpu", blocks},
           {"kv_tokens_per_replica", kv_tokens}, {"kv_tokens_total", kv_tokens * l.dp},
           {"seqs_per_replica", seqs_per_replica}, {"max_concurrent_seqs", seqs_per_replica * l.dp},
           {"max_concurrency", double(kv_tokens * l.dp) / double(L)}};
    layouts.push_back(j);
    // Most sequences at max_model_len; ties go to the earlier candidate (TP before TP+EP
    // before DP: fewer replicas, lower per-sequence latency).
    if (why.empty() && seqs_per_replica * l.dp > best_seqs) {
      best = int(layouts.size()) - 1;
      best_seqs = seqs_per_replica * l.dp;
    }
  }
  r["layouts"] = layouts;
  if (best >= 0) {
    r["recommended"] = layouts[size_t(best)]["name"];
    r["recommendation_reason"] = fmt::format(
        "most concurrent sequences at max_model_len {} ({}); ties go to fewer DP replicas, then to expert TP over EP",
        L, best_seqs);
  } else {
    r["recommended"] = nullptr;
    r["recommendation_reason"] = "no layout is valid for these GPUs";
  }
  r["warnings"] = warnings;
  return r;
}

std::string format_plan(const json& r) {
  auto I = [](const json& v) { return v.get<int64_t>(); };
  const auto& o = r["options"];
  const auto& m = r["model"];
  std::string s;
  s += fmt::format("model: {} ({} layers, hidden {}, {} q / {} kv heads x {}, {} experts top-{} x {}, vocab {})\n",
                   m["model_type"].get<std::string>(), m["num_layers"].get<int64_t>(), m["hidden_size"].get<int64_t>(),
                   m["num_attention_heads"].get<int64_t>(), m["num_key_value_heads"].get<int64_t>(),
                   m["head_dim"].get<int64_t>(), m["num_experts"].get<int64_t>(), m["experts_per_token"].get<int64_t>(),
                   m["expert_intermediate_size"].get<int64_t>(), m["vocab_size"].get<int64_t>());
  const auto& ck = r["checkpoint"];
  s += fmt::format("weights: {} by config arithmetic", human(I(ck["computed_bytes"])));
  if (ck.contains("index_total_size") && !ck["index_total_size"].is_null())
    s += fmt::format(", index total_size {}", human(I(ck["index_total_size"])));
  s += fmt::format("; MTP modules {} declared, {} present (not loaded)\n", ck["mtp"]["declared_modules"].get<int64_t>(),
                   ck["mtp"]["present_modules"].is_null() ? std::string("?") : ck["mtp"]["present_modules"].dump());
  s += fmt::format("GPUs: {} x {}, utilization {} -> {} usable each; max_model_len {}, KV {} ({} B/elem)\n",
                   o["gpus"].get<int>(), human(I(o["gpu_memory_bytes"])), o["gpu_memory_utilization"].get<double>(),
                   human(I(o["usable_bytes_per_gpu"])), o["max_model_len"].get<int64_t>(),
                   o["kv_cache_dtype"].get<std::string>(), o["kv_cache_bytes_per_element"].get<int>());
  s += "memory model (per GPU):\n";
  for (const auto& line : r["memory_model"]) s += "  " + line.get<std::string>() + "\n";
  s += fmt::format("\n{:<16} {:>6} {:>11} {:>11} {:>12} {:>12} {:>8}\n", "layout", "valid", "weights/GPU", "reserve",
                   "KV tokens", "KV B/token", "seqs@L");
  // KV tokens: all replicas together; KV B/token: per GPU; seqs@L: sequences of max_model_len at once.
  for (const auto& l : r["layouts"]) {
    s += fmt::format("{:<16} {:>6} {:>11} {:>11} {:>12} {:>12} {:>8}\n", l["name"].get<std::string>(),
                     l["valid"].get<bool>() ? "yes" : "no", human(I(l["weights_bytes_per_gpu"])),
                     human(I(l["reserve_bytes"]["total"])), l["kv_tokens_total"].get<int64_t>(),
                     l["kv_bytes_per_token_per_gpu"].get<int64_t>(), l["max_concurrent_seqs"].get<int64_t>());
    for (const auto& w : l["reasons"]) s += "    invalid: " + w.get<std::string>() + "\n";
    for (const auto& w : l["notes"]) s += "    note: " + w.get<std::string>() + "\n";
  }
  for (const auto& w : r["warnings"]) s += "warning: " + w.get<std::string>() + "\n";
  if (r["recommended"].is_null()) {
    s += "\nrecommended: none (" + r["recommendation_reason"].get<std::string>() + ")\n";
  } else {
    std::string flags;
    for (const auto& l : r["layouts"])
      if (l["name"] == r["recommended"]) flags = l["flags"].get<std::string>();
    s += fmt::format("\nrecommended: {} ({})\n  flags (vllm serve spelling): {}\n", r["recommended"].get<std::string>(),
                     r["recommendation_reason"].get<std::string>(), flags);
    if (r.contains("recommended_command")) s += "  command: " + r["recommended_command"].get<std::string>() + "\n";
  }
  return s;
}

std::string recommended_command(const nlohmann::json& r, const std::string& model) {
  if (r["recommended"].is_null()) return "";
  std::string flags;
  for (const auto& l : r["layouts"])
    if (l["name"] == r["recommended"]) flags = l["flags"].get<std::string>();
  const auto& o = r["options"];
  std::string cmd = fmt::format("moeserve serve {} {} {} {} {} {}", model, flags, serve_flags::spelling("max-model-len"),
                                o["max_model_len"].get<int64_t>(), serve_flags::spelling("gpu-memory-utilization"),
                                o["gpu_memory_utilization"].get<double>());
  const std::string kv = o["kv_cache_dtype"].get<std::string>();
  if (kv != "auto") cmd += fmt::format(" {} {}", serve_flags::spelling("kv-cache-dtype"), kv);
  return cmd;
}

int64_t parse_size(const std::string& s) {
  double v = 0;
  const size_t used = parse_number_prefix(s, &v);
  MS_CHECK(used > 0 && v > 0, "size '{}': expected a number with an optional unit (96GB, 80GiB, 141e9)", s);
  std::string unit = s.substr(used);
  std::erase(unit, ' ');
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  static const std::pair<const char*, double> units[] = {
      {"", 1},         {"b", 1},          {"k", 1e3},           {"kb", 1e3},          {"m", 1e6},
      {"mb", 1e6},     {"g", 1e9},        {"gb", 1e9},          {"t", 1e12},          {"tb", 1e12},
      {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& [u, mult] : units)
    if (unit == u) {
      const double b = v * mult;
      MS_CHECK(b >= 1 && b < 9e18, "size '{}' is out of range", s);
      return std::llround(b);
    }
  fail("size '{}': unknown unit '{}' (B, KB, MB, GB, TB = powers of 1000; KiB, MiB, GiB, TiB = powers of 1024)", s,
       unit);
}


}  // namespace moeserve::plan
