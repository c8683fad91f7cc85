// `--speculative-config JSON` (vLLM's SpeculativeConfig keys) parsed into a typed SpecConfig.
//
// Every key of vLLM's SpeculativeConfig is known here: the ones moeserve implements are read
// into the struct; the others are refused by name with the reason (a key whose value is
// vLLM's default, e.g. `"enforce_eager": false`, changes nothing and is accepted). Unknown keys
// and impossible combinations (min > max, k < 1, a key of another method) fail here, before
// anything loads. ngram, eagle3 (a draft directory) and mtp (modules of the target checkpoint)
// run; eagle (EAGLE-1) and draft_model are refused ("not supported yet") with what to use
// instead: a configuration never silently runs without speculation.
#pragma once
#include <string>
#include <string_view>

namespace moeserve {

enum class SpecMethod { None, Ngram, Eagle3, Eagle, Mtp, DraftModel };
const char* spec_method_name(SpecMethod m);  // "none", "ngram", "eagle3", "eagle", "mtp", "draft_model"

struct SpecConfig {
  SpecMethod method = SpecMethod::None;
  int num_speculative_tokens = 0;  // k: drafts per sequence per step (at most kMaxSpecTokens)
  std::string model;               // EAGLE-3 draft directory ("ngram" for n-gram; "" for mtp)
  // n-gram prompt lookup: the longest suffix n-gram with min <= n <= max is matched in the
  // prompt + output so far and the k tokens that followed its earliest occurrence proposed.
  int prompt_lookup_min = 0;
  int prompt_lookup_max = 0;
  int draft_tensor_parallel_size = 1;  // 1 or the target's TP (vLLM's rule); n-gram runs on the host
  bool enabled() const { return method != SpecMethod::None; }
};

// vLLM's MAX_SPEC_LEN (the rejection sampler's static bound).
constexpr int kMaxSpecTokens = 32;

struct SpecParseContext {
  int tensor_parallel_size = 1;  // the target's (draft_tensor_parallel_size must be 1 or this)
};

// Parses the flag's JSON text. Throws moeserve::Error naming the key and the reason; refusals
// of valid vLLM configurations start with "not supported yet: --speculative-config".
SpecConfig parse_speculative_config(std::string_view json_text, const SpecParseContext& ctx = {});

// One line for the start-up log ("ngram, k=3, prompt_lookup 2..5").
std::string describe(const SpecConfig& c);

}  // namespace moeserve
