#include "structured/json_numbers.h"

#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <map>
#include <tuple>

namespace moeserve::structured {
namespace {

int num_digits(int64_t v) {
  int n = 1;
  while (v >= 10) { v /= 10; ++n; }
  return n;
}

int64_t pow10(int w) {
  int64_t p = 1;
  while (w-- > 0) p *= 10;
  return p;
}

// Fixed-width decimal strings in [lo, hi] (leading zeros allowed) as digit-class sequences.
void range_fixed(int64_t lo, int64_t hi, int w, Alt prefix, std::vector<Alt>& out) {
  if (w == 0) { out.push_back(std::move(prefix)); return; }
  int64_t p = pow10(w - 1);
  int64_t dl = lo / p, dh = hi / p;
  auto with = [&](int a, int b) { Alt x = prefix; x.push_back(Symbol::set(digit_set(a, b))); return x; };
  if (dl == dh) { range_fixed(lo % p, hi % p, w - 1, with(int(dl), int(dl)), out); return; }
  if (lo % p != 0) { range_fixed(lo % p, p - 1, w - 1, with(int(dl), int(dl)), out); ++dl; }
  bool tail = hi % p != p - 1;
  if (tail) --dh;
  if (dl <= dh) {
    Alt x = with(int(dl), int(dh));
    for (int k = 1; k < w; ++k) x.push_back(Symbol::set(digit_set(0, 9)));
    out.push_back(std::move(x));
  }
  if (tail) range_fixed(0, hi % p, w - 1, with(int(hi / p), int(hi / p)), out);
}

// Fraction digit strings s compared by the value 0.s (so "5" == "50"). `rem` is how many
// digits may still be written (< 0: any). Each function returns the alternatives of its
// language (empty vector = no string), building helper rules as it recurses over the bound's
// digits (linear in the bound's length).
class FractionBuilder {
 public:
  FractionBuilder(Grammar& g) : g_(g) {}

  // [0-9]{min, rem}
  std::vector<Alt> any(int min, int rem) {
    if (rem >= 0 && rem < min) return {};
    Alt a;
    g_.repeat(Alt{Symbol::set(digit_set(0, 9))}, min, rem, "num_frac", a);
    return {a};
  }
  // Digit strings with a nonzero digit (value > 0): NZ(rem) ::= [1-9][0-9]{0,rem-1} | "0" NZ(rem-1).
  std::vector<Alt> nonzero(int rem) {
    if (rem == 0) return {};
    std::vector<Alt> alts;
    Alt first{Symbol::set(digit_set(1, 9))};
    g_.repeat(Alt{Symbol::set(digit_set(0, 9))}, 0, dec(rem), "num_frac", first);
    alts.push_back(std::move(first));
    if (rem < 0) {  // unbounded: one self-recursive rule
      int32_t r = g_.add_rule("num_nonzero");
      alts.push_back(Alt{Symbol::byte('0'), Symbol::ref(r)});
      g_.rules[r].alts = alts;
      return {Alt{Symbol::ref(r)}};
    }
    if (auto sub = rule(nonzero(rem - 1))) alts.push_back(Alt{Symbol::byte('0'), *sub});
    return alts;
  }
  // 0.s >= 0.a (> when !incl); `a` has no trailing zeros.
  std::vector<Alt> ge(const std::string& a, bool incl, int rem, bool allow_empty) {
    if (a.empty()) return incl ? any(allow_empty ? 0 : 1, rem) : nonzero(rem);
    if (rem == 0) return {};
    int c = a[0] - '0';
    std::vector<Alt> alts;
    if (c < 9) alts.push_back(digit_then_any(c + 1, 9, rem));
    if (auto sub = rule(ge(a.substr(1), incl, dec(rem), true))) alts.push_back(Alt{Symbol::byte('0' + c), *sub});
    return alts;
  }
  // 0.s <= 0.b (< when !incl).
  std::vector<Alt> le(const std::string& b, bool incl, int rem, bool allow_empty) {
    if (b.empty()) {  // only zeros
      if (!incl) return {};
      if (rem >= 0 && rem < (allow_empty ? 0 : 1)) return {};
      Alt a;
      g_.repeat(Alt{Symbol::byte('0')}, allow_empty ? 0 : 1, rem, "num_zeros", a);
      return {a};
    }
    std::vector<Alt> alts;
    if (allow_empty) alts.push_back(Alt{});  // value 0 < 0.b
    if (rem == 0) return alts;
    int c = b[0] - '0';
    if (c > 0) alts.push_back(digit_then_any(0, c - 1, rem));
    if (auto sub = rule(le(b.substr(1), incl, dec(rem), true))) alts.push_back(Alt{Symbol::byte('0' + c), *sub});
    return alts;
  }
  // 0.a <= 0.s <= 0.b (each end inclusive or not); requires 0.a <= 0.b.
  std::vector<Alt> between(const std::string& a, const std::string& b, bool ia, bool ib, int rem, bool allow_empty) {
    if (a.empty() && ia) return le(b, ib, rem, allow_empty);  // no lower constraint
    if (b.empty() || rem == 0) return {};                     // value must be > 0 and <= 0
    int ca = a.empty() ? 0 : a[0] - '0', cb = b[0] - '0';
    std::string ra = a.size() > 1 ? a.substr(1) : "", rb = b.substr(1);
    std::vector<Alt> alts;
    if (ca == cb) {
      if (auto sub = rule(between(ra, rb, ia, ib, dec(rem), true))) alts.push_back(Alt{Symbol::byte('0' + ca), *sub});
      return alts;
    }
    if (auto sub = rule(ge(ra, ia, dec(rem), true))) alts.push_back(Alt{Symbol::byte('0' + ca), *sub});
    if (cb - ca >= 2) alts.push_back(digit_then_any(ca + 1, cb - 1, rem));
    if (auto sub = rule(le(rb, ib, dec(rem), true))) alts.push_back(Alt{Symbol::byte('0' + cb), *sub});
    return alts;
  }

