// Stop conditions checked by the engine after each sampled token.
//
// Split of responsibilities: the engine stops on token ids (EOS, stop_token_ids),
// max_tokens and the model length. Stop *strings* need detokenized text, so the server's
// output processor detects them, trims the text and calls Engine::abort(id); the request
// then ends with FinishReason::Abort on the engine side and the server reports "stop".
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/sequence.h"

namespace moeserve {

struct StopDecision {
  FinishReason reason = FinishReason::None;
  std::optional<int32_t> stop_token_id;  // the EOS / stop id that ended it
};

// Called after `seq`'s last generated token was appended. Order: while fewer than
// min_tokens are generated no token stops it; then an EOS id (unless ignore_eos) or a
// stop_token_id gives Stop; then max_tokens or max_model_len gives Length. (A stop token
// that is also the max_tokens-th token reports Stop: the model did end there.)
StopDecision check_stop(const Sequence& seq, const std::vector<int32_t>& eos_token_ids, int max_model_len);

// EOS ids of a model directory: generation_config.json's eos_token_id (int or list)
// followed by config.json's, without duplicates. Missing files or fields give no ids;
// a malformed file throws moeserve::Error naming it.
std::vector<int32_t> read_eos_token_ids(const std::string& model_dir);

}  // namespace moeserve
