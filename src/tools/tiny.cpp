#include "tools/tiny.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/safetensors.h"

namespace moeserve {

// Embedded at build time from assets/tiny-tokenizer/ (see src/tools/CMakeLists.txt).
std::string_view tiny_tokenizer_json();
std::string_view tiny_tokenizer_config_json();

namespace {
constexpr int kTinyTokenizerVocab = 2009;  // 2000 BPE tokens + 9 MiniMax added tokens

void write_text(const std::filesystem::path& p, std::string_view text) {
  std::ofstream f(p, std::ios::binary);
  MS_CHECK(f.good(), "cannot write {}", p.string());
  f.write(text.data(), std::streamsize(text.size()));
  MS_CHECK(f.good(), "failed writing {}", p.string());
}
}  // namespace
namespace {

// A portable seeded normal generator (splitmix64 + Box-Muller), so checkpoints are the
// same on every platform and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 0x9E3779B97F4A7C15ull + 0x1234567ull) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return (double(next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); }  // (0, 1)
  float normal() {
    if (have_) {
      have_ = false;
      return spare_;
    }
    double u = uniform(), v = uniform(), r = std::sqrt(-2.0 * std::log(u));
    spare_ = float(r * std::sin(2 * M_PI * v));
    have_ = true;
    return float(r * std::cos(2 * M_PI * v));
  }

 private:
  uint64_t s_;
  bool have_ = false;
  float spare_ = 0;
};

struct Builder {
  Rng rng;
  const TinyModelOptions& o;
  std::vector<NamedTensor> out;

  std::vector<float> draw(int64_t n, float mean, float sd) {
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = mean + sd * rng.normal();
    return v;
  }
  void bf16(const std::string& name, Shape shape, float mean, float sd) {
    auto v = draw(shape_numel(shape), mean, sd);
    Tensor t = Tensor::host(DType::BF16, shape);
    for (size_t i = 0; i < v.size(); ++i) t.ptr<uint16_t>()[i] = f32_to_bf16(v[i]);
    out.push_back({name, t});
  }
  void f32(const std::string& name, Shape shape, float mean, float sd) {
    auto v = draw(shape_numel(shape), mean, sd);
    Tensor t = Tensor::host(DType::F32, shape);
    std::copy(v.begin(), v.end(), t.ptr<float>());
    out.push_back({name, t});
  }
  // A [rows, cols] linear weight, std 1/sqrt(cols): bf16, or FP8 with per-block f32 scales
  // (scale = block amax / 448, the multiplier stored as weight_scale_inv).
  void linear(const std::string& name, int64_t rows, int64_t cols) {
    const float sd = float(1.0 / std::sqrt(double(cols)));
    if (!o.fp8) return bf16(name, {rows, cols}, 0.f, sd);
    auto v = draw(rows * cols, 0.f, sd);
    const int64_t b = o.block_size, sr = (rows + b - 1) / b, sc = (cols + b - 1) / b;
    Tensor w = Tensor::host(DType::F8_E4M3, {rows, cols}), s = Tensor::host(DType::F32, {sr, sc});
    for (int64_t br = 0; br < sr; ++br)
      for (int64_t bc = 0; bc < sc; ++bc) {
        float amax = 0;
        for (int64_t r = br * b; r < std::min(rows, (br + 1) * b); ++r)
          for (int64_t c = bc * b; c < std::min(cols, (bc + 1) * b); ++c) amax = std::max(amax, std::fabs(v[r * cols + c]));
        const float scale = std::max(amax, 1e-12f) / 448.f;
        s.ptr<float>()[br * sc + bc] = scale;
        for (int64_t r = br * b; r < std::min(rows, (br + 1) * b); ++r)
          for (int64_t c = bc * b; c < std::min(cols, (bc + 1) * b); ++c)
            w.ptr<uint8_t>()[r * cols + c] = f32_to_fp8_e4m3(v[r * cols + c] / scale);
      }
    out.push_back({name, w});
    out.push_back({name + "_scale_inv", s});
  }
};

void write_json(const std::filesystem::path& p, const nlohmann::json& j) {
  std::ofstream f(p);
  MS_CHECK(f.good(), "cannot write {}", p.string());
  f << j.dump(2) << "\n";
}

}  // namespace

