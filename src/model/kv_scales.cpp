#include "model/kv_scales.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace moeserve {
namespace {

constexpr const char* kSuffixes[4] = {"self_attn.k_scale", "self_attn.v_scale", "self_attn.k_proj.output_scale",
                                      "self_attn.v_proj.output_scale"};

bool ends_with(const std::string& s, const std::string& e) {
  return s.size() >= e.size() && s.compare(s.size() - e.size(), e.size(), e) == 0;
}

// "…model.layers.{l}.{suffix}" -> l and which suffix (0..3); false otherwise.
bool parse_scale_name(const std::string& n, int* layer, int* which) {
  for (int w = 0; w < 4; ++w) {
    const std::string suf = kSuffixes[w];
    if (!ends_with(n, "." + suf)) continue;
    const std::string head = n.substr(0, n.size() - suf.size() - 1);  // …model.layers.{l}
    const std::string key = "model.layers.";
    const size_t at = head.rfind(key);
    if (at == std::string::npos) return false;
    const std::string num = head.substr(at + key.size());
    if (num.empty() || num.size() > 6 || num.find_first_not_of("0123456789") != std::string::npos) return false;
    *layer = std::stoi(num);
    *which = w;
    return true;
  }
  return false;
}

}  // namespace

bool is_kv_scale_tensor(const std::string& name) {
  int l = 0, w = 0;
  return parse_scale_name(name, &l, &w);
}

std::vector<KvScales> read_kv_scales(const Checkpoint& ckpt, int num_layers) {
  std::vector<KvScales> out(size_t(std::max(0, num_layers)));
  for (const std::string& n : ckpt.names()) {
    int l = 0, w = 0;
    if (!parse_scale_name(n, &l, &w) || l >= num_layers) continue;  // MTP layers: not cached here
    const Tensor t = ckpt.get(n);
    MS_CHECK(t.numel() == 1, "{}: a KV cache scale must be one number (per-tensor), got shape {}", n,
             shape_str(t.shape));
    float v = 0.f;
    convert_to_f32(t.dtype, t.data, &v, 1);
    MS_CHECK(std::isfinite(v) && v > 0.f, "{}: KV cache scale {} is not a finite positive number", n, v);
    KvScales& s = out[size_t(l)];
    const bool is_k = w == 0 || w == 2;
    // Both spellings present: self_attn.k_scale (vLLM's current name) wins.
    if (is_k && (!s.k_found || w == 0)) s.k = v, s.k_found = true;
    if (!is_k && (!s.v_found || w == 1)) s.v = v, s.v_found = true;
  }
  return out;
}

}  // namespace moeserve
