// EBNF/GBNF text -> Grammar (see grammar.h for the accepted dialect).
#include <fmt/format.h>

#include <map>

#include "structured/grammar.h"

namespace moeserve::structured {
namespace {

class EbnfParser {
 public:
  EbnfParser(std::string_view text, const GrammarLimits& limits) : s_(text) { g_.limits = limits; }

  Grammar parse() {
    skip_space();
    if (at_end()) throw GrammarError("grammar is empty");
    while (!at_end()) {
      size_t start = i_;
      std::string name = parse_name();
      if (name.empty()) error("expected a rule name");
      skip_space();
      if (s_.substr(i_, 3) != "::=") error("expected '::=' after rule name '" + name + "'");
      i_ += 3;
      int32_t r = rule_id(name, start);
      if (defined_.count(r)) error("rule '" + name + "' is defined twice", start);
      defined_[r] = start;
      g_.rules[r].alts = parse_alternatives(0);
      skip_space();
    }
    for (auto& [r, pos] : referenced_)
      if (!defined_.count(r)) throw GrammarError("rule '" + g_.rules[r].name + "' is used but not defined", pos);
    auto root = names_.find("root");
    if (root == names_.end()) throw GrammarError("grammar has no 'root' rule");
    g_.root = root->second;
    g_.check_no_left_recursion();
    return std::move(g_);
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
  Grammar g_;
  std::map<std::string, int32_t> names_;
  std::map<int32_t, size_t> defined_, referenced_;

  [[noreturn]] void error(const std::string& msg, std::optional<size_t> pos = std::nullopt) {
    throw GrammarError("invalid grammar: " + msg, pos ? pos : std::optional<size_t>(i_));
  }
  bool at_end() const { return i_ >= s_.size(); }
  char peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }

  void skip_space() {
    while (!at_end()) {
      char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++i_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++i_;
      } else {
        break;
      }
    }
  }
  static bool name_char(char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!first && ((c >= '0' && c <= '9') || c == '-' || c == '.'));
  }
  std::string parse_name() {
    size_t b = i_;
    if (!name_char(peek(), true)) return {};
    while (!at_end() && name_char(peek(), i_ == b)) ++i_;
    return std::string(s_.substr(b, i_ - b));
  }
  int32_t rule_id(const std::string& name, size_t pos) {
    auto it = names_.find(name);
    if (it != names_.end()) return it->second;
    int32_t r = g_.add_rule(name);
    names_[name] = r;
    referenced_.emplace(r, pos);
    return r;
  }
  // True when the text at i_ is `name ::=` (the start of the next rule).
  bool at_rule_start() {
    size_t save = i_;
    std::string n = parse_name();
    skip_space();
    bool yes = !n.empty() && s_.substr(i_, 3) == "::=";
    i_ = save;
    return yes;
  }

  std::vector<Alt> parse_alternatives(int depth) {
    if (depth > g_.limits.max_depth) error(fmt::format("groups nested deeper than {}", g_.limits.max_depth));
    std::vector<Alt> alts{parse_sequence(depth)};
    skip_space();
    while (peek() == '|') {
      ++i_;
      alts.push_back(parse_sequence(depth));
      skip_space();
    }
    return alts;
  }

  Alt parse_sequence(int depth) {
    Alt seq;
    for (;;) {
      skip_space();
      char c = peek();
      if (at_end() || c == '|' || c == ')') break;
      if (name_char(c, true) && at_rule_start()) break;
      size_t elem_start = i_;
      Alt elem = parse_element(depth);
      parse_postfix(elem, elem_start, seq);
      if (g_.num_symbols() > g_.limits.max_symbols) error("grammar too large");
    }
    return seq;
  }

