#include "engine/spec_config.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "core/bounded_json.h"
#include "core/error.h"

namespace moeserve {

const char* spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::Ngram: return "ngram";
    case SpecMethod::Eagle3: return "eagle3";
    case SpecMethod::Eagle: return "eagle";
    case SpecMethod::Mtp: return "mtp";
    case SpecMethod::DraftModel: return "draft_model";
    case SpecMethod::None: break;
  }
  return "none";
}

namespace {

constexpr const char* kFlag = "--speculative-config";

[[noreturn]] void unsupported(const std::string& what, const std::string& why) {
  fail("not supported yet: {} {} ({})", kFlag, what, why);
}

// Keys of vLLM's SpeculativeConfig that moeserve does not implement, with the reason. A key
// given with vLLM's default value (when it has a false / null default) changes nothing.
struct Refusal {
  const char* why;
  bool default_false_ok;  // `false` (and null) is vLLM's default: accepted
};
const std::map<std::string, Refusal>& refused_keys() {
  static const std::map<std::string, Refusal> m = {
      {"quantization", {"a draft-model override; the n-gram proposer has no draft weights", false}},
      {"moe_backend", {"a draft-model override; the n-gram proposer has no draft weights", false}},
      {"attention_backend", {"a draft-model override; the n-gram proposer has no draft forward", false}},
      {"kv_cache_dtype", {"a draft-model override; the n-gram proposer has no draft KV cache", false}},
      {"max_model_len", {"a draft-model override; the n-gram proposer follows the target's --max-model-len", false}},
      {"revision", {"draft checkpoints are read from a local directory (no hub revision)", false}},
      {"code_revision", {"moeserve runs no repository code", false}},
      {"draft_load_config", {"draft load options are not implemented", false}},
      {"enforce_eager", {"draft and verify steps always run eagerly today", true}},
      {"disable_padded_drafter_batch", {"EAGLE drafter batching option (moeserve drafts unpadded)", true}},
      {"disable_eagle_block_drop", {"EAGLE prefix-cache option, not implemented", true}},
      {"use_local_argmax_reduction", {"draft vocab-parallel argmax; draft models are not implemented yet", true}},
      {"use_heterogeneous_vocab", {"draft_model option; draft models are not implemented yet", true}},
      {"parallel_drafting", {"P-EAGLE / PARD drafting is not implemented", true}},
      {"num_speculative_tokens_per_batch_size", {"a k per batch size is not implemented; use one num_speculative_tokens", false}},
      {"suffix_decoding_max_tree_depth", {"suffix decoding is not implemented; use method ngram", false}},
      {"suffix_decoding_max_cached_requests", {"suffix decoding is not implemented; use method ngram", false}},
      {"suffix_decoding_max_spec_factor", {"suffix decoding is not implemented; use method ngram", false}},
      {"suffix_decoding_min_token_prob", {"suffix decoding is not implemented; use method ngram", false}},
      {"synthetic_acceptance_rates", {"synthetic acceptance (benchmarking) is not implemented", false}},
      {"synthetic_acceptance_length", {"synthetic acceptance (benchmarking) is not implemented", false}},
      {"enable_adaptive_verification", {"adaptive verification is not implemented", true}},
      {"index_share_for_mtp_iteration", {"DSA MTP option; DSA is not implemented", true}},
      {"dspark_draft_topk", {"dspark is not implemented", false}},
      {"speculative_token_tree", {"tree drafting is not implemented; drafts are one chain", false}},
      {"disable_by_batch_size", {"turning speculation off by batch size is not implemented", false}},
  };
  return m;
}

const std::set<std::string>& implemented_keys() {
  static const std::set<std::string> s = {"method",           "model",           "num_speculative_tokens",
                                          "prompt_lookup_min", "prompt_lookup_max", "draft_tensor_parallel_size",
                                          "tensor_parallel_size", "rejection_sample_method", "draft_sample_method"};
  return s;
}

int get_int(const nlohmann::json& j, const char* key) {
  const auto& v = j.at(key);
  MS_CHECK(v.is_number_integer(), "{}: \"{}\" must be an integer, got {}", kFlag, key, v.dump());
  const int64_t x = v.get<int64_t>();
  MS_CHECK(x >= -(int64_t(1) << 30) && x <= (int64_t(1) << 30), "{}: \"{}\" {} is out of range", kFlag, key, x);
  return int(x);
}

std::string get_string(const nlohmann::json& j, const char* key) {
  const auto& v = j.at(key);
  MS_CHECK(v.is_string(), "{}: \"{}\" must be a string, got {}", kFlag, key, v.dump());
  return v.get<std::string>();
}

// vLLM's method names (SpeculativeMethod), its deprecated MTP aliases, and the refusals.
SpecMethod method_of(const std::string& m) {
  if (m == "ngram") return SpecMethod::Ngram;
  if (m == "eagle3") return SpecMethod::Eagle3;
  if (m == "eagle") return SpecMethod::Eagle;
  if (m == "draft_model") return SpecMethod::DraftModel;
  static const std::set<std::string> mtp = {"mtp",           "deepseek_mtp", "glm4_moe_mtp", "qwen3_next_mtp",
                                            "mimo_mtp",      "ernie_mtp",    "longcat_flash_mtp",
                                            "minimax_m3_mtp", "pangu_ultra_moe_mtp", "qwen3_5_mtp"};
  if (mtp.count(m)) return SpecMethod::Mtp;
  if (m == "ngram_gpu") unsupported("method \"ngram_gpu\"", "moeserve's n-gram proposer runs on the host; use \"ngram\"");
  static const std::set<std::string> other = {"medusa", "mlp_speculator", "suffix",  "custom_class",
                                              "extract_hidden_states", "dflash", "dspark"};
  if (other.count(m)) unsupported(fmt::format("method \"{}\"", m), "implemented: ngram");
  fail("{}: unknown method \"{}\" (vLLM's methods: ngram, ngram_gpu, eagle, eagle3, mtp, draft_model, medusa, "
       "mlp_speculator, suffix, custom_class, extract_hidden_states, dflash, dspark)",
       kFlag, m);
}

}  // namespace