  std::optional<Symbol> rule(std::vector<Alt> alts) {
    if (alts.empty()) return std::nullopt;
    if (alts.size() == 1 && alts[0].size() == 1) return alts[0][0];
    return Symbol::ref(g_.add_rule("num_frac_range", std::move(alts)));
  }

 private:
  Grammar& g_;
  static int dec(int rem) { return rem < 0 ? -1 : rem - 1; }
  Alt digit_then_any(int lo, int hi, int rem) {  // [lo-hi][0-9]{0,rem-1}
    Alt a{Symbol::set(digit_set(lo, hi))};
    g_.repeat(Alt{Symbol::set(digit_set(0, 9))}, 0, dec(rem), "num_frac", a);
    return a;
  }
};

struct MagBound {  // a bound on the magnitude |x|
  int64_t ip = 0;
  std::string frac;
  bool incl = true;
};

// Unsigned decimals m with lower <= m <= upper (upper absent: unbounded). `bare_zero`: the
// spelling "0" (no fraction) may be written.
std::vector<Alt> magnitude_alts(Grammar& g, const MagBound& lo, const std::optional<MagBound>& hi,
                                const NumberCaps& caps, bool bare_zero) {
  FractionBuilder fb(g);
  const int rem = caps.max_frac_digits;
  std::vector<Alt> out;
  // Integer spellings `ints`, then nothing (when `bare`) or "." and the fraction language.
  auto emit = [&](std::vector<Alt> ints, bool bare, std::vector<Alt> frac) {
    std::optional<Symbol> f = fb.rule(std::move(frac));
    for (auto& i : ints) {
      if (bare) out.push_back(i);
      if (f) { Alt x = i; x.push_back(Symbol::byte('.')); x.push_back(*f); out.push_back(std::move(x)); }
    }
  };
  auto spell = [](int64_t v) { Alt a; Grammar::literal(std::to_string(v), a); return std::vector<Alt>{a}; };
  const bool lo_bare = lo.frac.empty() && lo.incl && (lo.ip != 0 || bare_zero);
  if (hi && hi->ip == lo.ip) {
    emit(spell(lo.ip), lo_bare && (!hi->frac.empty() || hi->incl), fb.between(lo.frac, hi->frac, lo.incl, hi->incl, rem, false));
    return out;
  }
  emit(spell(lo.ip), lo_bare, fb.ge(lo.frac, lo.incl, rem, false));
  std::vector<Alt> middle;
  if (!hi) natural_range(g, lo.ip + 1, -1, middle, caps.max_int_digits);
  else if (lo.ip + 1 <= hi->ip - 1) natural_range(g, lo.ip + 1, hi->ip - 1, middle);
  if (!middle.empty()) emit(std::move(middle), true, fb.any(1, rem));
  if (hi) emit(spell(hi->ip), !hi->frac.empty() || hi->incl, fb.le(hi->frac, hi->incl, rem, false));
  return out;
}

bool is_zero(const Decimal& d) { return d.ip == 0 && d.frac.empty(); }

}  // namespace

ByteSet digit_set(int lo, int hi) {
  ByteSet b;
  for (int d = lo; d <= hi; ++d) b.set('0' + d);
  return b;
}

void natural_range(Grammar& g, int64_t lo, int64_t hi, std::vector<Alt>& out, int max_digits) {
  int dlo = num_digits(lo);
  int dhi = hi < 0 ? dlo : num_digits(hi);
  for (int d = dlo; d <= dhi; ++d) {
    int64_t a = std::max<int64_t>(lo, d == 1 ? 0 : pow10(d - 1));
    int64_t b = (hi < 0 || d < dhi) ? pow10(d) - 1 : std::min<int64_t>(hi, pow10(d) - 1);
    if (a <= b) range_fixed(a, b, d, {}, out);
  }
  if (hi < 0 && (max_digits <= 0 || max_digits > dhi)) {  // any number with more than dhi digits
    Alt x{Symbol::set(digit_set(1, 9))};
    g.repeat(Alt{Symbol::set(digit_set(0, 9))}, dhi, max_digits <= 0 ? -1 : max_digits - 1, "int_digits", x);
    out.push_back(std::move(x));
  }
}

void natural_multiples(Grammar& g, int64_t lo, int64_t hi, int64_t m, std::vector<Alt>& out) {
  // The pieces of natural_range: digit-class sequences, the last one (hi < 0) followed by any
  // number of further digits.
  std::vector<Alt> pieces;
  const int dlo = num_digits(lo), dhi = hi < 0 ? dlo : num_digits(hi);
  for (int d = dlo; d <= dhi; ++d) {
    int64_t a = std::max<int64_t>(lo, d == 1 ? 0 : pow10(d - 1));
    int64_t b = (hi < 0 || d < dhi) ? pow10(d) - 1 : std::min<int64_t>(hi, pow10(d) - 1);
    if (a <= b) range_fixed(a, b, d, {}, pieces);
  }
  std::vector<bool> open(pieces.size(), false);
  if (hi < 0) {  // [1-9][0-9]{dhi} then any digits
    Alt x{Symbol::set(digit_set(1, 9))};
    for (int k = 0; k < dhi; ++k) x.push_back(Symbol::set(digit_set(0, 9)));
    pieces.push_back(std::move(x));
    open.push_back(true);
  }
  // Digits of `set` grouped by the remainder they lead to from r.
  auto groups = [&](const ByteSet& set, int64_t r) {
    std::map<int64_t, ByteSet> by_target;
    for (int dg = 0; dg <= 9; ++dg)
      if (set.test('0' + dg)) by_target[(10 * r + dg) % m].set('0' + dg);
    return by_target;
  };
  // tail[r]: digit strings (possibly empty) taking remainder r to 0; never empty, since
  // appending k digits with 10^k >= m reaches every remainder. Built for every r at once (the
  // rules refer to each other; no recursion, so m does not grow the stack).
  const size_t first_rule = g.rules.size();
  auto budget = [&] {
    if (g.rules.size() - first_rule > 60000)
      throw GrammarError(fmt::format("'multipleOf' {} with these bounds needs more than 60000 grammar rules", m));
  };
  std::vector<int32_t> tail;
  auto tail_of = [&](int64_t r) {
    if (tail.empty()) {
      for (int64_t k = 0; k < m; ++k) tail.push_back(g.add_rule("int_mod_tail"));
      budget();
      for (int64_t k = 0; k < m; ++k) {
        std::vector<Alt> alts;
        if (k == 0) alts.push_back(Alt{});
        for (auto& [r2, set] : groups(digit_set(0, 9), k)) alts.push_back(Alt{Symbol::set(set), Symbol::ref(tail[r2])});
        g.rules[tail[k]].alts = std::move(alts);
      }
    }
    return tail[r];
  };
  int32_t eps = -1;
  // Piece suffixes of only [0-9] are shared between pieces: key (-digits left, open, r).
  // Memo values: the rule, or -1 for "no string".
  std::map<std::tuple<int64_t, bool, int64_t>, int32_t> shared;
  const ByteSet all = digit_set(0, 9);
  for (size_t p = 0; p < pieces.size(); ++p) {
    const Alt& seq = pieces[p];
    std::vector<bool> full(seq.size() + 1, true);  // seq[pos..] all [0-9]
    for (size_t k = seq.size(); k-- > 0;) full[k] = full[k + 1] && seq[k].bytes == all;
    std::map<std::tuple<int64_t, bool, int64_t>, int32_t> memo;
    // from(pos, r): the rest of the piece from position pos with remainder r so far (depth:
    // the piece's length, at most 19).
    std::function<int32_t(size_t, int64_t)> from = [&](size_t pos, int64_t r) -> int32_t {
      if (pos == seq.size()) {
        if (open[p]) return tail_of(r);
        if (r != 0) return -1;
        if (eps < 0) eps = g.add_rule("int_mod_end", {Alt{}});
        return eps;
      }
      auto& table = full[pos] ? shared : memo;
      const auto key = std::make_tuple(int64_t(seq.size() - pos), bool(open[p]), r);
      if (auto it = table.find(key); it != table.end()) return it->second;
      std::vector<Alt> alts;
      for (auto& [r2, set] : groups(seq[pos].bytes, r))
        if (int32_t rest = from(pos + 1, r2); rest >= 0) alts.push_back(Alt{Symbol::set(set), Symbol::ref(rest)});
      int32_t res = alts.empty() ? -1 : g.add_rule("int_mod", std::move(alts));
      budget();
      return table[key] = res;
    };
    if (int32_t s0 = from(0, 0); s0 >= 0) out.push_back(Alt{Symbol::ref(s0)});
  }
}

Decimal parse_decimal(const nlohmann::ordered_json& v, const char* key) {
  if (!v.is_number()) throw GrammarError(fmt::format("'{}' must be a number", key));
  auto range_error = [&] {
    return GrammarError(fmt::format("'{}' is out of the supported range (|value| <= 1e17, at most 40 decimals)", key));
  };
  const double d = v.get<double>();
  if (!std::isfinite(d) || std::fabs(d) > 1e17) throw range_error();
  // Integers as written; doubles as their shortest round-trip spelling (json's dump).
  const std::string text = v.is_number_float() ? nlohmann::ordered_json(d).dump() : v.dump();
  Decimal out;
  size_t i = 0;
  if (i < text.size() && text[i] == '-') { out.neg = true; ++i; }
  std::string digits;
  int point = -1;
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
    if (text[i] == '.') point = static_cast<int>(digits.size());
    else digits.push_back(text[i]);
  }
  if (point < 0) point = static_cast<int>(digits.size());
  if (i < text.size()) point += std::stoi(text.substr(i + 1));
  if (point < -40 || point > 18) throw range_error();
  if (point < 0) { digits.insert(0, size_t(-point), '0'); point = 0; }
  if (point > static_cast<int>(digits.size())) digits.append(size_t(point) - digits.size(), '0');
  out.ip = point == 0 ? 0 : std::stoll(digits.substr(0, size_t(point)));
  out.frac = digits.substr(size_t(point));
  while (!out.frac.empty() && out.frac.back() == '0') out.frac.pop_back();
  if (out.frac.size() > 40) throw range_error();
  if (is_zero(out)) out.neg = false;
  return out;
}

