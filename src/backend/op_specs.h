// Parameter specs of the backend ops that differ between MoE model families: how a router
// scores and selects experts, which QK-norm an attention block applies, the RoPE variant, and
// the KV cache layout. An architecture file (model/arch/) fills them from its config; every
// backend implements each spec (the CPU backend is the reference) and may run a faster kernel
// for the specs it knows (CUDA: MiniMax-M2's sigmoid routing, full-width QK-norm, plain NeoX).
//
// Header-only and free of other includes so CUDA device code can use the RoPE formula too.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MS_HOST_DEVICE __host__ __device__
#else
#define MS_HOST_DEVICE
#endif

namespace moeserve {

// ---- MoE routing ----
enum class RouteScoring : int32_t { Sigmoid = 0, Softmax = 1 };

// logits = x @ gate^T (f32); s = scoring(logits) over all E experts; choice = s + bias (when
// MoeWeights::score_bias is set: a selection-only bias); with n_group > 1 the experts form
// n_group equal groups, a group scores the sum of its two best choices when a bias is set
// (DeepSeek-V3) or its best choice otherwise, and only the topk_group best groups compete;
// top_k of choice (ties: lower expert id). weights = s[chosen], divided by their sum when
// renormalize, then times routed_scaling_factor.
//   MiniMax-M2:  Sigmoid, bias, 1 group, renormalize, 1.0
//   Qwen3-MoE:   Softmax, no bias, 1 group, renormalize = norm_topk_prob, 1.0
//   DeepSeek-V3: Sigmoid, bias, n_group 8 / topk_group 4, renormalize, 2.5
struct RoutingSpec {
  RouteScoring scoring = RouteScoring::Sigmoid;
  int n_group = 1;
  int topk_group = 1;
  bool renormalize = true;
  float routed_scaling_factor = 1.f;
  // The spec the CUDA fast router kernels implement (bias optional).
  bool sigmoid_renorm() const {
    return scoring == RouteScoring::Sigmoid && n_group <= 1 && renormalize && routed_scaling_factor == 1.f;
  }
};

// ---- QK-norm ----
// None: no norm. PerHead: RMSNorm over each head's head_dim values with one [head_dim] weight
// (Qwen3). FullWidth: RMSNorm over the whole q (k) row across all heads, weight [width]
// (MiniMax-M2; under TP the statistic is all-reduced).
enum class QkNormMode : int32_t { None = 0, PerHead = 1, FullWidth = 2 };

// ---- RoPE ----
// NeoX: rotate-half (dims i and i + rotary_dim/2 pair). GptJ: interleaved (dims 2i, 2i+1).
enum class RopeStyle : int32_t { NeoX = 0, GptJ = 1 };
enum class RopeScaling : int32_t { None = 0, Linear = 1, Yarn = 2 };

// The first rotary_dim dims of each head rotate (partial rotary when < head_dim) with
// inv_freq[i] = theta^(-2i / rotary_dim), i < rotary_dim / 2, scaled as HF transformers'
// rope_init_fns: Linear divides by factor; YaRN blends interpolated (inv_freq / factor) and
// extrapolated frequencies with a linear ramp between the correction dims of beta_fast and
// beta_slow over original_max_position, and scales cos/sin by attention_factor.
struct RopeSpec {
  int head_dim = 0;
  int rotary_dim = 0;
  float theta = 10000.f;
  RopeStyle style = RopeStyle::NeoX;
  RopeScaling scaling = RopeScaling::None;
  float factor = 1.f;
  int original_max_position = 0;  // YaRN
  float beta_fast = 32.f, beta_slow = 1.f;  // YaRN
  float attention_factor = 1.f;   // YaRN: cos/sin multiplier (rope_attention_factor below)
  bool truncate = true;           // YaRN: round the correction range to whole dims (HF default)
  bool plain() const { return style == RopeStyle::NeoX && scaling == RopeScaling::None; }
};

// HF's default YaRN attention factor: 0.1 * mscale * ln(factor) + 1 (1 for factor <= 1);
// with mscale and mscale_all_dim both set, the ratio of the two.
inline float yarn_attention_factor(double factor, double mscale, double mscale_all_dim) {
  auto get = [factor](double m) { return factor <= 1 ? 1.0 : 0.1 * m * std::log(factor) + 1.0; };
  if (mscale != 0 && mscale_all_dim != 0) return float(get(mscale) / get(mscale_all_dim));
  return float(get(1.0));
}

// inv_freq[i] for i < rotary_dim / 2 (HF computes it in float32; so does this).
MS_HOST_DEVICE inline float rope_inv_freq(const RopeSpec& r, int i) {
  const float expo = float(2 * i) / float(r.rotary_dim);
  const float pos_freq = float(pow(double(r.theta), double(expo)));  // theta^(2i/rd)
  const float base = 1.f / pos_freq;
  if (r.scaling == RopeScaling::Linear) return base / r.factor;
  if (r.scaling != RopeScaling::Yarn) return base;
  // find_correction_dim(rot) = rd * ln(orig / (rot * 2 pi)) / (2 ln theta)
  const double two_pi = 6.283185307179586;
  const double lt = 2.0 * log(double(r.theta));
  double low = double(r.rotary_dim) * log(double(r.original_max_position) / (double(r.beta_fast) * two_pi)) / lt;
  double high = double(r.rotary_dim) * log(double(r.original_max_position) / (double(r.beta_slow) * two_pi)) / lt;
  if (r.truncate) {
    low = floor(low);
    high = ceil(high);
  }
  low = low < 0 ? 0 : low;
  high = high > r.rotary_dim - 1 ? r.rotary_dim - 1 : high;
  if (low == high) high += 0.001;
  float ramp = float((double(i) - low) / (high - low));  // linear_ramp_factor, in float32 as HF
  ramp = ramp < 0.f ? 0.f : (ramp > 1.f ? 1.f : ramp);
  const float extrap = 1.f - ramp;  // inv_freq_extrapolation_factor
  const float interp = 1.f / (r.factor * pos_freq);
  return interp * (1.f - extrap) + base * extrap;
}

// Partner index and sign of dim j (< rotary_dim) of a head: out[j] = x[j] * cos + s * x[p] * sin
// with angle index f.
MS_HOST_DEVICE inline void rope_pair(RopeStyle style, int rotary_dim, int j, int* partner, float* sign, int* f) {
  if (style == RopeStyle::NeoX) {
    const int half = rotary_dim / 2;
    *f = j < half ? j : j - half;
    *partner = j < half ? j + half : j - half;
    *sign = j < half ? -1.f : 1.f;
  } else {
    *f = j / 2;
    *partner = j ^ 1;
    *sign = (j & 1) ? 1.f : -1.f;
  }
}

// ---- KV cache layout ----
// What one rank's paged KV cache holds per model layer: K [blocks, block_size, kv_heads,
// k_head_dim] and V [..., v_head_dim]. MLA (DeepSeek-V3 family) describes its latent cache as
// one "head" of kv_lora_rank + qk_rope_head_dim values and no V (v_head_dim 0).
struct KvLayout {
  int num_layers = 0;
  int kv_heads = 0;  // local (this rank)
  int k_head_dim = 0;
  int v_head_dim = 0;
  // Bytes of one block of block_size tokens over all layers.
  int64_t bytes_per_block(int block_size, int64_t elem_bytes) const {
    return int64_t(num_layers) * block_size * kv_heads * (int64_t(k_head_dim) + v_head_dim) * elem_bytes;
  }
};

}  // namespace moeserve