SpecConfig parse_speculative_config(std::string_view text, const SpecParseContext& ctx) {
  nlohmann::json j;
  try {
    j = parse_json_bounded(text, "--speculative-config");
  } catch (const JsonDepthError&) {
    throw;
  } catch (const std::exception& e) {
    fail("{} '{}': not valid JSON ({})", kFlag, text, e.what());
  }
  MS_CHECK(j.is_object(), "{} '{}': expected a JSON object, e.g. '{{\"method\": \"ngram\", "
           "\"num_speculative_tokens\": 3, \"prompt_lookup_max\": 4}}'", kFlag, text);
  // 1. Every key must be known; refused keys say why.
  for (const auto& [key, value] : j.items()) {
    if (implemented_keys().count(key)) continue;
    auto it = refused_keys().find(key);
    if (it == refused_keys().end())
      fail("{}: unknown key \"{}\" (known: method, model, num_speculative_tokens, prompt_lookup_min, "
           "prompt_lookup_max, draft_tensor_parallel_size and vLLM's other SpeculativeConfig keys)",
           kFlag, key);
    if (it->second.default_false_ok && (value.is_null() || (value.is_boolean() && !value.get<bool>()))) continue;
    if (value.is_null() && !it->second.default_false_ok) continue;  // null is vLLM's default (unset)
    unsupported(fmt::format("\"{}\": {}", key, value.dump()), it->second.why);
  }
  if (j.contains("tensor_parallel_size"))
    fail("{}: \"tensor_parallel_size\" is not a speculative-config key (vLLM refuses it too); use "
         "\"draft_tensor_parallel_size\"", kFlag);

  SpecConfig c;
  if (j.contains("model") && !j["model"].is_null()) c.model = get_string(j, "model");
  // 2. The method: given, or inferred from `model` as vLLM does.
  if (j.contains("method") && !j["method"].is_null()) {
    c.method = method_of(get_string(j, "method"));
  } else if (c.model == "ngram" || c.model == "[ngram]") {
    c.method = SpecMethod::Ngram;
  } else if (c.model.find("eagle3") != std::string::npos || c.model.find("Eagle3") != std::string::npos) {
    c.method = SpecMethod::Eagle3;
  } else if (c.model.find("eagle-") != std::string::npos || c.model.find("EAGLE-") != std::string::npos) {
    c.method = SpecMethod::Eagle;
  } else if (!c.model.empty()) {
    c.method = SpecMethod::DraftModel;
  } else {
    fail("{}: no \"method\" and no \"model\" (e.g. '{{\"method\": \"ngram\", \"num_speculative_tokens\": 3}}')", kFlag);
  }
  // 3. Methods not implemented: refused with what works, before anything loads.
  switch (c.method) {
    case SpecMethod::Eagle:
      unsupported("method \"eagle\"",
                  "EAGLE-1 heads are not implemented; EAGLE-3 heads ({\"method\": \"eagle3\", \"model\": DIR}) and "
                  "ngram are");
    case SpecMethod::DraftModel:
      unsupported("method \"draft_model\"" + (c.model.empty() ? std::string() : " (model \"" + c.model + "\")"),
                  "separate draft models are not implemented yet; use eagle3, mtp or ngram");
    default: break;
  }
  MS_CHECK(j.contains("num_speculative_tokens") && !j["num_speculative_tokens"].is_null(),
           "{}: \"num_speculative_tokens\" is required for method \"{}\"", kFlag, spec_method_name(c.method));
  if (c.method == SpecMethod::Eagle3 || c.method == SpecMethod::Mtp) {
    for (const char* k : {"prompt_lookup_min", "prompt_lookup_max"})
      MS_CHECK(!j.contains(k) || j[k].is_null(), "{}: \"{}\" is an n-gram key; method \"{}\" does not take it",
               kFlag, k, spec_method_name(c.method));
    if (c.method == SpecMethod::Eagle3)
      MS_CHECK(!c.model.empty(), "{}: method \"eagle3\" needs \"model\": the EAGLE-3 draft's directory", kFlag);
    else
      MS_CHECK(c.model.empty(), "{}: method \"mtp\" reads its modules from the target checkpoint; omit \"model\" "
               "(got \"{}\")", kFlag, c.model);
  }
  c.num_speculative_tokens = get_int(j, "num_speculative_tokens");
  MS_CHECK(c.num_speculative_tokens >= 1 && c.num_speculative_tokens <= kMaxSpecTokens,
           "{}: \"num_speculative_tokens\" {} must be in [1, {}]", kFlag, c.num_speculative_tokens, kMaxSpecTokens);
  // 4. n-gram: vLLM's key rules.
  if (c.method == SpecMethod::Ngram) {
  if (!c.model.empty() && c.model != "ngram" && c.model != "[ngram]")
    fail("{}: method \"ngram\" takes no draft \"model\" (got \"{}\")", kFlag, c.model);
  c.model = "ngram";
  const bool has_min = j.contains("prompt_lookup_min") && !j["prompt_lookup_min"].is_null();
  const bool has_max = j.contains("prompt_lookup_max") && !j["prompt_lookup_max"].is_null();
  c.prompt_lookup_min = has_min ? get_int(j, "prompt_lookup_min") : 0;
  c.prompt_lookup_max = has_max ? get_int(j, "prompt_lookup_max") : 0;
  if (!has_min && !has_max) c.prompt_lookup_min = c.prompt_lookup_max = 5;  // vLLM's defaults
  else if (!has_max) c.prompt_lookup_max = c.prompt_lookup_min;
  else if (!has_min) c.prompt_lookup_min = c.prompt_lookup_max;
  MS_CHECK(c.prompt_lookup_min >= 1, "{}: \"prompt_lookup_min\" {} must be >= 1", kFlag, c.prompt_lookup_min);
  MS_CHECK(c.prompt_lookup_max >= 1, "{}: \"prompt_lookup_max\" {} must be >= 1", kFlag, c.prompt_lookup_max);
  MS_CHECK(c.prompt_lookup_min <= c.prompt_lookup_max,
           "{}: \"prompt_lookup_min\" {} must be <= \"prompt_lookup_max\" {}", kFlag, c.prompt_lookup_min,
           c.prompt_lookup_max);
  MS_CHECK(c.prompt_lookup_max <= 1024, "{}: \"prompt_lookup_max\" {} is too large (at most 1024)", kFlag,
           c.prompt_lookup_max);
  }
  if (j.contains("draft_tensor_parallel_size") && !j["draft_tensor_parallel_size"].is_null()) {
    c.draft_tensor_parallel_size = get_int(j, "draft_tensor_parallel_size");
    MS_CHECK(c.draft_tensor_parallel_size == 1 || c.draft_tensor_parallel_size == ctx.tensor_parallel_size,
             "{}: \"draft_tensor_parallel_size\" {} must be 1 or the target's tensor parallel size {}", kFlag,
             c.draft_tensor_parallel_size, ctx.tensor_parallel_size);
  }
  // Verification options: the standard (exact) rejection rule and greedy drafts are what runs.
  if (j.contains("rejection_sample_method") && !j["rejection_sample_method"].is_null()) {
    const std::string m = get_string(j, "rejection_sample_method");
    if (m != "standard" && m != "strict")
      unsupported(fmt::format("\"rejection_sample_method\": \"{}\"", m),
                  "only the exact rule (standard / strict) is implemented");
  }
  if (j.contains("draft_sample_method") && !j["draft_sample_method"].is_null()) {
    const std::string m = get_string(j, "draft_sample_method");
    if (m != "greedy")
      unsupported(fmt::format("\"draft_sample_method\": \"{}\"", m),
                  "drafts are greedy tokens, verified without probabilities (exact at every temperature); use "
                  "\"greedy\" (the default)");
  }
  return c;
}

std::string describe(const SpecConfig& c) {
  if (!c.enabled()) return "off";
  if (c.method != SpecMethod::Ngram)
    return fmt::format("{}, num_speculative_tokens {}{}", spec_method_name(c.method), c.num_speculative_tokens,
                       c.model.empty() ? std::string(" (modules of the target checkpoint)") : ", model " + c.model);
  return fmt::format("{}, num_speculative_tokens {}, prompt_lookup_min {}, prompt_lookup_max {}",
                     spec_method_name(c.method), c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max);
}

}  // namespace moeserve
