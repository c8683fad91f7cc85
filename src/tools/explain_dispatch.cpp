// bench-model --explain-dispatch: the kernel selectors evaluated for a model's ops.
#include "tools/explain_dispatch.h"

#include <fmt/format.h>

#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/cuda/attention/select_attention.h"
#include "backend/cuda/common/tuning.h"
#include "backend/cuda/linear/select_linear.h"
#include "backend/cuda/moe/select_moe.h"
#include "backend/cuda/norm_rope/select_norm_rope.h"
#include "backend/cuda/sampling/select_sampling.h"
#include "core/debug_flags.h"
#include "core/error.h"
#include "model/arch/minimax_m2.h"
#include "tools/bench_step.h"

namespace moeserve::tools {
using namespace cuda;

namespace {

// graph_buckets(256) (runtime/decode_plan.h; test_explain_dispatch checks they agree).
const std::vector<int> kDecodeBuckets = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
const std::vector<int> kPrefillSizes = {512, 1024, 2048, 4096, 8192};
constexpr int kDecodeContext = 8192, kBlockSize = 16;

struct Row {
  std::string op, phase;
  int tokens = 0;
  std::string kernel;
};

// What the explain needs of a model: its shapes and each weight group's storage.
struct Shapes {
  ModelDesc d;
  bool mla = false;
  LinearWeightDesc lin;   // attention / shared / dense linears (FP8 blocks or bf16)
  bool experts_fp8 = false, experts_int4 = false;
  int expert_bo = 128, expert_bi = 128;
  bool shared_fp8 = false, dense_fp8 = false;
  bool sigmoid_renorm = true;
  int n_group = 1, topk_group = 1;  // DeepSeek-V3 family's grouped routing
  bool qk_fast = true;  // full-width QK-norm with plain NeoX RoPE (MiniMax-M2)
};

Shapes shapes_of_model(const std::string& name) {
  SyntheticModel m = synthetic_model(name, 4);
  Shapes s;
  s.d = m.config->desc();
  const ModelDesc& d = s.d;
  const QuantizationConfig& q = d.quantization;
  s.mla = d.kv_lora_rank > 0;
  s.lin.fp8 = q.fp8();
  if (q.fp8()) s.lin.bo = q.block_out, s.lin.bi = q.block_in;
  s.experts_fp8 = s.shared_fp8 = s.dense_fp8 = q.fp8();
  if (q.fp8()) s.expert_bo = q.block_out, s.expert_bi = q.block_in;
  if (q.int4()) {  // compressed-tensors: routed experts INT4, the rest (attention, shared, dense) bf16
    MS_CHECK(!q.int4_groups.empty(), "explain-dispatch: INT4 config without groups");
    s.experts_int4 = true, s.expert_bo = 1, s.expert_bi = q.int4_groups[0].group_size;
  }
  if (const auto* mm = dynamic_cast<const MiniMaxM2Config*>(m.config.get())) {
    const DecoderSpec spec = mm->decoder_spec();
    s.sigmoid_renorm = spec.route.sigmoid_renorm();
    s.qk_fast = spec.qk_norm == QkNormMode::FullWidth && spec.rope.plain();
  } else {
    // DeepSeek-V3 / Kimi-K2.5 (deepseek_v3.cpp): Sigmoid, n_group / topk_group, norm_topk_prob,
    // routed_scaling_factor; MLA has its own RoPE kernels (no QK-norm).
    nlohmann::json j = m.config->to_json();
    if (j.contains("text_config")) j = j["text_config"];
    RoutingSpec r{RouteScoring::Sigmoid, j.value("n_group", 1), j.value("topk_group", 1),
                  j.value("norm_topk_prob", true), float(j.value("routed_scaling_factor", 1.0))};
    s.sigmoid_renorm = r.sigmoid_renorm();
    s.n_group = r.n_group, s.topk_group = r.topk_group;
    s.qk_fast = false;
  }
  return s;
}

WorkspaceView ws_of(bool decode) {
  WorkspaceView w;  // reserved workspaces (reserve() / the bucket's warm-up): everything fits
  w.capturing = decode;
  return w;
}

LinearWeightDesc weight(const LinearWeightDesc& kind, int N) {
  LinearWeightDesc w = kind;
  w.N = N;
  return w;
}
LinearWeightDesc bf16_weight(int N) {
  LinearWeightDesc w;
  w.N = N, w.fp8 = false;
  return w;
}

std::string linear_single(const LinearWeightDesc& w, int T, int K, bool decode, const DeviceCaps& c,
                          const CudaTuning& t) {
  LinearOpDesc d;
  d.op = LinearOp::kLinear, d.T = T, d.K = K, d.n = 1, d.w[0] = w, d.ws = ws_of(decode);
  return select_linear(d, c, t).describe(T);
}

std::string linear_multi(LinearOp op, const std::vector<LinearWeightDesc>& ws, int T, int K, bool decode,
                         const DeviceCaps& c, const CudaTuning& t) {
  LinearOpDesc d;
  d.op = op, d.T = T, d.K = K, d.n = int(ws.size()), d.ws = ws_of(decode);
  for (size_t i = 0; i < ws.size(); ++i) d.w[i] = ws[i];
  const LinearKernel k = select_linear(d, c, t);
  if (k.id == LinearKernel::kUnfused) return "rms_norm+" + linear_multi(LinearOp::kMulti, ws, T, K, decode, c, t);
  if (k.id == LinearKernel::kPerWeight) {
    std::string s = "per_weight(";
    for (size_t i = 0; i < ws.size(); ++i) s += (i ? "," : "") + linear_single(ws[i], T, K, decode, c, t);
    return s + ")" + (k.capture_fallback ? "[capture_fallback]" : "");
  }
  return k.describe(T);
}

std::string attention_row(const Shapes& s, int T, bool decode, const DeviceCaps& c, const CudaTuning& t) {
  const ModelDesc& d = s.d;
  AttentionOpDesc a;
  a.T = T, a.num_seqs = decode ? T : 1, a.max_query_len = decode ? 1 : T;
  a.max_context_len = decode ? kDecodeContext : T;
  a.Hq = d.num_attention_heads, a.Hkv = d.num_key_value_heads, a.D = d.head_dim, a.block_size = kBlockSize;
  a.ws = ws_of(decode);
  DecodeAttnOpDesc q;
  q.attn = a, q.fast_spec = s.qk_fast;
  q.rope_head_dim = d.head_dim, q.rotary_dim = d.rotary_dim;
  q.q_width = a.Hq * d.head_dim, q.k_width = a.Hkv * d.head_dim, q.qk_T = T;
  const AttentionKernel k = select_decode_attention(q, c, t);
  if (k.id != AttentionKernel::kUnfused) return k.describe();
  QkNormRopeOpDesc n;
  n.T = T, n.fast_spec = s.qk_fast, n.write_kv = true, n.head_dim = d.head_dim, n.rotary_dim = d.rotary_dim;
  n.q_width = q.q_width, n.k_width = q.k_width;
  return fmt::format("qk_norm_rope_write_kv[{}]+{}", select_qk_norm_rope(n, c, t).describe(),
                     select_attention(a, c, t).describe());
}

std::string mla_row(const Shapes& s, int T, bool decode, const DeviceCaps& c, const CudaTuning& t) {
  const ModelDesc& d = s.d;
  MlaOpDesc m;
  m.T = T, m.num_seqs = decode ? T : 1, m.max_query_len = decode ? 1 : T;
  m.max_context_len = decode ? kDecodeContext : T;
  m.H = d.num_attention_heads, m.nope = d.head_dim - d.rotary_dim, m.R = d.rotary_dim, m.C = d.kv_lora_rank;
  m.V = d.v_head_dim, m.ws = ws_of(decode);
  return select_mla(m, c, t).describe();
}

std::vector<Row> rows_for(const std::string& model, const std::string& profile) {
  const Shapes s = shapes_of_model(model);
  const ModelDesc& d = s.d;
  const DeviceCaps c = device_profile(profile);
  CudaTuning t;
  t.apply_debug_flags(debug_flags());
  const int H = d.hidden_size;
  std::vector<Row> out;
  auto each = [&](const std::string& op, const std::function<std::string(int, bool)>& f) {
    for (int B : kDecodeBuckets) out.push_back({op, "decode", B, f(B, true)});
    for (int T : kPrefillSizes) out.push_back({op, "prefill", T, f(T, false)});
  };
  if (!s.mla) {
    const int Hq = d.num_attention_heads, Hkv = d.num_key_value_heads, D = d.head_dim;
    each("qkv", [&](int T, bool dec) {
      return linear_multi(LinearOp::kNormMulti, {weight(s.lin, Hq * D), weight(s.lin, Hkv * D), weight(s.lin, Hkv * D)},
                          T, H, dec, c, t);
    });
    each("attention", [&](int T, bool dec) { return attention_row(s, T, dec, c, t); });
    each("o_proj", [&](int T, bool dec) { return linear_single(weight(s.lin, H), T, Hq * D, dec, c, t); });
  } else {
    const int Hh = d.num_attention_heads, nope = d.head_dim - d.rotary_dim, R = d.rotary_dim, C = d.kv_lora_rank;
    const int qk = nope + R;
    if (d.q_lora_rank > 0) {
      each("q_a+kv_a", [&](int T, bool dec) {
        return linear_multi(LinearOp::kNormMulti, {weight(s.lin, d.q_lora_rank), weight(s.lin, C + R)}, T, H, dec, c, t);
      });
      each("q_b", [&](int T, bool dec) { return linear_single(weight(s.lin, Hh * qk), T, d.q_lora_rank, dec, c, t); });
    } else {
      each("q+kv_a", [&](int T, bool dec) {
        return linear_multi(LinearOp::kNormMulti, {weight(s.lin, Hh * qk), weight(s.lin, C + R)}, T, H, dec, c, t);
      });
    }
    each("mla_attention", [&](int T, bool dec) { return mla_row(s, T, dec, c, t); });
    each("o_proj", [&](int T, bool dec) { return linear_single(weight(s.lin, H), T, Hh * d.v_head_dim, dec, c, t); });
  }
  each("router", [&](int T, bool dec) {
    MoeRouteOpDesc r;
    r.T = T, r.H = H, r.E = d.num_experts, r.top_k = d.experts_per_token, r.sigmoid_renorm = s.sigmoid_renorm;
    r.n_group = s.n_group, r.topk_group = s.topk_group;
    r.with_norm = true, r.experts_fp8 = s.experts_fp8, r.ws = ws_of(dec);
    return select_moe_route(r, c, t).describe();
  });
  each("experts", [&](int T, bool dec) {
    MoeExpertsOpDesc e;
    e.T = T, e.top_k = d.experts_per_token, e.H = H, e.I = d.expert_intermediate_size, e.E_local = d.num_experts;
    e.fp8 = s.experts_fp8, e.int4 = s.experts_int4, e.bo = s.expert_bo, e.bi = s.expert_bi;
    // FP8 experts at prefill read the FP8 x the fused post-attention norm made (router row).
    MoeRouteOpDesc r;
    r.T = T, r.H = H, r.E = d.num_experts, r.top_k = d.experts_per_token, r.with_norm = true;
    r.sigmoid_renorm = s.sigmoid_renorm, r.experts_fp8 = s.experts_fp8, r.ws = ws_of(dec);
    r.n_group = s.n_group, r.topk_group = s.topk_group;
    e.prequant = select_moe_route(r, c, t).norm == MoeRouteKernel::kNormQuant;
    e.ws = ws_of(dec);
    return select_moe_experts(e, c, t).describe();
  });
  const LinearWeightDesc shared_kind = s.shared_fp8 ? s.lin : bf16_weight(0);
  if (d.num_shared_experts > 0) {
    const int I = d.shared_expert_intermediate_size;
    each("shared_gate_up", [&](int T, bool dec) { return linear_single(weight(shared_kind, I), T, H, dec, c, t); });
    each("shared_down", [&](int T, bool dec) { return linear_single(weight(shared_kind, H), T, I, dec, c, t); });
  }
  if (d.num_dense_layers > 0) {
    const int I = d.dense_intermediate_size;
    const LinearWeightDesc dk = s.dense_fp8 ? s.lin : bf16_weight(0);
    each("dense_gate_up", [&](int T, bool dec) { return linear_single(weight(dk, I), T, H, dec, c, t); });
    each("dense_down", [&](int T, bool dec) { return linear_single(weight(dk, H), T, I, dec, c, t); });
  }
  // lm_head (bf16, logits in the activation dtype) and sampling: one row per sequence.
  each("lm_head", [&](int T, bool dec) { return linear_single(bf16_weight(d.vocab_size), dec ? T : 1, H, dec, c, t); });
  each("sample", [&](int T, bool dec) {
    SampleOpDesc sd;
    sd.rows = dec ? T : 1, sd.vocab = d.vocab_size, sd.max_resident = c.sample_resident;
    return select_sample(sd, c, t).describe();
  });
  return out;
}

std::string caps_line(const DeviceCaps& c) {
  return fmt::format("code arch {}{}, cc {}, {} SMs, attention wgmma {}, fp8 wgmma {}, sampling {} resident blocks",
                     c.code_arch, c.sm90a ? " (sm_90a)" : "", c.cc, c.num_sms, c.attn_wgmma ? "yes" : "no",
                     c.fp8_wgmma ? "yes" : "no", c.sample_resident);
}

}  // namespace

const std::vector<std::string>& explain_dispatch_models() {
  static const std::vector<std::string> m = {"minimax-m2.5", "kimi-k2.5", "deepseek-v3"};
  return m;
}
const std::vector<std::string>& explain_dispatch_profiles() {
  static const std::vector<std::string> p = {"h200", "sm120"};
  return p;
}

std::string explain_dispatch(const std::string& model, const std::string& profile) {
  const DeviceCaps c = device_profile(profile);
  std::string s = fmt::format("# moeserve bench-model --explain-dispatch --synthetic {} --device-profile {}\n", model,
                              profile);
  s += fmt::format("# device {}: {}\n", profile, caps_line(c));
  s += fmt::format("# decode: B sequences x 1 token at context {} in a captured graph (buckets 1..256); prefill: one "
                   "sequence of T tokens, eager; KV bf16, blocks of {}; CudaTuning defaults\n",
                   kDecodeContext, kBlockSize);
  s += fmt::format("{:<15} {:<8} {:>6}  {}\n", "op", "phase", "tokens", "kernel");
  for (const Row& r : rows_for(model, profile))
    s += fmt::format("{:<15} {:<8} {:>6}  {}\n", r.op, r.phase, r.tokens, r.kernel);
  return s;
}

std::string explain_dispatch_markdown() {
  std::string s = std::string(kExplainBegin) + "\n\n";
  s += "Kernel per op, from the selectors (`bench-model --explain-dispatch`; the golden files in\n"
       "tests/fixtures/dispatch/ hold every bucket). Decode: B sequences of one token at context 8192 in a\n"
       "captured graph; prefill: one sequence of T tokens. Runs of buckets with the same choice are merged.\n";
  for (const std::string& m : explain_dispatch_models())
    for (const std::string& p : explain_dispatch_profiles()) {
      s += fmt::format("\n**{} on {}** ({})\n\n| op | phase | tokens | kernel |\n|---|---|---|---|\n", m, p,
                       caps_line(device_profile(p)));
      const std::vector<Row> rows = rows_for(m, p);
      for (size_t i = 0; i < rows.size();) {
        size_t j = i;
        while (j + 1 < rows.size() && rows[j + 1].op == rows[i].op && rows[j + 1].phase == rows[i].phase &&
               rows[j + 1].kernel == rows[i].kernel)
          ++j;
        const std::string range = i == j ? std::to_string(rows[i].tokens)
                                         : fmt::format("{}-{}", rows[i].tokens, rows[j].tokens);
        s += fmt::format("| {} | {} | {} | `{}` |\n", rows[i].op, rows[i].phase, range, rows[i].kernel);
        i = j + 1;
      }
    }
  s += "\n" + std::string(kExplainEnd) + "\n";
  return s;
}

}  // namespace moeserve::tools
