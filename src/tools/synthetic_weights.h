// `serve --load-format dummy`: random weights generated on the device for a model built from
// config.json, without a checkpoint. Declared free of device headers so the CLI can call it;
// implemented by bench-model's generator (bench_synth.cpp: MiniMax-M2's FP8 layout on CUDA),
// which refuses other architectures and backends with a clear message.
#pragma once
#include <cstdint>

#include "backend/backend.h"
#include "model/model.h"

namespace moeserve::tools {

// Returns the bytes generated. lm_head: whether this rank needs the output projection.
int64_t make_synthetic_weights(Backend& backend, Model& model, uint64_t seed, bool lm_head);

}  // namespace moeserve::tools
