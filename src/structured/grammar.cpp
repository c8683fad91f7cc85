#include "structured/grammar.h"

#include <algorithm>
#include <fmt/format.h>
#include <functional>

namespace moeserve::structured {

int32_t Grammar::add_rule(std::string name, std::vector<Alt> alts) {
  if (static_cast<int>(rules.size()) >= limits.max_rules)
    throw GrammarError(fmt::format("grammar too large: more than {} rules", limits.max_rules));
  rules.push_back(Rule{std::move(name), std::move(alts)});
  return static_cast<int32_t>(rules.size() - 1);
}

int32_t Grammar::star(const Alt& body, const std::string& hint) {
  // R ::= "" | body R   (right recursion: a tail call in the matcher)
  int32_t r = add_rule(hint + "_star");
  Alt loop = body;
  loop.push_back(Symbol::ref(r));
  rules[r].alts = {Alt{}, std::move(loop)};
  return r;
}

int32_t Grammar::plus(const Alt& body, const std::string& hint) {
  // R ::= body | body R
  int32_t r = add_rule(hint + "_plus");
  Alt loop = body;
  loop.push_back(Symbol::ref(r));
  rules[r].alts = {body, std::move(loop)};
  return r;
}

int32_t Grammar::optional(const Alt& body, const std::string& hint) {
  return add_rule(hint + "_opt", {Alt{}, body});
}

void Grammar::repeat(const Alt& body, int min, int max, const std::string& hint, Alt& out) {
  if (min < 0 || min > limits.max_repeat || max > limits.max_repeat)
    throw GrammarError(fmt::format("repetition bound above the limit of {}", limits.max_repeat));
  if (max >= 0 && max < min) throw GrammarError(fmt::format("repetition {{{},{}}} has max < min", min, max));
  if (static_cast<int64_t>(body.size()) * std::max(min, max) > limits.max_symbols)
    throw GrammarError("repetition expands beyond the grammar size limit");
  // A body of one rule reference is shared by every copy; otherwise wrap it in a rule once.
  Symbol unit = (body.size() == 1) ? body[0] : Symbol::ref(add_rule(hint + "_item", {body}));
  for (int i = 0; i < min; ++i) out.push_back(unit);
  if (max < 0) {
    out.push_back(Symbol::ref(star(Alt{unit}, hint)));
    return;
  }
  // (max - min) optional copies, nested: opt_k ::= "" | unit opt_{k-1}
  int32_t next = -1;
  for (int k = 0; k < max - min; ++k) {
    Alt a{unit};
    if (next >= 0) a.push_back(Symbol::ref(next));
    next = add_rule(hint + "_rep", {Alt{}, std::move(a)});
  }
  if (next >= 0) out.push_back(Symbol::ref(next));
}

void Grammar::literal(std::string_view s, Alt& out) {
  for (unsigned char c : s) out.push_back(Symbol::byte(c));
}

uint32_t decode_utf8(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t n = s.size();
  unsigned char c = p[i];
  auto bad = [&]() -> uint32_t { throw GrammarError("invalid UTF-8", i); };
  if (c < 0x80) { ++i; return c; }
  int len = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > n) return bad();
  uint32_t cp = c & (0x7F >> len);
  for (int k = 1; k < len; ++k) {
    if ((p[i + k] & 0xC0) != 0x80) return bad();
    cp = (cp << 6) | (p[i + k] & 0x3F);
  }
  static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return bad();
  i += len;
  return cp;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xC0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(char(0xE0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (cp >> 18)));
    out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(char(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Splits [lo, hi] (same UTF-8 length) into byte-range sequences: each output is a list of
// (first, last) byte ranges, one per encoded byte, whose product is exactly a sub-range.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  static const uint32_t kLenMax[4] = {0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
  for (int k = 0; k < 3; ++k) {
    if (lo <= kLenMax[k] && hi > kLenMax[k]) {
      utf8_sequences(lo, kLenMax[k], out);
      utf8_sequences(kLenMax[k] + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back({{uint8_t(lo), uint8_t(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(lo, a);
  append_utf8(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t k = 0; k < a.size(); ++k) seq.push_back({uint8_t(a[k]), uint8_t(b[k])});
  out.push_back(std::move(seq));
}

}  // namespace

void Grammar::codepoints(std::vector<std::pair<uint32_t, uint32_t>> ranges, bool negate, Alt& out) {
  std::sort(ranges.begin(), ranges.end());
  // Merge, then complement if negated, then remove surrogates.
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (auto [a, b] : ranges) {
    if (a > b) throw GrammarError(fmt::format("character range U+{:04X}-U+{:04X} is out of order", a, b));
    b = std::min<uint32_t>(b, 0x10FFFF);
    if (!merged.empty() && a <= merged.back().second + 1)
      merged.back().second = std::max(merged.back().second, b);
    else
      merged.push_back({a, b});
  }
  if (negate) {
    std::vector<std::pair<uint32_t, uint32_t>> comp;
    uint32_t next = 0;
    for (auto [a, b] : merged) {
      if (a > next) comp.push_back({next, a - 1});
      next = b + 1;
    }
    if (next <= 0x10FFFF) comp.push_back({next, 0x10FFFF});
    merged = std::move(comp);
  }
  std::vector<std::pair<uint32_t, uint32_t>> valid;
  for (auto [a, b] : merged) {
    if (b < 0xD800 || a > 0xDFFF) {
      valid.push_back({a, b});
      continue;
    }
    if (a < 0xD800) valid.push_back({a, 0xD7FF});
    if (b > 0xDFFF) valid.push_back({0xE000, b});
  }
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
  for (auto [a, b] : valid) utf8_sequences(a, b, seqs);
  // ASCII-only (single-byte sequences) collapse into one byte set.
  ByteSet single;
  std::vector<Alt> multi;
  for (auto& s : seqs) {
    if (s.size() == 1) {
      for (int c = s[0].first; c <= s[0].second; ++c) single.set(c);
      continue;
    }
    Alt alt;
    for (auto [f, l] : s) {
      ByteSet bs;
      for (int c = f; c <= l; ++c) bs.set(c);
      alt.push_back(Symbol::set(bs));
    }
    multi.push_back(std::move(alt));
  }
  if (multi.empty()) {
    out.push_back(Symbol::set(single));  // may be empty: matches nothing
    return;
  }
  if (single.any()) multi.insert(multi.begin(), Alt{Symbol::set(single)});
  out.push_back(Symbol::ref(add_rule("char_class", std::move(multi))));
}

int64_t Grammar::num_symbols() const {
  int64_t n = 0;
  for (auto& r : rules)
    for (auto& a : r.alts) n += static_cast<int64_t>(a.size());
  return n;
}

namespace {
std::string byteset_text(const ByteSet& b) {
  if (b.count() == 1) {
    for (int c = 0; c < 256; ++c)
      if (b.test(c)) return (c >= 0x20 && c < 0x7F && c != '"' && c != '\\') ? fmt::format("\"{}\"", char(c))
                                                                              : fmt::format("\"\\x{:02x}\"", c);
  }
  std::string s = "[";
  for (int c = 0; c < 256;) {
    if (!b.test(c)) { ++c; continue; }
    int e = c;
    while (e + 1 < 256 && b.test(e + 1)) ++e;
    auto one = [](int x) {
      return (x >= 0x20 && x < 0x7F && x != ']' && x != '\\' && x != '-' && x != '^') ? std::string(1, char(x))
                                                                                       : fmt::format("\\x{:02x}", x);
    };
    s += one(c);
    if (e > c) s += "-" + one(e);
    c = e + 1;
  }
  return s + "]";
}
}  // namespace

std::string Grammar::to_string() const {
  std::string out;
  for (size_t r = 0; r < rules.size(); ++r) {
    out += fmt::format("{}{} ::=", rules[r].name, r);
    for (size_t a = 0; a < rules[r].alts.size(); ++a) {
      out += a ? " |" : "";
      if (rules[r].alts[a].empty()) out += " \"\"";
      for (auto& s : rules[r].alts[a])
        out += " " + (s.is_rule() ? rules[s.rule].name + std::to_string(s.rule) : byteset_text(s.bytes));
    }
    out += "\n";
  }
  return out;
}

std::vector<bool> Grammar::nullable() const {
  std::vector<bool> n(rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (n[r]) continue;
      for (auto& a : rules[r].alts) {
        bool all = std::all_of(a.begin(), a.end(), [&](const Symbol& s) { return s.is_rule() && n[s.rule]; });
        if (all) { n[r] = true; changed = true; break; }
      }
    }
  }
  return n;
}

void Grammar::check_no_left_recursion() const {
  std::vector<bool> nul = nullable();
  // Edges r -> s where s can be the first thing r expands to (all before it nullable).
  std::vector<std::vector<int32_t>> left(rules.size());
  for (size_t r = 0; r < rules.size(); ++r)
    for (auto& a : rules[r].alts)
      for (auto& s : a) {
        if (!s.is_rule()) break;
        left[r].push_back(s.rule);
        if (!nul[s.rule]) break;
      }
  // Iterative DFS cycle detection (0 = new, 1 = on stack, 2 = done).
  std::vector<uint8_t> mark(rules.size(), 0);
  for (size_t start = 0; start < rules.size(); ++start) {
    if (mark[start]) continue;
    std::vector<std::pair<int32_t, size_t>> st{{int32_t(start), 0}};
    mark[start] = 1;
    while (!st.empty()) {
      auto& [r, i] = st.back();
      if (i < left[r].size()) {
        int32_t s = left[r][i++];
        if (mark[s] == 1)
          throw GrammarError(fmt::format("rule '{}' is left-recursive (directly or through an empty-matching "
                                         "prefix, e.g. a repetition of something that can be empty); "
                                         "left recursion is not supported",
                                         rules[s].name));
        if (mark[s] == 0) { mark[s] = 1; st.push_back({s, 0}); }
      } else {
        mark[r] = 2;
        st.pop_back();
      }
    }
  }
}

Grammar grammar_from_choices(const std::vector<std::string>& choices) {
  if (choices.empty()) throw GrammarError("choice must be a non-empty list of strings");
  Grammar g;
  g.root = g.add_rule("root");
  std::vector<Alt> alts;
  for (auto& c : choices) {
    Alt a;
    Grammar::literal(c, a);
    alts.push_back(std::move(a));
  }
  g.rules[g.root].alts = std::move(alts);
  return g;
}

}  // namespace moeserve::structured