MiniMaxM2Config tiny_config(const TinyModelOptions& o) {
  MS_CHECK(o.hidden_size > 0 && o.num_layers > 0 && o.num_heads > 0 && o.num_kv_heads > 0 && o.head_dim > 0 &&
               o.intermediate_size > 0 && o.num_experts > 0 && o.vocab_size > 0,
           "make-tiny: sizes must be positive");
  MS_CHECK(!o.fp8 || o.block_size > 0, "make-tiny: --block-size must be positive");
  nlohmann::json j = {
      {"architectures", {"MiniMaxM2ForCausalLM"}},
      {"model_type", "minimax_m2"},
      {"hidden_size", o.hidden_size},
      {"num_hidden_layers", o.num_layers},
      {"num_attention_heads", o.num_heads},
      {"num_key_value_heads", o.num_kv_heads},
      {"head_dim", o.head_dim},
      {"rotary_dim", o.rotary_dim},
      {"rope_theta", 5000000.0},
      {"max_position_embeddings", o.max_position_embeddings},
      {"intermediate_size", o.intermediate_size},
      {"shared_intermediate_size", 0},
      {"num_local_experts", o.num_experts},
      {"num_experts_per_tok", o.top_k},
      {"scoring_func", "sigmoid"},
      {"use_routing_bias", true},
      {"use_qk_norm", true},
      {"qk_norm_type", "per_layer"},
      {"hidden_act", "silu"},
      {"rms_norm_eps", 1e-6},
      {"vocab_size", o.vocab_size},
      {"tie_word_embeddings", false},
      {"bos_token_id", o.bos_token_id},
      {"eos_token_id", o.eos_token_id},
      {"torch_dtype", "bfloat16"},
      {"use_mtp", o.num_mtp_modules > 0},
      {"num_mtp_modules", o.num_mtp_modules},
      {"mtp_transformer_layers", o.num_mtp_modules > 0 ? 1 : 0},
      {"use_cache", true},
  };
  if (o.fp8)
    j["quantization_config"] = {{"activation_scheme", "dynamic"},
                                {"fmt", "float8_e4m3fn"},
                                {"quant_method", "fp8"},
                                {"weight_block_size", {o.block_size, o.block_size}},
                                {"modules_to_not_convert", {"gate", "e_score_correction_bias", "lm_head"}}};
  MiniMaxM2Config c = MiniMaxM2Config::from_json(j);  // validates
  c.raw = c.to_json();
  return c;
}

void write_tiny_checkpoint(const std::string& dir, const TinyModelOptions& o) {
  const MiniMaxM2Config cfg = tiny_config(o);
  std::filesystem::create_directories(dir);
  Builder b{Rng(o.seed), o, {}};
  const int64_t H = o.hidden_size, D = o.head_dim, I = o.intermediate_size;
  const int64_t Hq = int64_t(o.num_heads) * D, Hkv = int64_t(o.num_kv_heads) * D;
  const float hs = float(1.0 / std::sqrt(double(H)));
  b.bf16("model.embed_tokens.weight", {o.vocab_size, H}, 0.f, 1.f);
  for (int l = 0; l < o.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    b.bf16(p + "input_layernorm.weight", {H}, 1.f, 0.1f);
    b.bf16(p + "post_attention_layernorm.weight", {H}, 1.f, 0.1f);
    b.linear(p + "self_attn.q_proj.weight", Hq, H);
    b.linear(p + "self_attn.k_proj.weight", Hkv, H);
    b.linear(p + "self_attn.v_proj.weight", Hkv, H);
    b.linear(p + "self_attn.o_proj.weight", H, Hq);
    b.bf16(p + "self_attn.q_norm.weight", {Hq}, 1.f, 0.1f);
    b.bf16(p + "self_attn.k_norm.weight", {Hkv}, 1.f, 0.1f);
    b.f32(p + "block_sparse_moe.gate.weight", {o.num_experts, H}, 0.f, 2.f * hs);
    b.f32(p + "block_sparse_moe.e_score_correction_bias", {o.num_experts}, 0.f, 0.1f);
    for (int e = 0; e < o.num_experts; ++e) {
      const std::string q = p + "block_sparse_moe.experts." + std::to_string(e) + ".";
      b.linear(q + "w1.weight", I, H);
      b.linear(q + "w3.weight", I, H);
      b.linear(q + "w2.weight", H, I);
    }
  }
  b.bf16("model.norm.weight", {H}, 1.f, 0.1f);
  b.bf16("lm_head.weight", {o.vocab_size, H}, 0.f, 2.f * hs);
  write_sharded_checkpoint(dir, b.out, o.max_shard_bytes);
  const std::filesystem::path d(dir);
  write_json(d / "config.json", cfg.to_json());
  write_json(d / "generation_config.json",
             {{"bos_token_id", o.bos_token_id}, {"eos_token_id", o.eos_token_id}, {"do_sample", false}});
  if (o.with_tokenizer) {
    MS_CHECK(o.vocab_size >= kTinyTokenizerVocab,
             "make-tiny: --vocab-size {} is smaller than the built-in tokenizer's {} tokens (or pass --no-tokenizer)",
             o.vocab_size, kTinyTokenizerVocab);
    write_text(d / "tokenizer.json", tiny_tokenizer_json());
    write_text(d / "tokenizer_config.json", tiny_tokenizer_config_json());
  }
}

}  // namespace moeserve
