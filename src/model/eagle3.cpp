#include "model/eagle3.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "core/error.h"
#include "core/log.h"
#include "model/config_json.h"
#include "model/weights.h"

namespace moeserve {
namespace {

using namespace config_json;

constexpr const char* kWhat = "--speculative-config method \"eagle3\"";
const std::vector<DType> kFloat{DType::BF16, DType::F16, DType::F32};

// Host F32 columns [c0, c0 + n) of a host matrix [rows, cols].
Tensor columns(const Tensor& t, int64_t c0, int64_t n) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  std::vector<float> all(size_t(rows * cols));
  convert_to_f32(t.dtype, t.data, all.data(), all.size());
  Tensor out = Tensor::host(DType::F32, {rows, n});
  for (int64_t r = 0; r < rows; ++r)
    std::copy(all.begin() + r * cols + c0, all.begin() + r * cols + c0 + n, out.ptr<float>() + r * n);
  return out;
}

const json* find_key(const json& j, const char* key) {
  if (j.contains(key) && !j[key].is_null()) return &j[key];
  if (j.contains("eagle_config") && j["eagle_config"].is_object() && j["eagle_config"].contains(key) &&
      !j["eagle_config"][key].is_null())
    return &j["eagle_config"][key];
  return nullptr;
}

}  // namespace

Eagle3Config Eagle3Config::from_dir(const std::string& dir, const ModelDesc& target) {
  const std::string path = (std::filesystem::path(dir) / "config.json").string();
  MS_CHECK(std::filesystem::exists(path), "{}: no config.json in draft directory '{}'", kWhat, dir);
  const json j = read_file(path);
  const auto arch = j.value("architectures", json::array());
  MS_CHECK(arch.is_array() && !arch.empty() && arch[0] == "LlamaForCausalLMEagle3",
           "{}: {} is not an EAGLE-3 draft (architectures {}, expected [\"LlamaForCausalLMEagle3\"])", kWhat, path,
           arch.dump());
  Eagle3Config c;
  c.hidden_size = get_int(j, "hidden_size");
  c.target_hidden_size = get_int(j, "target_hidden_size", c.hidden_size);
  c.num_attention_heads = get_int(j, "num_attention_heads");
  c.num_key_value_heads = get_int(j, "num_key_value_heads", c.num_attention_heads);
  c.head_dim = get_int(j, "head_dim", c.hidden_size / std::max(1, c.num_attention_heads));
  c.intermediate_size = get_int(j, "intermediate_size");
  c.vocab_size = get_int(j, "vocab_size");
  c.draft_vocab_size = get_int(j, "draft_vocab_size", c.vocab_size);
  c.rms_norm_eps = get_double(j, "rms_norm_eps", 1e-6);
  c.rope_theta = get_double(j, "rope_theta", 10000.0);
  MS_CHECK(get_int(j, "num_hidden_layers", 1) == 1, "{}: {}: num_hidden_layers {} (one midlayer is supported)", kWhat,
           path, get_int(j, "num_hidden_layers", 1));
  MS_CHECK(c.vocab_size == target.vocab_size, "{}: the draft's vocab_size {} differs from the target's {} ({})", kWhat,
           c.vocab_size, target.vocab_size, path);
  MS_CHECK(c.target_hidden_size == target.hidden_size,
           "{}: the draft's target_hidden_size {} differs from the target's hidden_size {} ({})", kWhat,
           c.target_hidden_size, target.hidden_size, path);
  MS_CHECK(c.draft_vocab_size >= 1 && c.draft_vocab_size <= c.vocab_size, "{}: draft_vocab_size {} outside [1, {}]",
           kWhat, c.draft_vocab_size, c.vocab_size);
  MS_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
           "{}: {} attention heads over {} KV heads", kWhat, c.num_attention_heads, c.num_key_value_heads);
  if (const json* u = find_key(j, "use_aux_hidden_state"))
    MS_CHECK(u->is_boolean() && u->get<bool>(), "{}: use_aux_hidden_state false (an EAGLE-1-style head) is not supported",
             kWhat);
  const int L = target.num_layers;
  if (const json* ids = find_key(j, "eagle_aux_hidden_state_layer_ids")) {
    MS_CHECK(ids->is_array() && ids->size() == 3, "{}: eagle_aux_hidden_state_layer_ids must list 3 layers, got {}",
             kWhat, ids->dump());
    for (const auto& v : *ids) {
      MS_CHECK(v.is_number_integer(), "{}: eagle_aux_hidden_state_layer_ids {}: not integers", kWhat, ids->dump());
      c.layer_ids.push_back(v.get<int>());
    }
  }
  const std::vector<int> vllm_default{2, L / 2, L - 3};
  if (const json* conv = find_key(j, "eagle_aux_hidden_state_convention")) {
    MS_CHECK(conv->is_string(), "{}: eagle_aux_hidden_state_convention must be a string", kWhat);
    c.convention = conv->get<std::string>();
    MS_CHECK(c.convention == "input_of_layer" || c.convention == "output_of_layer",
             "{}: eagle_aux_hidden_state_convention \"{}\": expected \"input_of_layer\" (id b = the residual stream "
             "entering layer b, vLLM's reading) or \"output_of_layer\" (id i = the output of layer i, SpecForge / "
             "SGLang)",
             kWhat, c.convention);
    MS_CHECK(!c.layer_ids.empty(), "{}: eagle_aux_hidden_state_convention without eagle_aux_hidden_state_layer_ids",
             kWhat);
  } else if (c.layer_ids.empty()) {
    c.layer_ids = vllm_default;  // vLLM's default taps (boundaries)
  } else if (c.layer_ids != vllm_default) {
    fail("{}: {}: eagle_aux_hidden_state_layer_ids [{}, {}, {}] are ambiguous: vLLM reads id b as the residual "
         "stream entering layer b, SpecForge / SGLang as the output of layer b (one layer later; vllm#43671). Add "
         "\"eagle_aux_hidden_state_convention\": \"input_of_layer\" or \"output_of_layer\" to the draft's config.json "
         "(the convention its training captured with)",
         kWhat, path, c.layer_ids[0], c.layer_ids[1], c.layer_ids[2]);
  }
  for (int id : c.layer_ids) {
    const int b = c.convention == "output_of_layer" ? id + 1 : id;
    MS_CHECK(b >= 0 && b <= L, "{}: tap {} ({}) is boundary {}, outside the target's [0, {}] ({} layers)", kWhat, id,
             c.convention.empty() ? "vLLM default" : c.convention, b, L, L);
    c.boundaries.push_back(b);
  }
  return c;
}

