// `moeserve inspect`: a checkpoint summary from config.json and the safetensors headers
// only (no tensor data is read): architecture, sizes, parameter counts (total and active
// per token), bytes by dtype, quantisation, MTP modules declared vs present, and tensors
// that are missing, misshaped or unexpected compared with the model's declarations.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "model/model.h"

namespace moeserve {

struct ParamCounts {
  int64_t total = 0;              // every parameter of the main model (FP8 scales not counted)
  int64_t active = 0;             // per token: attention, norms, router, top_k experts, lm_head
  int64_t active_no_lm_head = 0;  // the same without lm_head (the usual "active" figure)
  int64_t per_expert = 0;
  int64_t embedding = 0;
};
ParamCounts count_params(const ArchConfig& cfg);

nlohmann::json inspect_checkpoint(const std::string& dir);
std::string format_inspect(const nlohmann::json& report);  // human-readable text

}  // namespace moeserve
