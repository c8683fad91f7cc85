// The per-layer scales of the FP8 KV cache (--kv-cache-dtype fp8, core/kv_cache_dtype.h).
// The checkpoint's when it has them (vLLM's names: model.layers.{l}.self_attn.k_scale /
// v_scale, or ...self_attn.k_proj.output_scale / v_proj.output_scale), else 1.0: vLLM's
// default too (its calculate_kv_scales, which estimates scales from the first batch, is off by
// default; such an estimate would also make the cache depend on which request came first).
#pragma once
#include <string>
#include <vector>

namespace moeserve {

class Checkpoint;

struct KvScales {
  float k = 1.f, v = 1.f;
  bool k_found = false, v_found = false;
};
// Per layer l < num_layers: the checkpoint's KV scales (any name prefix before
// "model.layers.{l}.", e.g. Kimi's "language_model."); 1.0 where absent. Throws for a scale
// that is not one finite positive number.
std::vector<KvScales> read_kv_scales(const Checkpoint& ckpt, int num_layers);
// True for the tensor names read_kv_scales reads (the loader does not warn about them).
bool is_kv_scale_tensor(const std::string& name);

}  // namespace moeserve
