#include "model/int4.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <regex>

#include <fmt/format.h>

#include "core/error.h"

namespace moeserve {

namespace config_json {

namespace {

std::vector<std::string> string_list(const json& j, const std::string& field) {
  MS_CHECK(j.is_array(), "config.json: quantization_config.{} must be a list of strings, got {}", field, j.dump());
  std::vector<std::string> out;
  for (const auto& x : j) {
    MS_CHECK(x.is_string(), "config.json: quantization_config.{} must hold strings, got {}", field, x.dump());
    out.push_back(x.get<std::string>());
    if (out.back().rfind("re:", 0) == 0) {
      try {
        std::regex re(out.back().substr(3));
      } catch (const std::regex_error&) {
        fail("config.json: quantization_config.{} entry '{}' is not a valid regex", field, out.back());
      }
    }
  }
  return out;
}

bool is_set(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

}  // namespace

QuantizationConfig parse_compressed_tensors(const json& q) {
  QuantizationConfig c;
  c.quant_method = "compressed-tensors";
  c.raw = q;
  c.fmt = get_string(q, "format", "");
  MS_CHECK(c.fmt == "pack-quantized",
           "config.json: quantization_config.format '{}' is not supported (compressed-tensors: only pack-quantized "
           "INT4 weights)",
           c.fmt);
  c.activation_scheme = "none";  // W4A16: activations stay in the backend's dtype
  MS_CHECK(!is_set(q, "kv_cache_scheme"),
           "config.json: quantization_config.kv_cache_scheme {} is not supported (compressed-tensors KV-cache "
           "quantisation)",
           is_set(q, "kv_cache_scheme") ? q["kv_cache_scheme"].dump() : "");
  MS_CHECK(q.contains("config_groups") && q["config_groups"].is_object() && !q["config_groups"].empty(),
           "config.json: quantization_config.config_groups must be a non-empty object (compressed-tensors)");
  for (const auto& [gname, g] : q["config_groups"].items()) {
    const std::string where = "config_groups." + gname;
    MS_CHECK(g.is_object(), "config.json: quantization_config.{} must be an object", where);
    for (const char* act : {"input_activations", "output_activations"})
      MS_CHECK(!is_set(g, act),
               "config.json: quantization_config.{}.{} is not supported (activation quantisation; only W4A16 "
               "weight-only INT4)",
               where, act);
    const std::string gfmt = get_string(g, "format", "pack-quantized");
    MS_CHECK(gfmt == "pack-quantized", "config.json: quantization_config.{}.format '{}' is not supported (only "
             "pack-quantized)", where, gfmt);
    MS_CHECK(g.contains("targets"), "config.json: quantization_config.{}.targets is missing", where);
    Int4Group ig;
    ig.targets = string_list(g["targets"], where + ".targets");
    MS_CHECK(!ig.targets.empty(), "config.json: quantization_config.{}.targets is empty", where);
    MS_CHECK(is_set(g, "weights") && g["weights"].is_object(),
             "config.json: quantization_config.{}.weights must be an object", where);
    const json& w = g["weights"];
    const int bits = get_int(w, "num_bits");
    MS_CHECK(bits == 4, "config.json: quantization_config.{}.weights.num_bits {} is not supported (only 4)", where,
             bits);
    const std::string type = get_string(w, "type", "int");
    MS_CHECK(type == "int", "config.json: quantization_config.{}.weights.type '{}' is not supported (only int)", where,
             type);
    MS_CHECK(get_bool(w, "symmetric", true),
             "config.json: quantization_config.{}.weights.symmetric false is not supported (asymmetric INT4 with "
             "zero points; only symmetric)",
             where);
    const std::string strategy = get_string(w, "strategy", "");
    MS_CHECK(strategy == "group",
             "config.json: quantization_config.{}.weights.strategy '{}' is not supported (only group)", where,
             strategy);
    ig.group_size = get_int(w, "group_size");
    MS_CHECK(ig.group_size > 0, "config.json: quantization_config.{}.weights.group_size {} must be positive", where,
             ig.group_size);
    MS_CHECK(!get_bool(w, "dynamic", false),
             "config.json: quantization_config.{}.weights.dynamic true is not supported", where);
    // act-order stores a permutation (weight_g_idx) that this loader does not apply.
    if (is_set(w, "actorder")) {
      const json& a = w["actorder"];
      const bool off = (a.is_boolean() && !a.get<bool>()) || (a.is_string() && a.get<std::string>() == "none");
      MS_CHECK(off, "config.json: quantization_config.{}.weights.actorder {} is not supported (act-order INT4)", where,
               a.dump());
    }
    MS_CHECK(!is_set(w, "block_structure"),
             "config.json: quantization_config.{}.weights.block_structure is not supported (group strategy only)",
             where);
    c.int4_groups.push_back(std::move(ig));
  }
  if (is_set(q, "ignore")) c.ignore = string_list(q["ignore"], "ignore");
  return c;
}

}  // namespace config_json

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// re.match semantics (anchored at the start, not the end). Compiled once per thread.
bool regex_match_start(const std::string& pattern, const std::string& s) {
  thread_local std::map<std::string, std::regex> cache;
  auto it = cache.find(pattern);
  if (it == cache.end()) it = cache.emplace(pattern, std::regex(pattern)).first;
  return std::regex_search(s, it->second, std::regex_constants::match_continuous);
}

bool entry_matches(const std::string& e, const std::string& module, bool linear) {
  if (e.rfind("re:", 0) == 0) return regex_match_start(e.substr(3), module);
  if (e == "Linear") return linear;
  if (e == module) return true;
  return module.size() > e.size() && module.compare(module.size() - e.size(), e.size(), e) == 0 &&
         module[module.size() - e.size() - 1] == '.';
}

bool is_linear_decl(const WeightDecl& d) {
  if (d.shape.size() != 2) return false;
  if (std::find(d.dtypes.begin(), d.dtypes.end(), DType::F8_E4M3) != d.dtypes.end()) return true;
  const std::string tail = "lm_head.weight";
  return d.name.size() >= tail.size() && d.name.compare(d.name.size() - tail.size(), tail.size(), tail) == 0;
}

// This rank's rows [r0, r0 + nr) and columns [c0, c0 + nc) of `d` (slice_weight's rule).
struct Slice {
  int64_t r0, nr, c0, nc;
};
Slice local_slice(const WeightDecl& d) {
  Slice s{0, d.shape[0], 0, d.shape[1]};
  const ShardSpec& sh = d.shard;
  if ((sh.kind != ShardKind::ColumnParallel && sh.kind != ShardKind::RowParallel) || sh.world == 1) return s;
  const Shape l = local_shape(d);  // throws naming the tensor when the split does not divide
  const int slice = sh.rank / sh.replicate;
  if (sh.kind == ShardKind::ColumnParallel) s.r0 = slice * l[0], s.nr = l[0];
  else s.c0 = slice * l[1], s.nc = l[1];
  return s;
}

std::string group_cut(const WeightDecl& d, int group) {
  if (d.shard.kind != ShardKind::RowParallel || d.shard.world == 1) return "";
  const Shape l = local_shape(d);
  if (l[1] % group == 0) return "";
  return fmt::format(
      "INT4 tensor '{}.weight_packed': splitting its {} inputs over {} tensor-parallel ranks gives {} per rank, which "
      "cuts its quantisation groups of {} inputs (one weight_scale each); use --enable-expert-parallel (whole "
      "experts per rank) or a tensor-parallel size that keeps whole groups",
      int4_module(d.name), d.shape[1], d.shard.world / d.shard.replicate, l[1], group);
}

}  // namespace

std::string int4_module(const std::string& weight_name) {
  const std::string tail = ".weight";
  if (weight_name.size() <= tail.size() ||
      weight_name.compare(weight_name.size() - tail.size(), tail.size(), tail) != 0)
    return "";
  return weight_name.substr(0, weight_name.size() - tail.size());
}

int int4_group(const QuantizationConfig& q, const std::string& module, bool linear) {
  if (!q.int4() || module.empty()) return 0;
  for (const auto& e : q.ignore)
    if (entry_matches(e, module, linear)) return 0;
  for (const auto& g : q.int4_groups)
    for (const auto& t : g.targets)
      if (entry_matches(t, module, linear)) return g.group_size;
  return 0;
}

int int4_group(const QuantizationConfig& q, const WeightDecl& d) {
  if (!q.int4() || !is_linear_decl(d)) return 0;
  return int4_group(q, int4_module(d.name), true);
}

std::vector<int32_t> pack_int4(const int8_t* q, int64_t rows, int64_t cols) {
  const int64_t wpr = ceil_div(cols, 8);
  std::vector<int32_t> out(size_t(rows * wpr), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int v = q[r * cols + c];
      MS_CHECK(v >= -8 && v <= 7, "pack_int4: value {} at ({}, {}) is outside [-8, 7]", v, r, c);
      uint32_t& w = reinterpret_cast<uint32_t&>(out[size_t(r * wpr + c / 8)]);
      w |= uint32_t(v + 8) << (4 * (c % 8));
    }
  return out;
}

std::string int4_tensor_problem(const Checkpoint& ckpt, const WeightDecl& d, int group) {
  const std::string m = int4_module(d.name);
  const std::string pn = m + ".weight_packed", sn = m + ".weight_scale", hn = m + ".weight_shape";
  const int64_t out = d.shape[0], in = d.shape[1];
  if (!ckpt.contains(pn)) {
    if (ckpt.contains(d.name))
      return fmt::format("checkpoint {}: missing tensor '{}': module {} is INT4 under quantization_config "
                         "(compressed-tensors targets, not in ignore) but the checkpoint stores '{}' ({})",
                         ckpt.dir(), pn, m, d.name, dtype_name(ckpt.info(d.name).dtype));
    return fmt::format("checkpoint {}: missing tensor '{}' (INT4 weight of {}, expected I32 [{}, {}])", ckpt.dir(), pn,
                       m, out, ceil_div(in, 8));
  }
  if (in % group != 0)
    return fmt::format("INT4 tensor '{}': group_size {} does not divide its {} inputs (weight_shape [{}, {}])", pn,
                       group, in, out, in);
  const TensorInfo& pi = ckpt.info(pn);
  if (pi.dtype != DType::I32)
    return fmt::format("tensor '{}': dtype {} in {}, expected I32 (8 packed INT4 values per word)", pn,
                       dtype_name(pi.dtype), pi.file);
  if (pi.shape != Shape{out, ceil_div(in, 8)})
    return fmt::format("tensor '{}': shape {} in {}, expected [{}, {}] for weight [{}, {}]", pn, shape_str(pi.shape),
                       pi.file, out, ceil_div(in, 8), out, in);
  if (!ckpt.contains(sn))
    return fmt::format("checkpoint {}: INT4 tensor '{}' has no scale tensor '{}' (expected BF16 [{}, {}])",
                       ckpt.dir(), pn, sn, out, in / group);
  const TensorInfo& si = ckpt.info(sn);
  if (si.dtype != DType::BF16 && si.dtype != DType::F16 && si.dtype != DType::F32)
    return fmt::format("tensor '{}': dtype {} in {}, expected BF16", sn, dtype_name(si.dtype), si.file);
  if (si.shape != Shape{out, in / group})
    return fmt::format("tensor '{}': shape {} in {}, expected [{}, {}] (one scale per {} inputs of weight [{}, {}])",
                       sn, shape_str(si.shape), si.file, out, in / group, group, out, in);
  if (!ckpt.contains(hn))
    return fmt::format("checkpoint {}: INT4 tensor '{}' has no '{}' (I32 [2])", ckpt.dir(), pn, hn);
  const TensorInfo& hi = ckpt.info(hn);
  if ((hi.dtype != DType::I32 && hi.dtype != DType::I64) || hi.shape != Shape{2})
    return fmt::format("tensor '{}': {} {} in {}, expected I32 [2]", hn, dtype_name(hi.dtype), shape_str(hi.shape),
                       hi.file);
  return "";
}

LoadedTensor load_int4_weight(const Checkpoint& ckpt, const WeightDecl& d, int group, bool keep_packed) {
  const std::string why = int4_tensor_problem(ckpt, d, group);
  MS_CHECK(why.empty(), "{}", why);
  const std::string m = int4_module(d.name);
  const int64_t out = d.shape[0], in = d.shape[1];
  {  // weight_shape holds the dense shape; a mismatch means the packing is not what we read.
    const Tensor h = ckpt.get(m + ".weight_shape");
    const int64_t h0 = h.dtype == DType::I32 ? h.ptr<int32_t>()[0] : h.ptr<int64_t>()[0];
    const int64_t h1 = h.dtype == DType::I32 ? h.ptr<int32_t>()[1] : h.ptr<int64_t>()[1];
    MS_CHECK(h0 == out && h1 == in, "tensor '{}.weight_shape': [{}, {}], expected the declared shape [{}, {}]", m, h0,
             h1, out, in);
  }
  const std::string cut = group_cut(d, group);
  MS_CHECK(cut.empty(), "{}", cut);
  if (d.shard.kind == ShardKind::ExpertOwned && !d.shard.owned) return {};  // validated, not loaded
  const Slice s = local_slice(d);
  const Tensor packed = ckpt.get(m + ".weight_packed");  // I32 [out, ceil(in/8)]
  Tensor scale = ckpt.get(m + ".weight_scale");          // [out, in/group]
  const int64_t ng = in / group, wpr = ceil_div(in, 8);
  if (keep_packed) {
    // Whole groups per slice (group_cut above), so the slice is whole words and scale columns.
    MS_CHECK(in % 8 == 0 && s.c0 % group == 0 && s.nc % group == 0 && group % 8 == 0,
             "INT4 tensor '{}.weight_packed': slice columns [{}, {}) of {} are not whole groups of {}", m, s.c0,
             s.c0 + s.nc, in, group);
    MS_CHECK(scale.dtype == DType::BF16, "tensor '{}.weight_scale': {} (packed INT4 needs BF16 scales)", m,
             dtype_name(scale.dtype));
    LoadedTensor lt;
    lt.tensor = Tensor::host(DType::I32, {s.nr, s.nc / 8});
    lt.scale_inv = Tensor::host(DType::BF16, {s.nr, s.nc / group});
    lt.block_out = 1, lt.block_in = group;
    for (int64_t r = 0; r < s.nr; ++r) {
      std::memcpy(lt.tensor.ptr<int32_t>() + r * (s.nc / 8), packed.ptr<int32_t>() + (s.r0 + r) * wpr + s.c0 / 8,
                  size_t(s.nc / 8) * 4);
      std::memcpy(static_cast<uint16_t*>(lt.scale_inv.data) + r * (s.nc / group),
                  static_cast<const uint16_t*>(scale.data) + (s.r0 + r) * ng + s.c0 / group, size_t(s.nc / group) * 2);
    }
    return lt;
  }
  std::vector<float> sc(size_t(out * ng));
  convert_to_f32(scale.dtype, scale.data, sc.data(), sc.size());
  LoadedTensor lt;
  lt.tensor = Tensor::host(DType::F32, {s.nr, s.nc});  // this rank's dequantised slice
  float* o = lt.tensor.ptr<float>();
  const int32_t* w = packed.ptr<int32_t>();
  for (int64_t r = 0; r < s.nr; ++r)
    for (int64_t c = 0; c < s.nc; ++c) {
      const int64_t gr = s.r0 + r, gc = s.c0 + c;
      o[r * s.nc + c] = float(int4_value(w, wpr, gr, gc)) * sc[size_t(gr * ng + gc / group)];
    }
  return lt;
}

std::string int4_split_problem(const std::vector<WeightDecl>& decls, const QuantizationConfig& q) {
  if (!q.int4()) return "";
  for (const auto& d : decls)
    if (const int g = int4_group(q, d); g > 0)
      if (std::string p = group_cut(d, g); !p.empty()) return p;
  return "";
}

std::string first_int4_tensor(const std::vector<WeightDecl>& decls, const QuantizationConfig& q, bool skip_experts) {
  if (!q.int4()) return "";
  for (const auto& d : decls)
    if (int4_group(q, d) > 0 && !(skip_experts && d.expert >= 0)) return int4_module(d.name) + ".weight_packed";
  return "";
}

bool is_int4_part(const std::string& name, const std::function<bool(const std::string&)>& is_int4_weight) {
  for (const char* suffix : {"_packed", "_scale", "_shape"}) {
    const std::string sfx = std::string(".weight") + suffix;
    if (name.size() > sfx.size() && name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0 &&
        is_int4_weight(name.substr(0, name.size() - sfx.size()) + ".weight"))
      return true;
  }
  return false;
}

}  // namespace moeserve
