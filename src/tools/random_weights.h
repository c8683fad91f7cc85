// Random weights for any registry architecture, from its weight declarations (no checkpoint):
// `serve --load-format dummy` and bench-model's synthetic models other than MiniMax-M2.5 on
// CUDA (whose FP8 weights bench_synth.cpp generates on the GPU). Host memory, then the model's
// own upload (Model::load_from), so each tensor has this rank's declared shape and a declared
// dtype: FP8 E4M3 with F32 block scales where the config is FP8 block-quantised and the tensor
// accepts it, else BF16, else the first accepted dtype.
//
// Values (seeded by tensor name, so replicated tensors agree on every rank; slices of split
// tensors are drawn per rank): norm weights 1 + 0.1 N(0,1), other vectors (router bias)
// 0.01 N(0,1), the embedding N(0,1), matrices N(0,1) / sqrt(global fan-in), so activations
// stay O(1) through any number of layers and the router's scores are near uniform.
#pragma once
#include <cstdint>

#include "model/model.h"

namespace moeserve::tools {

struct RandomWeightOptions {
  uint64_t seed = 1000;
  bool lm_head = true;  // false: no lm_head (a rank that produces no logits)
  // compressed-tensors INT4 routed experts handed over packed (Backend::int4_experts_packed):
  // uniform random nibbles (q in [-8, 7], variance 5.25) with BF16 group scales 1 / sqrt(5.25 x
  // fan-in). Other INT4 modules and every INT4 module when false: dense values as above.
  bool int4_packed_experts = false;
};

// The source for Model::load_from over `desc` (the model's ModelDesc: its quantisation).
WeightSource random_weight_source(const ModelDesc& desc, const RandomWeightOptions& o);
// model.load_from(random_weight_source(...)); returns the bytes of host tensors made.
int64_t load_random_weights(Model& model, const RandomWeightOptions& o);

}  // namespace moeserve::tools
