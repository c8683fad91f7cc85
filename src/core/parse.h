// Number parsing for command-line values (shared by serve, plan and bench).
#pragma once
#include <cstdint>
#include <string>

namespace moeserve {

// Reads a floating-point number at the start of `s` into *v. Returns how many characters it
// used (0 when `s` does not start with a number; *v is then 0).
size_t parse_number_prefix(const std::string& s, double* v);

// vLLM's human_readable_int for --max-model-len: 32k = 32000, 32K = 32768 (m/M, g/G alike),
// plain integers as they are. Throws naming --max-model-len on anything else.
int64_t parse_human_int(const std::string& s);

}  // namespace moeserve
