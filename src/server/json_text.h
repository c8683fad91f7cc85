// Small JSON text helpers for the server's hot path and for Python-compatible output.
//
// - append_json_string: compact JSON string literal (UTF-8 kept raw, as pydantic emits it).
// - py_json_dumps: Python's json.dumps(x, ensure_ascii=False) layout (", " and ": "
//   separators, float repr), used for tool-call `arguments` so clients see what vLLM sends.
// - valid_utf8: strict UTF-8 check (no overlongs, no surrogates).
#pragma once
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace moeserve::server {

using ojson = nlohmann::ordered_json;

void append_json_string(std::string& out, std::string_view s);
inline std::string json_string(std::string_view s) {
  std::string out;
  append_json_string(out, s);
  return out;
}
// Python float repr ("1.0", "0.1", "1e-05", "1e+16"); non-finite as Python writes them.
std::string py_float_repr(double v);
// Shortest round-trip text of a float32 value (logprobs), with -inf as -9999.0 like vLLM.
void append_logprob(std::string& out, float v);
std::string py_json_dumps(const ojson& j);
bool valid_utf8(std::string_view s);
// Length of the longest prefix of s that is complete UTF-8 (drops a cut-off tail).
size_t utf8_complete_prefix(std::string_view s);

}  // namespace moeserve::server
