#include "structured/regex.h"

#include <fmt/format.h>

namespace moeserve::structured {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

const Ranges kDigit = {{'0', '9'}};
const Ranges kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const Ranges kSpace = {{'\t', '\r'}, {' ', ' '}};

class RegexParser {
 public:
  RegexParser(Grammar& g, std::string_view s) : g_(g), s_(s) {}

  int32_t parse_rule(const std::string& name) {
    if (!s_.empty() && s_[0] == '^') ++i_;
    std::vector<Alt> alts = parse_alternatives(0);
    if (i_ < s_.size()) error(s_[i_] == ')' ? "unbalanced ')'" : "unexpected character");
    return g_.add_rule(name, std::move(alts));
  }

 private:
  Grammar& g_;
  std::string_view s_;
  size_t i_ = 0;

  [[noreturn]] void error(const std::string& msg) { throw GrammarError("invalid regex: " + msg, i_); }
  bool at_end() const { return i_ >= s_.size(); }
  char peek(size_t k = 0) const { return i_ + k < s_.size() ? s_[i_ + k] : '\0'; }

  std::vector<Alt> parse_alternatives(int depth) {
    if (depth > g_.limits.max_depth) error(fmt::format("groups nested deeper than {}", g_.limits.max_depth));
    std::vector<Alt> alts{parse_sequence(depth)};
    while (peek() == '|') {
      ++i_;
      alts.push_back(parse_sequence(depth));
    }
    return alts;
  }

  Alt parse_sequence(int depth) {
    Alt seq;
    while (!at_end() && peek() != '|' && peek() != ')') {
      if (peek() == '$' && (i_ + 1 == s_.size() || s_[i_ + 1] == '|' || s_[i_ + 1] == ')')) {
        if (depth > 0 || i_ + 1 != s_.size()) error("'$' is only supported at the end of the pattern");
        ++i_;
        break;
      }
      size_t start = i_;
      Alt atom = parse_atom(depth);
      parse_quantifier(atom, start, seq);
      if (g_.num_symbols() > g_.limits.max_symbols) error("regex expands beyond the grammar size limit");
    }
    return seq;
  }

  void parse_quantifier(Alt& atom, size_t start, Alt& seq) {
    char c = peek();
    int lo = 1, hi = 1;
    if (c == '*') { lo = 0; hi = -1; ++i_; }
    else if (c == '+') { lo = 1; hi = -1; ++i_; }
    else if (c == '?') { lo = 0; hi = 1; ++i_; }
    else if (c == '{' && brace_is_quantifier()) {
      ++i_;
      lo = number();
      hi = lo;
      if (peek() == ',') {
        ++i_;
        hi = peek() == '}' ? -1 : number();
      }
      if (peek() != '}') error("expected '}'");
      ++i_;
    } else {
      seq.insert(seq.end(), atom.begin(), atom.end());
      return;
    }
    if (peek() == '?' || peek() == '+') ++i_;  // lazy / possessive: same language
    if (peek() == '*' || peek() == '+' || peek() == '?' || (peek() == '{' && brace_is_quantifier()))
      error("multiple repeat");
    try {
      if (lo == 0 && hi == -1) seq.push_back(Symbol::ref(g_.star(atom, "re")));
      else if (lo == 1 && hi == -1) seq.push_back(Symbol::ref(g_.plus(atom, "re")));
      else if (lo == 0 && hi == 1) seq.push_back(Symbol::ref(g_.optional(atom, "re")));
      else g_.repeat(atom, lo, hi, "re", seq);
    } catch (const GrammarError& e) {
      throw GrammarError(std::string("invalid regex: ") + e.what(), start);
    }
  }

  bool brace_is_quantifier() const {
    size_t k = i_ + 1;
    bool digit = false;
    while (k < s_.size() && s_[k] >= '0' && s_[k] <= '9') { ++k; digit = true; }
    if (!digit) return false;
    if (k < s_.size() && s_[k] == ',') {
      ++k;
      while (k < s_.size() && s_[k] >= '0' && s_[k] <= '9') ++k;
    }
    return k < s_.size() && s_[k] == '}';
  }

  int number() {
    int64_t v = 0;
    size_t b = i_;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + (peek() - '0');
      if (v > g_.limits.max_repeat) error(fmt::format("repetition bound above the limit of {}", g_.limits.max_repeat));
      ++i_;
    }
    if (i_ == b) error("expected a number");
    return static_cast<int>(v);
  }

