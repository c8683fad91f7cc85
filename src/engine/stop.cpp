#include "engine/stop.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/structured_sampling.h"
#include "core/bounded_json.h"

namespace moeserve {

StopDecision check_stop(const Sequence& seq, const std::vector<int32_t>& eos_token_ids, int max_model_len) {
  StopDecision d;
  const SamplingParams& p = seq.params();
  const int n_out = seq.num_output_tokens();
  if (n_out <= 0) return d;
  const int32_t last = seq.tokens.back();
  // A finished structured output stops on its stop token even before min_tokens (see
  // structured_allows_only_stop).
  if (n_out >= p.min_tokens || structured_terminated(seq)) {
    const bool is_eos =
        !p.ignore_eos && std::find(eos_token_ids.begin(), eos_token_ids.end(), last) != eos_token_ids.end();
    const bool is_stop = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), last) != p.stop_token_ids.end();
    if (is_eos || is_stop) {
      d.reason = FinishReason::Stop;
      d.stop_token_id = last;
      return d;
    }
  }
  if (n_out >= p.max_tokens || seq.num_tokens() >= max_model_len) d.reason = FinishReason::Length;
  return d;
}

namespace {
void add_ids(const nlohmann::json& v, std::vector<int32_t>& out, const std::string& file) {
  auto add = [&](const nlohmann::json& x) {
    MS_CHECK(x.is_number_integer(), "{}: eos_token_id entries must be integers", file);
    const int32_t id = x.get<int32_t>();
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  if (v.is_null()) return;
  if (v.is_array()) {
    for (const auto& x : v) add(x);
  } else {
    add(v);
  }
}
}  // namespace

std::vector<int32_t> read_eos_token_ids(const std::string& model_dir) {
  std::vector<int32_t> ids;
  for (const char* name : {"generation_config.json", "config.json"}) {
    const std::filesystem::path path = std::filesystem::path(model_dir) / name;
    if (!std::filesystem::exists(path)) continue;
    std::ifstream in(path);
    MS_CHECK(in.good(), "cannot read {}", path.string());
    nlohmann::json j;
    try {
      j = parse_json_bounded(std::string(std::istreambuf_iterator<char>(in), {}), path.string());
    } catch (const std::exception& e) {
      fail("{}: invalid JSON: {}", path.string(), e.what());
    }
    if (j.is_object() && j.contains("eos_token_id")) add_ids(j["eos_token_id"], ids, path.string());
  }
  return ids;
}

}  // namespace moeserve
