// Python's repr(float): shortest round-trip digits, fixed notation for exponents in
// [-4, 16), otherwise d.ddde+XX; "nan", "inf", "-inf". Used wherever output must be
// byte-identical to Python (json.dumps in tool-call arguments, Jinja's str/tojson).
#pragma once
#include <string>

namespace moeserve {
std::string python_float_repr(double v);
}  // namespace moeserve