Eagle3Head::Eagle3Head(Eagle3Config cfg, Backend& backend, const Tensor& target_embed)
    : cfg_(std::move(cfg)), be_(backend), embed_(target_embed) {}

void Eagle3Head::load(const Checkpoint& ckpt) {
  const int64_t H = cfg_.hidden_size, Ht = cfg_.target_hidden_size, D = cfg_.head_dim, I = cfg_.intermediate_size;
  const int64_t Hq = int64_t(cfg_.num_attention_heads) * D, Hkv = int64_t(cfg_.num_key_value_heads) * D;
  const int64_t V = cfg_.vocab_size, Vd = cfg_.draft_vocab_size;
  const std::string m = "midlayer.";
  const std::vector<WeightDecl> decls = {
      {"fc.weight", {H, 3 * Ht}, kFloat, {}},
      {m + "input_layernorm.weight", {H}, kFloat, {}},
      {m + "hidden_norm.weight", {H}, kFloat, {}},
      {m + "self_attn.q_proj.weight", {Hq, 2 * H}, kFloat, {}},
      {m + "self_attn.k_proj.weight", {Hkv, 2 * H}, kFloat, {}},
      {m + "self_attn.v_proj.weight", {Hkv, 2 * H}, kFloat, {}},
      {m + "self_attn.o_proj.weight", {H, Hq}, kFloat, {}},
      {m + "post_attention_layernorm.weight", {H}, kFloat, {}},
      {m + "mlp.gate_proj.weight", {I, H}, kFloat, {}},
      {m + "mlp.up_proj.weight", {I, H}, kFloat, {}},
      {m + "mlp.down_proj.weight", {H, I}, kFloat, {}},
      {"norm.weight", {H}, kFloat, {}},
      {"lm_head.weight", {Vd, H}, kFloat, {}},
  };
  std::map<std::string, Tensor> got;
  for (const auto& d : decls) {
    MS_CHECK(ckpt.contains(d.name), "{}: draft checkpoint {} has no tensor '{}'", kWhat, ckpt.dir(), d.name);
    got[d.name] = load_weight(ckpt, d, QuantizationConfig{}).tensor;  // throws naming shape / dtype problems
  }
  // d2t: draft id -> target id offset; every mapped id must be a target token.
  MS_CHECK(ckpt.contains("d2t") || Vd == V, "{}: draft checkpoint {} has no tensor 'd2t' (draft vocabulary {} < {})",
           kWhat, ckpt.dir(), Vd, V);
  d2t_.assign(size_t(Vd), 0);
  if (ckpt.contains("d2t")) {
    const Tensor t = ckpt.get("d2t");
    MS_CHECK((t.dtype == DType::I64 || t.dtype == DType::I32) && t.shape == Shape({Vd}),
             "{}: tensor 'd2t' is {} {}, expected I64 [{}]", kWhat, dtype_name(t.dtype), shape_str(t.shape), Vd);
    for (int64_t i = 0; i < Vd; ++i) {
      const int64_t off = t.dtype == DType::I64 ? t.ptr<int64_t>()[i] : t.ptr<int32_t>()[i];
      MS_CHECK(i + off >= 0 && i + off < V, "{}: tensor 'd2t' maps draft id {} to {}, outside the vocabulary [0, {})",
               kWhat, i, i + off, V);
      d2t_[size_t(i)] = int32_t(off);
    }
  }
  if (ckpt.contains("t2d")) {  // optional: must agree with d2t
    const Tensor t = ckpt.get("t2d");
    MS_CHECK((t.dtype == DType::BOOL || t.dtype == DType::U8) && t.shape == Shape({V}),
             "{}: tensor 't2d' is {} {}, expected BOOL [{}]", kWhat, dtype_name(t.dtype), shape_str(t.shape), V);
    const auto* b = static_cast<const uint8_t*>(t.data);
    for (int64_t i = 0; i < Vd; ++i)
      MS_CHECK(b[i + d2t_[size_t(i)]], "{}: tensors 'd2t' and 't2d' disagree: draft id {} maps to {}, not in t2d",
               kWhat, i, i + d2t_[size_t(i)]);
  }
  if (ckpt.contains("embed_tokens.weight")) {
    embed_ = be_.upload(load_weight(ckpt, {"embed_tokens.weight", {V, H}, kFloat, {}}, {}).tensor);
  } else {
    MS_CHECK(embed_.defined() && embed_.dim(0) == V && embed_.dim(1) == H,
             "{}: the draft ships no 'embed_tokens.weight' and its hidden size {} differs from the target's embedding",
             kWhat, H);
  }
  const bool bf16 = be_.activation_dtype() == DType::BF16;
  auto host = [&](const Tensor& t) {
    if (!bf16 || t.dtype == DType::BF16) return t;
    std::vector<float> f(size_t(t.numel()));
    convert_to_f32(t.dtype, t.data, f.data(), f.size());
    Tensor b = Tensor::host(DType::BF16, t.shape);
    for (size_t i = 0; i < f.size(); ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(f[i]);
    return b;
  };
  auto up = [&](const Tensor& t) { return be_.upload(host(t)); };
  auto lin = [&](const Tensor& t) { return LinearWeight{up(t), {}, 0, 0}; };
  const Tensor& fc = got.at("fc.weight");
  fc_.clear();
  for (int i = 0; i < 3; ++i) fc_.push_back(lin(columns(fc, i * Ht, Ht)));
  in_norm_ = up(got.at(m + "input_layernorm.weight"));
  hid_norm_ = up(got.at(m + "hidden_norm.weight"));
  post_norm_ = up(got.at(m + "post_attention_layernorm.weight"));
  norm_ = up(got.at("norm.weight"));
  auto halves = [&](const std::string& n, LinearWeight& e, LinearWeight& h) {
    const Tensor& w = got.at(m + n);
    e = lin(columns(w, 0, H));  // the embedding half comes first in cat(embed, hidden)
    h = lin(columns(w, H, H));
  };
  halves("self_attn.q_proj.weight", q_e_, q_h_);
  halves("self_attn.k_proj.weight", k_e_, k_h_);
  halves("self_attn.v_proj.weight", v_e_, v_h_);
  o_ = lin(got.at(m + "self_attn.o_proj.weight"));
  mlp_ = {lin(got.at(m + "mlp.gate_proj.weight")), lin(got.at(m + "mlp.up_proj.weight")),
          lin(got.at(m + "mlp.down_proj.weight"))};
  lm_head_ = lin(got.at("lm_head.weight"));
  spdlog::info("EAGLE-3 draft {}: hidden {}, {} heads / {} KV heads, draft vocabulary {}, taps at layer boundaries "
               "[{}, {}, {}]",
               ckpt.dir(), H, cfg_.num_attention_heads, cfg_.num_key_value_heads, Vd, cfg_.boundaries[0],
               cfg_.boundaries[1], cfg_.boundaries[2]);
}

void Eagle3Head::reserve(int64_t T, int64_t R) {
  const DType act = be_.activation_dtype();
  const int64_t H = cfg_.hidden_size, D = cfg_.head_dim;
  if (R > max_r_) {  // the logits rows only (the [T] buffers may be a caller's input)
    R = std::max(R, int64_t(16));
    sel_ = be_.alloc(act, {R, H});
    logits_ = be_.alloc(act, {R, cfg_.draft_vocab_size});
    max_r_ = R;
  }
  if (T <= max_t_) return;
  T = std::max(T, int64_t(64));
  const int64_t Hq = int64_t(cfg_.num_attention_heads) * D, Hkv = int64_t(cfg_.num_key_value_heads) * D;
  g_ = be_.alloc(act, {T, H});
  tmp_h_ = be_.alloc(act, {T, H});
  xe_ = be_.alloc(act, {T, H});
  xh_ = be_.alloc(act, {T, H});
  q_ = be_.alloc(act, {T, Hq});
  tmp_q_ = be_.alloc(act, {T, Hq});
  k_ = be_.alloc(act, {T, Hkv});
  v_ = be_.alloc(act, {T, Hkv});
  tmp_kv_ = be_.alloc(act, {T, Hkv});
  attn_ = be_.alloc(act, {T, Hq});
  o_out_ = be_.alloc(act, {T, H});
  resid_ = be_.alloc(act, {T, H});
  h_ = be_.alloc(act, {T, H});
  gate_ = be_.alloc(act, {T, cfg_.intermediate_size});
  up_ = be_.alloc(act, {T, cfg_.intermediate_size});
  m_ = be_.alloc(act, {T, H});
  xn_ = be_.alloc(act, {T, H});
  max_t_ = T;
}

Tensor Eagle3Head::fc(const std::vector<Tensor>& taps) {
  MS_CHECK(taps.size() == 3, "EAGLE-3 fc: {} taps", taps.size());
  const int64_t T = taps[0].dim(0);
  reserve(T, 0);
  Tensor g = g_.slice_rows(0, T), tmp = tmp_h_.slice_rows(0, T);
  be_.linear(taps[0], fc_[0], g);
  for (int i = 1; i < 3; ++i) {
    be_.linear(taps[size_t(i)], fc_[size_t(i)], tmp);
    be_.add(g, tmp, g);
  }
  return g;
}

Tensor Eagle3Head::step(const Eagle3StepArgs& a) {
  const int64_t T = a.meta->num_tokens, R = a.rows && a.rows->defined() ? a.rows->numel() : 0;
  // a.g may be fc's output (a view of g_): growing the [T] buffers would move it.
  MS_CHECK(T <= max_t_ || a.g->data != g_.data, "EAGLE-3 step: {} rows after fc reserved {}", T, max_t_);
  reserve(T, R);
  const float eps = float(cfg_.rms_norm_eps);
  auto rows = [T](const Tensor& t) { return t.slice_rows(0, T); };
  Tensor xe = rows(xe_), xh = rows(xh_), q = rows(q_), k = rows(k_), v = rows(v_), tq = rows(tmp_q_);
  Tensor tkv = rows(tmp_kv_), attn = rows(attn_), o = rows(o_out_), resid = rows(resid_), h = rows(h_);
  Tensor gate = rows(gate_), up = rows(up_), mo = rows(m_), xn = rows(xn_), tmp = rows(tmp_h_);
  be_.embedding(embed_, *a.ids, tmp);
  be_.rms_norm(tmp, in_norm_, eps, xe);
  be_.rms_norm(*a.g, hid_norm_, eps, xh);
  // q/k/v over cat(xe, xh): the sum of the two column halves.
  be_.linear(xe, q_e_, q);
  be_.linear(xh, q_h_, tq);
  be_.add(q, tq, q);
  be_.linear(xe, k_e_, k);
  be_.linear(xh, k_h_, tkv);
  be_.add(k, tkv, k);
  be_.linear(xe, v_e_, v);
  be_.linear(xh, v_h_, tkv);
  be_.add(v, tkv, v);
  // Llama RoPE over the whole head (rotate-half), no QK-norm; K/V written at the meta's slots.
  QkNormRopeArgs qa;
  qa.q = &q;
  qa.k = &k;
  qa.positions = &a.meta->positions;
  qa.rope = RopeSpec{cfg_.head_dim, cfg_.head_dim, float(cfg_.rope_theta)};
  qa.eps = eps;
  qa.norm = QkNormMode::None;
  AttentionArgs aa;
  aa.q = &q;
  aa.kv = a.kv;
  aa.meta = a.meta;
  aa.num_q_heads = cfg_.num_attention_heads;
  aa.num_kv_heads = cfg_.num_key_value_heads;
  aa.head_dim = cfg_.head_dim;
  aa.scale = float(1.0 / std::sqrt(double(cfg_.head_dim)));
  aa.out = &attn;
  be_.qk_norm_rope_attention(qa, v, *a.kv, *a.meta, aa);
  be_.linear(attn, o_, o);
  be_.add(*a.g, o, resid);                              // resid = g + attention
  be_.rms_norm(resid, post_norm_, eps, h);
  be_.dense_mlp(h, mlp_, gate, up, mo);
  be_.add_rms_norm(resid, mo, norm_, eps, xn);          // resid = prenorm; xn = norm(prenorm)
  prenorm_ = resid;
  if (R == 0) return {};
  Tensor sel = sel_.slice_rows(0, R), logits = logits_.slice_rows(0, R);
  be_.embedding(xn, *a.rows, sel);
  be_.linear(sel, lm_head_, logits);
  return logits;
}

}  // namespace moeserve
