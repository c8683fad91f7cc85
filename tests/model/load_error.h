// Test helper shared by the weight-loader tests: the message of load_weight's error, or "" when
// the weight loads.
#pragma once

#include <string>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/weights.h"

namespace moeserve {

inline std::string load_error(const Checkpoint& ck, const WeightDecl& d, const QuantizationConfig& q) {
  try {
    load_weight(ck, d, q);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace moeserve
