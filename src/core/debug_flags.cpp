// The typed debug registry (debug_flags.h): the one place in src/ that reads MOESERVE_*
// variables from the process environment.
#include "core/debug_flags.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"

namespace moeserve {

namespace {
using T = DebugFlagType;

const char* type_name(T t) {
  switch (t) {
    case T::Bool: return "bool (0|1)";
    case T::Int: return "int";
    case T::List: return "comma list";
    case T::String: return "string";
  }
  return "?";
}

bool parse_bool(const DebugFlagSpec& s, const std::string& v) {
  if (v == "1" || v == "true" || v == "on") return true;
  if (v == "0" || v == "false" || v == "off") return false;
  fail("{}={}: not a bool (use 0 or 1)", s.name, v);
}

int64_t parse_int(const DebugFlagSpec& s, const std::string& v) {
  errno = 0;
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  MS_CHECK(!v.empty() && end && *end == 0 && errno == 0, "{}={}: not an integer", s.name, v);
  MS_CHECK(x >= s.min && x <= s.max, "{}={}: out of range [{}, {}]", s.name, v, s.min, s.max);
  return x;
}

std::set<std::string> parse_list(const DebugFlagSpec& s, const std::string& v) {
  std::set<std::string> out;
  size_t at = 0;
  while (at <= v.size()) {
    const size_t comma = std::min(v.find(',', at), v.size());
    const std::string item = v.substr(at, comma - at);
    if (!item.empty()) {
      bool known = false;
      for (const auto& c : s.choices) known = known || c == item;
      if (!known) {
        std::string all;
        for (const auto& c : s.choices) all += (all.empty() ? "" : ", ") + c;
        fail("{}={}: unknown item '{}' (accepted: {})", s.name, v, item, all);
      }
      out.insert(item);
    }
    at = comma + 1;
  }
  return out;
}

// MOESERVE_OP_REPEAT=op:n,...: each op known, each n in [0, 1000].
void check_op_repeat(const DebugFlagSpec& s, const std::string& v) {
  size_t at = 0;
  while (at < v.size()) {
    const size_t comma = std::min(v.find(',', at), v.size());
    const std::string item = v.substr(at, comma - at);
    const size_t colon = item.find(':');
    MS_CHECK(colon != std::string::npos, "{}={}: '{}' is not op:n", s.name, v, item);
    const std::string op = item.substr(0, colon);
    bool known = false;
    for (const auto& c : s.choices) known = known || c == op;
    MS_CHECK(known, "{}={}: unknown op '{}' (accepted: qkv, qknorm, attn, oproj, route, experts)", s.name, v, op);
    DebugFlagSpec count = s;
    count.min = 0, count.max = 1000;
    parse_int(count, item.substr(colon + 1));
    at = comma + 1;
  }
}

}  // namespace

const std::vector<DebugFlagSpec>& debug_flag_specs() {
  static const std::vector<DebugFlagSpec> specs = {
      {"MOESERVE_PDL", T::Bool, "1",
       "CUDA: programmatic dependent launch between decode kernels (sm_90+). 0 launches every kernel "
       "without it (to tell a PDL ordering bug from a kernel bug).",
       {}},
      {"MOESERVE_PREFILL_OFF", T::List, "(empty)",
       "CUDA: turns prefill fast paths off, to narrow down an accuracy difference "
       "(scripts/realshape_check.py): fp8_act (bf16 activations in the FP8 linears and experts), lt "
       "(k_gemm_fp8.cu instead of cuBLASLt), attn (k_attn_tc.cu instead of the pipelined kernel), "
       "attn_wgmma (the mma.sync attention on Hopper), gemm_wgmma (the mma.sync FP8 GEMM on Hopper), "
       "router (router logits on CUDA cores), router_split (f32 cuBLASLt router GEMM), gate_cache "
       "(split the router gate per call), topk (shared-memory top-k), topk_redux (shuffle top-k), "
       "norm_quant (q/k/v norm and quantisations unfused), qk_rope (generic QK-norm + RoPE), "
       "quant_vec / moe_quant_vec (k_quant.cu's quantisation for the dense linears / the experts), "
       "moe_nq (experts' FP8 input by its own pass), all.",
       {"fp8_act", "lt", "attn", "attn_wgmma", "gemm_wgmma", "router", "router_split", "gate_cache", "topk",
        "topk_redux", "norm_quant", "qk_rope", "quant_vec", "moe_quant_vec", "moe_nq", "all"}},
      {"MOESERVE_DECODE_OFF", T::List, "(empty)",
       "CUDA: turns decode fusions off (same use as MOESERVE_PREFILL_OFF): router (router logits + "
       "top-k in one kernel), moe (direct expert pairs at batch 1), qkv (q/k/v as one launch), qk_kv "
       "(QK-norm + RoPE + KV write in one kernel), attn_decode (fused decode attention), dense_gemv "
       "(k_gemv_dense.cu for q/k/v at batch 1), dense_norm (its fused add + RMSNorm), route_dense "
       "(add + RMSNorm + router in one kernel), all.",
       {"router", "moe", "qkv", "qk_kv", "attn_decode", "dense_gemv", "dense_norm", "route_dense", "all"}},
      {"MOESERVE_DECODE_MEGA", T::Bool, "0",
       "CUDA: decode_layer as the persistent one-kernel layer (batch 1, FP8, one rank). Measured faster "
       "than the separate ops at 8k context and slower at 1k (docs/bench/log.md); opt-in until a "
       "selector picks it by context.",
       {}},
      {"MOESERVE_MEGA_TIMING", T::Bool, "0",
       "CUDA diagnostic build only: the persistent decode layer records per-phase times, printed when "
       "the backend is destroyed.",
       {}, 0, 0, true},
      {"MOESERVE_OP_REPEAT", T::String, "(empty)",
       "Diagnostic build only (WRONG results): op:n,... runs a layer op n times (0 skips it) to time "
       "one op inside the whole step; ops qkv, qknorm, attn, oproj, route, experts.",
       {"qkv", "qknorm", "attn", "oproj", "route", "experts"}, 0, 0, true},
      {"MOESERVE_ROUTE_DIAG", T::Bool, "0",
       "CUDA diagnostic build only (WRONG routing): the fused decode router writes 8 fixed distinct "
       "experts instead of its top-k, to time the top-k inside the step.",
       {}, 0, 0, true},
      {"MOESERVE_KTRACE_OUT", T::String, "(empty)",
       "Diagnostic build only: bench-model writes a kernel timeline trace of one graph replay per "
       "(batch, context) to files named PREFIX_b<batch>_c<context> (-DMOESERVE_KTRACE=ON compiles the trace into the kernels).",
       {}, 0, 0, true},
      {"MOESERVE_CPU_THREADS", T::Int, "0",
       "CPU backend: worker threads of the global pool (0: one per hardware thread).", {}, 0, 4096},
      {"MOESERVE_P2P_ALLREDUCE", T::Bool, "0",
       "Tensor parallel on one host: small all-reduces by the one-shot peer-to-peer kernel instead of "
       "NCCL (measured no faster in the step; docs/bench/log.md, \"Multi-GPU\").",
       {}},
      {"MOESERVE_TEST_NOW", T::Int, "(unset)",
       "Chat templates: strftime_now() uses this Unix time instead of the clock (tests compare "
       "against Python).",
       {}, 0, int64_t(1) << 40},
  };
  return specs;
}

int DebugFlags::op_repeat_count(const char* op) const {
  if (op_repeat.empty()) return 1;
  const std::string key = std::string(op) + ":";
  size_t at = 0;
  while (at < op_repeat.size()) {
    const size_t comma = std::min(op_repeat.find(',', at), op_repeat.size());
    if (op_repeat.compare(at, key.size(), key) == 0) return std::atoi(op_repeat.c_str() + at + key.size());
    at = comma + 1;
  }
  return 1;
}

DebugFlags parse_debug_flags(const EnvLookup& env, bool diag) {
  DebugFlags f;
  for (const DebugFlagSpec& s : debug_flag_specs()) {
    const char* raw = env(s.name);
    if (!raw) continue;
    const std::string v = raw;
    if (s.diagnostic_only && !v.empty() && v != "0")
      MS_CHECK(diag, "{}={}: a timing diagnostic, only in the diagnostic build (configure with -DMOESERVE_KTRACE=ON)",
               s.name, v);
    const std::string n = s.name;
    if (n == "MOESERVE_PDL") f.pdl = parse_bool(s, v);
    else if (n == "MOESERVE_PREFILL_OFF") f.prefill_off = parse_list(s, v);
    else if (n == "MOESERVE_DECODE_OFF") f.decode_off = parse_list(s, v);
    else if (n == "MOESERVE_DECODE_MEGA") f.decode_mega = parse_bool(s, v);
    else if (n == "MOESERVE_MEGA_TIMING") f.mega_timing = parse_bool(s, v);
    else if (n == "MOESERVE_OP_REPEAT") {
      check_op_repeat(s, v);
      f.op_repeat = v;
    } else if (n == "MOESERVE_ROUTE_DIAG") f.route_diag = parse_bool(s, v);
    else if (n == "MOESERVE_KTRACE_OUT") f.ktrace_out = v;
    else if (n == "MOESERVE_CPU_THREADS") f.cpu_threads = int(parse_int(s, v));
    else if (n == "MOESERVE_P2P_ALLREDUCE") f.p2p_allreduce = parse_bool(s, v);
    else if (n == "MOESERVE_TEST_NOW") f.test_now = parse_int(s, v);
    else fail("debug flag {}: no parser (core/debug_flags.cpp)", s.name);
  }
  return f;
}

bool diagnostic_build() {
#ifdef MOESERVE_KTRACE
  return true;
#else
  return false;
#endif
}

const DebugFlags& debug_flags() {
  static const DebugFlags flags =
      parse_debug_flags([](const char* name) -> const char* { return std::getenv(name); }, diagnostic_build());
  return flags;
}

std::string debug_flags_help() {
  std::string out =
      "Debug and diagnostic switches (environment variables, read once at start; a bad value is an error).\n"
      "Defaults are the shipped behaviour. This build: ";
  out += diagnostic_build() ? "diagnostic (-DMOESERVE_KTRACE=ON).\n\n" : "serving (diagnostic-only switches refused).\n\n";
  for (const DebugFlagSpec& s : debug_flag_specs()) {
    out += fmt::format("{}  [{}, default {}{}]\n    {}\n", s.name, type_name(s.type), s.default_text,
                       s.diagnostic_only ? ", diagnostic build" : "", s.description);
  }
  return out;
}

}  // namespace moeserve