int compare(const Decimal& a, const Decimal& b) {
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  int mag = 0;
  if (a.ip != b.ip) mag = a.ip < b.ip ? -1 : 1;
  else {
    size_t n = std::max(a.frac.size(), b.frac.size());
    for (size_t k = 0; k < n && mag == 0; ++k) {
      char x = k < a.frac.size() ? a.frac[k] : '0', y = k < b.frac.size() ? b.frac[k] : '0';
      if (x != y) mag = x < y ? -1 : 1;
    }
  }
  return a.neg ? -mag : mag;
}

std::vector<Alt> number_range_alts(Grammar& g, const std::optional<NumberBound>& lo,
                                   const std::optional<NumberBound>& hi, const NumberCaps& caps) {
  if (lo && hi) {
    int c = compare(lo->value, hi->value);
    if (c > 0 || (c == 0 && !(lo->inclusive && hi->inclusive)))
      throw GrammarError("number bounds admit no value (minimum above maximum)");
  }
  auto mag = [](const NumberBound& b) { return MagBound{b.value.ip, b.value.frac, b.inclusive}; };
  std::vector<Alt> out;
  // x >= 0: magnitudes from max(lo, 0) to hi.
  if (!hi || !hi->value.neg) {
    if (!(hi && is_zero(hi->value) && !hi->inclusive)) {
      MagBound from = (lo && !lo->value.neg) ? mag(*lo) : MagBound{};
      std::optional<MagBound> to;
      if (hi) to = mag(*hi);
      out = magnitude_alts(g, from, to, caps, true);
    }
  }
  // x < 0 (and "-0.0..."): "-" then magnitudes from max(-hi, 0) to -lo.
  if (!lo || lo->value.neg) {
    MagBound from;
    if (hi && hi->value.neg) from = mag(*hi);
    else if (hi && is_zero(hi->value)) from.incl = hi->inclusive;
    std::optional<MagBound> to;
    if (lo) to = mag(*lo);
    for (auto& a : magnitude_alts(g, from, to, caps, false)) {
      Alt x{Symbol::byte('-')};
      x.insert(x.end(), a.begin(), a.end());
      out.push_back(std::move(x));
    }
  }
  if (out.empty()) throw GrammarError("number bounds admit no value");
  return out;
}

}  // namespace moeserve::structured