  void parse_postfix(Alt& elem, size_t elem_start, Alt& seq) {
    // Whitespace before a postfix operator is not allowed in GBNF; we accept none.
    char c = peek();
    if (c == '*' || c == '+' || c == '?') {
      ++i_;
      int32_t r = c == '*' ? g_.star(elem, "rep") : c == '+' ? g_.plus(elem, "rep") : g_.optional(elem, "rep");
      seq.push_back(Symbol::ref(r));
      if (peek() == '*' || peek() == '+' || peek() == '?') {
        Alt again{Symbol::ref(r)};
        seq.pop_back();
        parse_postfix(again, elem_start, seq);
      }
      return;
    }
    if (c == '{') {
      ++i_;
      auto num = [&]() -> int {
        skip_space();
        size_t b = i_;
        int64_t v = 0;
        while (peek() >= '0' && peek() <= '9') {
          v = v * 10 + (peek() - '0');
          if (v > g_.limits.max_repeat) error(fmt::format("repetition bound above the limit of {}", g_.limits.max_repeat));
          ++i_;
        }
        if (i_ == b) return -2;
        return static_cast<int>(v);
      };
      int lo = num();
      if (lo == -2) error("expected a number in {m,n}");
      int hi = lo;
      skip_space();
      if (peek() == ',') {
        ++i_;
        hi = num();
        if (hi == -2) hi = -1;
      }
      skip_space();
      if (peek() != '}') error("expected '}' closing a repetition");
      ++i_;
      try {
        g_.repeat(elem, lo, hi, "rep", seq);
      } catch (const GrammarError& e) {
        throw GrammarError(std::string("invalid grammar: ") + e.what(), elem_start);
      }
      return;
    }
    seq.insert(seq.end(), elem.begin(), elem.end());
  }

  uint32_t parse_escape() {
    // at the char after '\'
    char c = peek();
    ++i_;
    auto hex = [&](int n) -> uint32_t {
      uint32_t v = 0;
      for (int k = 0; k < n; ++k) {
        char h = peek();
        int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
        if (d < 0) error("invalid hex escape");
        v = v * 16 + d;
        ++i_;
      }
      return v;
    };
    switch (c) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case '0': return 0;
      case 'f': return '\f';
      case 'v': return '\v';
      case 'b': return '\b';
      case 'x': return hex(2);
      case 'u': return hex(4);
      case 'U': return hex(8);
      case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': case '.': case '(': case ')':
        return uint8_t(c);
      default:
        error(fmt::format("unknown escape '\\{}'", c));
    }
  }

  Alt parse_element(int depth) {
    Alt out;
    char c = peek();
    if (c == '"') {
      ++i_;
      std::string lit;
      while (!at_end() && peek() != '"') {
        if (peek() == '\n') error("newline inside a string literal");
        if (peek() == '\\') {
          ++i_;
          uint32_t cp = parse_escape();
          if (cp > 0x10FFFF) error("escape outside Unicode");
          append_utf8(cp, lit);
        } else {
          size_t b = i_;
          decode_utf8(s_, i_);
          lit.append(s_.substr(b, i_ - b));
        }
      }
      if (at_end()) error("unterminated string literal");
      ++i_;
      Grammar::literal(lit, out);
      return out;
    }
    if (c == '[') {
      ++i_;
      bool neg = false;
      if (peek() == '^') { neg = true; ++i_; }
      std::vector<std::pair<uint32_t, uint32_t>> ranges;
      auto one = [&]() -> uint32_t {
        if (at_end()) error("unterminated character class");
        if (peek() == '\\') { ++i_; return parse_escape(); }
        return decode_utf8(s_, i_);
      };
      while (!at_end() && peek() != ']') {
        uint32_t a = one();
        uint32_t b = a;
        if (peek() == '-' && peek(1) != ']' && i_ + 1 < s_.size()) {
          ++i_;
          b = one();
        }
        if (b < a) error("character range is out of order");
        ranges.push_back({a, b});
      }
      if (at_end()) error("unterminated character class");
      ++i_;
      g_.codepoints(std::move(ranges), neg, out);
      return out;
    }
    if (c == '.') {
      ++i_;
      g_.codepoints({}, true, out);
      return out;
    }
    if (c == '(') {
      ++i_;
      skip_space();
      if (peek() == '=') error("lookahead assertions '(= ...)' are not supported");
      std::vector<Alt> alts = parse_alternatives(depth + 1);
      skip_space();
      if (peek() != ')') error("expected ')'");
      ++i_;
      if (alts.size() == 1) return std::move(alts[0]);
      out.push_back(Symbol::ref(g_.add_rule("group", std::move(alts))));
      return out;
    }
    if (name_char(c, true)) {
      size_t pos = i_;
      std::string n = parse_name();
      out.push_back(Symbol::ref(rule_id(n, pos)));
      return out;
    }
    error(fmt::format("unexpected character '{}'", c));
  }
};

}  // namespace

Grammar parse_ebnf(std::string_view text, const GrammarLimits& limits) { return EbnfParser(text, limits).parse(); }

}  // namespace moeserve::structured
