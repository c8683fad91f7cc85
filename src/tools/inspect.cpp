#include "tools/inspect.h"

#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/arch/minimax_m2.h"
#include "model/int4.h"
#include "model/registry.h"
#include "model/weights.h"

namespace moeserve {

ParamCounts count_params(const ArchConfig& c) {
  // From the declarations (weights(), one rank): routed experts are tagged with their id, so
  // "active" counts top_k of them per MoE layer.
  const ModelDesc d = c.desc();
  ParamCounts p;
  p.embedding = int64_t(d.vocab_size) * d.hidden_size;
  std::map<std::string, int64_t> expert0;  // layer prefix -> parameters of its expert 0
  int64_t experts = 0;
  for (const auto& w : c.weights(ParallelConfig{})) {
    const int64_t n = shape_numel(w.shape);
    p.total += n;
    if (w.expert < 0) continue;
    experts += n;
    if (w.expert == 0) expert0[w.name.substr(0, w.name.find(".experts."))] += n;
  }
  if (!expert0.empty()) p.per_expert = expert0.begin()->second;
  const int64_t active_experts = int64_t(expert0.size()) * d.experts_per_token * p.per_expert;
  // Embedding + lm_head (one matrix when tied): active_no_lm_head leaves both out.
  const int64_t head = (d.tie_word_embeddings ? 1 : 2) * p.embedding;
  p.active_no_lm_head = p.total - head - experts + active_experts;
  p.active = p.active_no_lm_head + p.embedding;
  return p;
}

nlohmann::json inspect_checkpoint(const std::string& dir) {
  const LoadedConfig lc = load_model_config(dir);
  const ArchConfig& arch = *lc.config;
  const ModelDesc cfg = arch.desc();
  // A folder with config.json alone (as `plan` takes it): the config's summary, no tensors.
  bool has_weights = std::filesystem::exists(std::filesystem::path(dir) / "model.safetensors.index.json");
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    has_weights = has_weights || e.path().extension() == ".safetensors";
  const Checkpoint ckpt = has_weights ? Checkpoint::open(dir) : Checkpoint{};
  const ParamCounts pc = count_params(arch);
  nlohmann::json r;
  r["path"] = dir;
  r["architecture"] = cfg.architecture;
  r["model_type"] = cfg.model_type;
  r["hidden_size"] = cfg.hidden_size;
  r["num_layers"] = cfg.num_layers;
  r["num_attention_heads"] = cfg.num_attention_heads;
  r["num_key_value_heads"] = cfg.num_key_value_heads;
  r["head_dim"] = cfg.head_dim;
  r["rotary_dim"] = cfg.rotary_dim;
  r["num_experts"] = cfg.num_experts;
  r["experts_per_token"] = cfg.experts_per_token;
  r["expert_intermediate_size"] = cfg.expert_intermediate_size;
  r["dense_layers"] = cfg.num_dense_layers;
  r["dense_intermediate_size"] = cfg.num_dense_layers ? cfg.dense_intermediate_size : 0;
  r["vocab_size"] = cfg.vocab_size;
  r["max_position_embeddings"] = cfg.max_position_embeddings;
  // KV cache per token on one GPU at TP1 in bf16 (MLA: one kv_lora_rank + rope latent per layer).
  r["attention"] = cfg.kv_lora_rank > 0 ? "mla" : "gqa";
  r["kv_lora_rank"] = cfg.kv_lora_rank;
  r["q_lora_rank"] = cfg.q_lora_rank;
  r["kv_cache_bytes_per_token_bf16"] = arch.kv_layout(ParallelConfig{}).bytes_per_block(1, 2);
  r["params_total"] = pc.total;
  r["params_active"] = pc.active_no_lm_head;
  r["params_active_with_lm_head"] = pc.active;
  nlohmann::json q = nullptr;
  if (cfg.quantization.int4()) {
    nlohmann::json groups = nlohmann::json::array();
    for (const auto& g : cfg.quantization.int4_groups) groups.push_back(g.group_size);
    q = {{"method", cfg.quantization.quant_method},
         {"fmt", cfg.quantization.fmt},
         {"group_sizes", groups},
         {"ignore", cfg.quantization.ignore}};
  } else if (cfg.quantization.enabled())
    q = {{"method", cfg.quantization.quant_method},
         {"fmt", cfg.quantization.fmt},
         {"weight_block_size", {cfg.quantization.block_out, cfg.quantization.block_in}},
         {"activation_scheme", cfg.quantization.activation_scheme}};
  r["quantization"] = q;

  // Compare the checkpoint with the declarations (headers only).
  std::map<std::string, WeightDecl> decls;
  for (auto& d : arch.weights(ParallelConfig{})) decls[d.name] = d;
  // compressed-tensors INT4 weights (model/int4.h): stored as weight_packed + weight_scale +
  // weight_shape instead of `.weight`.
  auto int4_of = [&](const std::string& w) {
    auto it = decls.find(w);
    return it == decls.end() ? 0 : int4_group(cfg.quantization, it->second);
  };
  int64_t int4_bytes = 0, int4_parts = 0;
  std::map<std::string, int64_t> bytes_by_dtype, count_by_dtype;
  std::set<int> mtp_present;
  nlohmann::json unexpected = nlohmann::json::array(), mismatched = nlohmann::json::array();
  int64_t total_bytes = 0, fp8_tensors = 0, mtp_tensors = 0;
  for (const auto& n : ckpt.names()) {
    const TensorInfo& ti = ckpt.info(n);
    const int64_t nb = int64_t(ti.offset_end - ti.offset_begin);
    bytes_by_dtype[std::string(dtype_name(ti.dtype))] += nb;
    count_by_dtype[std::string(dtype_name(ti.dtype))] += 1;
    total_bytes += nb;
    if (ti.dtype == DType::F8_E4M3) ++fp8_tensors;
    auto it = decls.find(n);
    if (it != decls.end()) {
      const auto& ds = it->second.dtypes;
      if (ti.shape != it->second.shape || std::find(ds.begin(), ds.end(), ti.dtype) == ds.end())
        mismatched.push_back({{"name", n},
                              {"shape", ti.shape},
                              {"dtype", dtype_name(ti.dtype)},
                              {"expected_shape", it->second.shape}});
      continue;
    }
    const size_t k = n.size() > 10 ? n.size() - 10 : 0;
    if (k && n.compare(k, 10, "_scale_inv") == 0 && decls.count(n.substr(0, k))) continue;
    if (cfg.quantization.int4() && is_int4_part(n, [&](const std::string& w) { return int4_of(w) > 0; })) {
      int4_bytes += nb;
      ++int4_parts;
      continue;
    }
    if (is_mtp_tensor(cfg.num_layers, cfg.num_mtp_modules, n)) {
      ++mtp_tensors;
      mtp_present.insert(std::stoi(n.substr(13)) - cfg.num_layers);
      continue;
    }
    unexpected.push_back(n);
  }
  nlohmann::json missing = nlohmann::json::array();
  int64_t int4_weights = 0;
  for (const auto& [n, d] : decls) {
    if (!has_weights) break;
    if (const int g = int4_of(n); g > 0) {
      ++int4_weights;
      const std::string packed = int4_module(n) + ".weight_packed";
      if (!ckpt.contains(packed)) {
        missing.push_back(packed);
      } else if (const std::string why = int4_tensor_problem(ckpt, d, g); !why.empty()) {
        mismatched.push_back({{"name", packed}, {"problem", why}});
      }
      continue;
    }
    if (!ckpt.contains(n)) {
      missing.push_back(n);
    } else if (ckpt.info(n).dtype == DType::F8_E4M3) {
      // FP8 needs a block size from config.json and a scale grid [ceil(out/bo), ceil(in/bi)].
      const std::string sn = scale_name(n);
      const Shape& ws = ckpt.info(n).shape;
      if (!ckpt.contains(sn)) {
        missing.push_back(sn);
      } else if (!cfg.quantization.enabled() || ws.size() != 2) {
        mismatched.push_back({{"name", n}, {"shape", ws}, {"dtype", "F8_E4M3"},
                              {"problem", "FP8 tensor but config.json has no quantization_config"}});
      } else {
        const TensorInfo& si = ckpt.info(sn);
        const int64_t bo = cfg.quantization.block_out, bi = cfg.quantization.block_in;
        const Shape want{(ws[0] + bo - 1) / bo, (ws[1] + bi - 1) / bi};
        if (si.shape != want || !(si.dtype == DType::F32 || si.dtype == DType::BF16 || si.dtype == DType::F16))
          mismatched.push_back(
              {{"name", sn}, {"shape", si.shape}, {"dtype", dtype_name(si.dtype)}, {"expected_shape", want}});
      }
    }
  }
  r["tensors"] = ckpt.names().size();
  r["bytes_total"] = total_bytes;
  r["bytes_by_dtype"] = bytes_by_dtype;
  r["tensors_by_dtype"] = count_by_dtype;
  r["fp8_tensors"] = fp8_tensors;
  // INT4: the weights declared INT4 by quantization_config, and the bytes of their stored
  // parts (0.5 byte per parameter in weight_packed, plus the scales and weight_shape).
  r["int4_weights"] = int4_weights;
  r["int4_tensors"] = int4_parts;
  r["int4_bytes"] = int4_bytes;
  r["mtp"] = {{"declared_modules", cfg.num_mtp_modules},
              {"use_mtp", cfg.use_mtp},
              {"present_modules", mtp_present.size()},
              {"present_tensors", mtp_tensors}};
  r["missing_tensors"] = missing;
  r["mismatched_tensors"] = mismatched;
  r["unexpected_tensors"] = unexpected;
  r["weights_present"] = has_weights;
  r["complete"] = has_weights && missing.empty() && mismatched.empty();
  return r;
}

namespace {
std::string human_count(int64_t n) {
  if (n >= 1000000000) return fmt::format("{:.2f}B", n / 1e9);
  if (n >= 1000000) return fmt::format("{:.2f}M", n / 1e6);
  if (n >= 1000) return fmt::format("{:.1f}K", n / 1e3);
  return std::to_string(n);
}
std::string human_bytes(int64_t n) {
  if (n >= (int64_t(1) << 30)) return fmt::format("{:.2f} GiB", n / double(int64_t(1) << 30));
  if (n >= (1 << 20)) return fmt::format("{:.2f} MiB", n / double(1 << 20));
  if (n >= (1 << 10)) return fmt::format("{:.1f} KiB", n / 1024.0);
  return fmt::format("{} B", n);
}
}  // namespace

std::string format_inspect(const nlohmann::json& r) {
  std::string s;
  s += fmt::format("{}  ({})\n", r["path"].get<std::string>(), r["architecture"].get<std::string>());
  s += fmt::format("  model_type       {}\n", r["model_type"].get<std::string>());
  s += fmt::format("  layers           {}\n", r["num_layers"].get<int>());
  s += fmt::format("  hidden           {}\n", r["hidden_size"].get<int>());
  s += fmt::format("  heads            {} query / {} kv, head_dim {}, rotary_dim {}\n",
                   r["num_attention_heads"].get<int>(), r["num_key_value_heads"].get<int>(), r["head_dim"].get<int>(),
                   r["rotary_dim"].get<int>());
  s += fmt::format("  experts          {} (top-{}), intermediate {}\n", r["num_experts"].get<int>(),
                   r["experts_per_token"].get<int>(), r["expert_intermediate_size"].get<int>());
  if (r.value("dense_layers", 0) > 0)
    s += fmt::format("  dense layers     {}, intermediate {}\n", r["dense_layers"].get<int>(),
                     r["dense_intermediate_size"].get<int>());
  s += fmt::format("  vocab            {}\n", r["vocab_size"].get<int>());
  if (r.value("attention", "") == "mla")
    s += fmt::format("  attention        MLA, kv_lora_rank {}, q_lora_rank {}\n", r["kv_lora_rank"].get<int>(),
                     r["q_lora_rank"].get<int>());
  if (r.contains("kv_cache_bytes_per_token_bf16"))
    s += fmt::format("  KV cache         {} B per token (bf16, all layers, one GPU)\n",
                     r["kv_cache_bytes_per_token_bf16"].get<int64_t>());
  s += fmt::format("  parameters       {} total, {} active per token ({} with lm_head)\n",
                   human_count(r["params_total"].get<int64_t>()), human_count(r["params_active"].get<int64_t>()),
                   human_count(r["params_active_with_lm_head"].get<int64_t>()));
  if (r["quantization"].is_null()) {
    s += "  quantization     none\n";
  } else if (r["quantization"].contains("group_sizes")) {
    const auto& q = r["quantization"];
    s += fmt::format("  quantization     {} {} INT4, group {}, {} INT4 weights ({} in {} tensors)\n",
                     q["method"].get<std::string>(), q["fmt"].get<std::string>(), q["group_sizes"].dump(),
                     r.value("int4_weights", int64_t(0)), human_bytes(r.value("int4_bytes", int64_t(0))),
                     r.value("int4_tensors", int64_t(0)));
  } else {
    const auto& q = r["quantization"];
    s += fmt::format("  quantization     {} {} blocks [{}, {}], {} FP8 tensors\n", q["method"].get<std::string>(),
                     q["fmt"].get<std::string>(), q["weight_block_size"][0].get<int>(),
                     q["weight_block_size"][1].get<int>(), r["fp8_tensors"].get<int64_t>());
  }
  if (!r.value("weights_present", true)) {
    s += "  weights          none (config.json only: shapes and counts from the config)\n";
    return s;
  }
  s += fmt::format("  tensors          {} ({})\n", r["tensors"].get<int64_t>(), human_bytes(r["bytes_total"].get<int64_t>()));
  for (const auto& [dt, b] : r["bytes_by_dtype"].items())
    s += fmt::format("    {:8} {:>8} tensors  {}\n", dt, r["tensors_by_dtype"][dt].get<int64_t>(),
                     human_bytes(b.get<int64_t>()));
  const auto& m = r["mtp"];
  s += fmt::format("  MTP modules      {} declared, {} present ({} tensors, skipped when loading)\n",
                   m["declared_modules"].get<int>(), m["present_modules"].get<int>(), m["present_tensors"].get<int>());
  auto list = [&](const char* key, const char* label) {
    const auto& a = r[key];
    s += fmt::format("  {:16} {}\n", label, a.size());
    for (size_t i = 0; i < a.size() && i < 10; ++i)
      s += fmt::format("    {}\n", a[i].is_string() ? a[i].get<std::string>() : a[i].dump());
    if (a.size() > 10) s += fmt::format("    ... {} more\n", a.size() - 10);
  };
  list("missing_tensors", "missing");
  list("mismatched_tensors", "mismatched");
  list("unexpected_tensors", "unexpected");
  return s;
}

}  // namespace moeserve