  // An escape after '\': a single code point, or a class (d w s D W S) into `ranges`/`neg`.
  bool parse_escape(uint32_t& cp, Ranges& cls, bool& neg) {
    char c = peek();
    if (at_end()) error("trailing backslash");
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
      case 'd': cls = kDigit; neg = false; return false;
      case 'D': cls = kDigit; neg = true; return false;
      case 'w': cls = kWord; neg = false; return false;
      case 'W': cls = kWord; neg = true; return false;
      case 's': cls = kSpace; neg = false; return false;
      case 'S': cls = kSpace; neg = true; return false;
      case 'n': cp = '\n'; return true;
      case 't': cp = '\t'; return true;
      case 'r': cp = '\r'; return true;
      case 'f': cp = '\f'; return true;
      case 'v': cp = '\v'; return true;
      case '0': cp = 0; return true;
      case 'x': cp = hex(2); return true;
      case 'u':
        if (peek() == '{') {
          ++i_;
          uint32_t v = 0;
          while (peek() != '}') { v = v * 16 + hex(1); if (v > 0x10FFFF) error("escape outside Unicode"); }
          ++i_;
          cp = v;
          return true;
        }
        cp = hex(4);
        return true;
      case 'b': case 'B': case 'A': case 'Z': case 'z': case 'G':
        --i_;
        error(fmt::format("anchor '\\{}' is not supported", c));
      default:
        if (c >= '1' && c <= '9') { --i_; error("back-references are not supported"); }
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) { --i_; error(fmt::format("unknown escape '\\{}'", c)); }
        cp = uint8_t(c);
        return true;
    }
  }

  Alt parse_atom(int depth) {
    Alt out;
    char c = peek();
    if (c == '(') {
      ++i_;
      if (peek() == '?') {
        ++i_;
        if (peek() == ':') {
          ++i_;
        } else if (peek() == 'P' && peek(1) == '<') {
          i_ += 2;
          while (!at_end() && peek() != '>') ++i_;
          ++i_;
        } else if (peek() == '<' && peek(1) != '=' && peek(1) != '!') {
          ++i_;
          while (!at_end() && peek() != '>') ++i_;
          ++i_;
        } else {
          error("lookaround and inline flags are not supported");
        }
      }
      std::vector<Alt> alts = parse_alternatives(depth + 1);
      if (peek() != ')') error("missing ')'");
      ++i_;
      if (alts.size() == 1) return std::move(alts[0]);
      out.push_back(Symbol::ref(g_.add_rule("re_group", std::move(alts))));
      return out;
    }
    if (c == '[') return parse_class();
    if (c == '.') {
      ++i_;
      g_.codepoints({{'\n', '\n'}}, true, out);
      return out;
    }
    if (c == '*' || c == '+' || c == '?') error("nothing to repeat");
    if (c == '{' && brace_is_quantifier()) error("nothing to repeat");
    if (c == '^') error("'^' is only supported at the start of the pattern");
    if (c == '\\') {
      ++i_;
      uint32_t cp = 0;
      Ranges cls;
      bool neg = false;
      if (parse_escape(cp, cls, neg)) {
        std::string u;
        append_utf8(cp, u);
        Grammar::literal(u, out);
      } else {
        g_.codepoints(cls, neg, out);
      }
      return out;
    }
    size_t b = i_;
    decode_utf8(s_, i_);
    Grammar::literal(s_.substr(b, i_ - b), out);
    return out;
  }

  Alt parse_class() {
    ++i_;  // '['
    bool neg = false;
    if (peek() == '^') { neg = true; ++i_; }
    Ranges ranges;
    bool first = true;
    // Negated escape classes inside [...] (e.g. [\D]) are unioned as their complements.
    auto add_class = [&](const Ranges& cls, bool cneg) {
      if (!cneg) { ranges.insert(ranges.end(), cls.begin(), cls.end()); return; }
      uint32_t next = 0;
      for (auto [a, b] : cls) { if (a > next) ranges.push_back({next, a - 1}); next = b + 1; }
      ranges.push_back({next, 0x10FFFF});
    };
    while (!at_end() && (peek() != ']' || first)) {
      first = false;
      uint32_t a = 0;
      if (peek() == '[' && peek(1) == ':') error("POSIX classes are not supported");
      if (peek() == '\\') {
        ++i_;
        Ranges cls;
        bool cneg = false;
        if (!parse_escape(a, cls, cneg)) { add_class(cls, cneg); continue; }
      } else {
        a = decode_utf8(s_, i_);
      }
      uint32_t b = a;
      if (peek() == '-' && peek(1) != ']' && i_ + 1 < s_.size()) {
        ++i_;
        if (peek() == '\\') {
          ++i_;
          Ranges cls;
          bool cneg = false;
          if (!parse_escape(b, cls, cneg)) error("a class cannot end a range");
        } else {
          b = decode_utf8(s_, i_);
        }
        if (b < a) error("bad character range");
      }
      ranges.push_back({a, b});
    }
    if (at_end()) error("unterminated character set");
    ++i_;
    Alt out;
    g_.codepoints(std::move(ranges), neg, out);
    return out;
  }
};

}  // namespace

int32_t add_regex_rule(Grammar& g, std::string_view pattern, const std::string& name) {
  return RegexParser(g, pattern).parse_rule(name);
}

Grammar grammar_from_regex(std::string_view pattern, const GrammarLimits& limits) {
  Grammar g;
  g.limits = limits;
  g.root = add_regex_rule(g, pattern, "root");
  g.check_no_left_recursion();
  return g;
}

}  // namespace moeserve::structured
