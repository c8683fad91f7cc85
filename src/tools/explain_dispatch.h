// `moeserve bench-model --explain-dispatch`: the CUDA backend's kernel choice per op of a model
// for the decode buckets (graph_buckets: 1 .. 256 sequences of one token, captured) and prefill
// sizes (512 .. 8192 tokens of one sequence, eager), evaluated with the kernel selectors
// (src/backend/cuda/*/select_*.h) for a named device profile: no GPU needed. The checked-in
// golden files (tests/fixtures/dispatch/) and the generated op table of
// src/backend/cuda/README.md come from here.
#pragma once
#include <string>
#include <vector>

namespace moeserve::tools {

// The table for --synthetic `model` on device profile `profile` ("h200", "sm120"): a header of
// '#' lines, then "op phase tokens kernel" rows.
std::string explain_dispatch(const std::string& model, const std::string& profile);
// The models and profiles of the golden files, in file order.
const std::vector<std::string>& explain_dispatch_models();
const std::vector<std::string>& explain_dispatch_profiles();
// The README's generated section (between the markers below): the decode-bucket / prefill-size
// table of every golden model on both profiles, compacted to ranges of equal choices.
std::string explain_dispatch_markdown();
constexpr const char* kExplainBegin = "<!-- BEGIN explain-dispatch (generated: moeserve bench-model --explain-dispatch --markdown) -->";
constexpr const char* kExplainEnd = "<!-- END explain-dispatch -->";

}  // namespace moeserve::tools
