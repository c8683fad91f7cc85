// The grammar IR every constraint compiles to: a context-free grammar over BYTES.
// A rule is a list of alternatives; an alternative is a sequence of symbols; a symbol is
// either a set of bytes (one input byte from the set) or a reference to a rule. Unicode
// character classes are lowered to UTF-8 byte sequences when they are built, so the matcher
// never sees code points. Repetition is desugared into right-recursive helper rules, which
// the matcher runs as tail calls (the stack does not grow with the repetition count).
#pragma once
#include <bitset>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace moeserve::structured {

// A compile error of user input (schema, regex, grammar): the server answers 400 with it.
// `position` is a byte offset into the source text when one is meaningful.
class GrammarError : public Error {
 public:
  explicit GrammarError(const std::string& what, std::optional<size_t> position = std::nullopt)
      : Error(position ? what + " (at position " + std::to_string(*position) + ")" : what), position_(position) {}
  std::optional<size_t> position() const { return position_; }

 private:
  std::optional<size_t> position_;
};

using ByteSet = std::bitset<256>;

struct Symbol {
  int32_t rule = -1;  // >= 0: a rule reference; else `bytes`
  ByteSet bytes;
  bool is_rule() const { return rule >= 0; }
  static Symbol ref(int32_t r) { Symbol s; s.rule = r; return s; }
  static Symbol byte(uint8_t b) { Symbol s; s.bytes.set(b); return s; }
  static Symbol set(const ByteSet& b) { Symbol s; s.bytes = b; return s; }
};
using Alt = std::vector<Symbol>;

struct Rule {
  std::string name;
  std::vector<Alt> alts;
};

// Limits that keep compilation bounded on pathological input (each violation is a
// GrammarError, i.e. a 400).
struct GrammarLimits {
  int max_rules = 200000;
  int64_t max_symbols = 4000000;
  int max_repeat = 10000;  // {m,n} bounds
  int max_depth = 128;     // nesting of groups / schemas
};

class Grammar {
 public:
  std::vector<Rule> rules;
  int32_t root = -1;
  GrammarLimits limits;

  int32_t add_rule(std::string name, std::vector<Alt> alts = {});
  // Helper rules for the regular operators over one alternative `body`.
  int32_t star(const Alt& body, const std::string& hint);      // body*
  int32_t plus(const Alt& body, const std::string& hint);      // body+
  int32_t optional(const Alt& body, const std::string& hint);  // body?
  // body{min,max}; max < 0: unbounded. Appends to `out`.
  void repeat(const Alt& body, int min, int max, const std::string& hint, Alt& out);
  // Appends the bytes of `s` as single-byte symbols.
  static void literal(std::string_view s, Alt& out);
  // Appends one symbol matching any code point in the (inclusive) ranges, or outside them
  // when `negate`; lowered to UTF-8 (surrogates excluded). ASCII-only sets stay one symbol.
  void codepoints(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate, Alt& out);
  int64_t num_symbols() const;
  std::string to_string() const;  // EBNF-like dump for debugging and tests
  // Throws GrammarError when a rule is left-recursive (directly, or through nullable
  // prefixes): the matcher's tail-call PDA cannot run those.
  void check_no_left_recursion() const;
  std::vector<bool> nullable() const;
};

// Parses the EBNF/GBNF dialect vLLM's `structured_outputs.grammar` accepts through xgrammar:
// `name ::= alternatives`, "strings" with escapes, [character classes] (negation, ranges,
// escapes), `.` (any character), (groups), `|`, postfix `* + ?` and `{m}`, `{m,}`, `{m,n}`,
// `#` comments. Rule `root` is the start. Lookahead assertions `(= ...)` are refused.
Grammar parse_ebnf(std::string_view text, const GrammarLimits& limits = {});

// A grammar matching exactly one of `choices` (vLLM's guided_choice / structured_outputs.choice).
Grammar grammar_from_choices(const std::vector<std::string>& choices);

// Decodes one UTF-8 code point at s[i] (advancing i); throws GrammarError on invalid UTF-8.
uint32_t decode_utf8(std::string_view s, size_t& i);
void append_utf8(uint32_t cp, std::string& out);

}  // namespace moeserve::structured
