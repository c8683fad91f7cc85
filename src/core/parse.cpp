#include "core/parse.h"

#include <exception>

#include "core/error.h"

namespace moeserve {

size_t parse_number_prefix(const std::string& s, double* v) {
  size_t used = 0;
  *v = 0;
  try {
    *v = std::stod(s, &used);
  } catch (const std::exception&) {
    *v = 0;
    used = 0;
  }
  return used;
}

int64_t parse_human_int(const std::string& s) {
  MS_CHECK(!s.empty(), "--max-model-len: empty value");
  double mult = 1;
  std::string num = s;
  switch (s.back()) {
    case 'k': mult = 1e3; break;
    case 'm': mult = 1e6; break;
    case 'g': mult = 1e9; break;
    case 'K': mult = 1024; break;
    case 'M': mult = 1048576; break;
    case 'G': mult = 1073741824.0; break;
    default: break;
  }
  if (mult != 1) num.pop_back();
  double v = 0;
  const size_t used = parse_number_prefix(num, &v);
  MS_CHECK(used == num.size() && v > 0 && v * mult < 9e15, "--max-model-len: '{}' is not a length (4096, 32k, 32K)", s);
  return int64_t(v * mult);
}

}  // namespace moeserve
