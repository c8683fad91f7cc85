// Decimal range languages for JSON Schema's numeric bounds (minimum / maximum /
// exclusiveMinimum / exclusiveMaximum): grammars whose strings are exactly the JSON numbers
// in a range, built from digit classes the way one writes a range as a regex by hand.
//
// Integers: natural numbers in [lo, hi] without leading zeros (`natural_range`).
// Numbers (`number_range_alts`): every plain decimal spelling (an integer part without
// leading zeros, an optional fraction of any length, trailing zeros allowed) whose value is
// in the range, for integer or fractional, negative or positive bounds. Exponent notation is
// not produced in a bounded number: with an exponent the set of in-range spellings is not a
// regular language (0.0...01eN <= 1 ties N to the count of zeros), and every value in range
// has a plain spelling anyway. Zero is written without a sign, except that "-0.0..." (a
// fraction after "-0") is allowed when negative values are in range, as xgrammar does;
// "-0" alone never (as our integers).
#pragma once
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "structured/grammar.h"

namespace moeserve::structured {

// A bound's exact decimal value: -ip.frac (frac without trailing zeros; zero is never `neg`).
struct Decimal {
  bool neg = false;
  int64_t ip = 0;    // integer part, below 1e17
  std::string frac;  // fraction digits, at most 40
};

// The decimal a schema wrote (a double as its shortest round-trip spelling, so 0.1 is 0.1).
// Throws GrammarError naming `key` for a non-number or a value outside |x| <= 1e17 with at
// most 40 decimals.
Decimal parse_decimal(const nlohmann::ordered_json& v, const char* key);
int compare(const Decimal& a, const Decimal& b);  // <0, 0, >0 by value

struct NumberBound {
  Decimal value;
  bool inclusive = true;
};

struct NumberCaps {
  int max_int_digits = -1;   // for a side without a bound; < 0: unbounded
  int max_frac_digits = -1;  // < 0: unbounded
};

ByteSet digit_set(int lo, int hi);

// Natural numbers in [lo, hi] written without leading zeros (hi < 0: unbounded, then at
// most `max_digits` digits when max_digits > 0). Appends alternatives to `out`.
void natural_range(Grammar& g, int64_t lo, int64_t hi, std::vector<Alt>& out, int max_digits = -1);

// The same numbers restricted to multiples of `m` (1 <= m <= 10000), for `multipleOf` on
// integers: each range piece (a fixed-width digit-class sequence, or the unbounded "more
// digits" one) is run in product with the remainder automaton r -> (10 r + d) mod m, so a
// number is accepted exactly when its remainder is 0 at its end; all-digit piece suffixes are
// shared, so rules are about m x digits. More than 60000 rules is a GrammarError.
void natural_multiples(Grammar& g, int64_t lo, int64_t hi, int64_t m, std::vector<Alt>& out);

// The JSON numbers between the bounds (absent = unbounded). Throws GrammarError when the
// bounds admit no value.
std::vector<Alt> number_range_alts(Grammar& g, const std::optional<NumberBound>& lo,
                                   const std::optional<NumberBound>& hi, const NumberCaps& caps);

}  // namespace moeserve::structured
