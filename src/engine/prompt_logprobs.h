// vLLM's prompt_logprobs on the host: the raw model distribution (log_softmax of the logits,
// before any logits processor, as vLLM's default logprobs-mode raw_logprobs) at one prompt
// position, reported for the prompt token that follows it.
#pragma once
#include <cstdint>
#include <span>

#include "engine/engine.h"

namespace moeserve {

// logits [V] of position p; token = prompt token p + 1; k >= 0 top alternatives, -1 all V.
PromptTokenLogprob prompt_token_logprob(std::span<const float> logits, int32_t token, int k);

}  // namespace moeserve
