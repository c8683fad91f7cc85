#include "tokenizer/pre_tokenizer.h"

#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {
namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& b) {
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  fail("tokenizer.json: unknown split behavior '{}'", b);
}

struct Span {
  size_t b, e;
  bool match;
};

// Turns match spans into the full partition of [0, n) like HF's Pattern::find_matches.
void partition(size_t n, const std::vector<std::pair<size_t, size_t>>& m, std::vector<Span>& out) {
  out.clear();
  if (n == 0) {
    out.push_back({0, 0, false});
    return;
  }
  size_t prev = 0;
  for (auto [b, e] : m) {
    if (prev != b) out.push_back({prev, b, false});
    out.push_back({b, e, true});
    prev = e;
  }
  if (prev != n) out.push_back({prev, n, false});
}

// HF NormalizedString::split: applies the behaviour to the partition, in place.
void apply_behavior(std::vector<Span>& spans, Behavior beh) {
  std::vector<Span> acc;
  acc.reserve(spans.size());
  bool prev_match = false;
  switch (beh) {
    case Behavior::Isolated:
      return;
    case Behavior::Removed:
      for (auto& s : spans)
        if (!s.match) acc.push_back(s);
      break;
    case Behavior::MergedWithPrevious:
      for (auto& s : spans) {
        if (s.match && !prev_match) {
          if (!acc.empty()) acc.back().e = s.e;
          else acc.push_back({s.b, s.e, true});
        } else {
          acc.push_back({s.b, s.e, false});
        }
        prev_match = s.match;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->match && !prev_match) {
          if (!acc.empty()) acc.back().b = it->b;
          else acc.push_back({it->b, it->e, true});
        } else {
          acc.push_back({it->b, it->e, false});
        }
        prev_match = it->match;
      }
      std::reverse(acc.begin(), acc.end());
      break;
    case Behavior::Contiguous:
      for (auto& s : spans) {
        if (s.match == prev_match && !acc.empty()) acc.back().e = s.e;
        else acc.push_back({s.b, s.e, false});
        prev_match = s.match;
      }
      break;
  }
  spans.swap(acc);
}

// Generic splitter: `find` fills the matches of one piece.
using FindFn = std::function<void(std::string_view, std::vector<std::pair<size_t, size_t>>&)>;

void split_pieces(std::vector<Piece>& pieces, const FindFn& find, Behavior beh, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 4);
  std::vector<std::pair<size_t, size_t>> m;
  std::vector<Span> spans;
  for (auto& p : pieces) {
    m.clear();
    find(p.text, m);
    partition(p.text.size(), m, spans);
    if (invert)
      for (auto& s : spans) s.match = !s.match;
    apply_behavior(spans, beh);
    for (auto& s : spans) {
      if (s.e == s.b) continue;
      if (s.b == 0 && s.e == p.text.size()) {
        out.push_back(std::move(p));
        break;
      }
      out.push_back({p.text.substr(s.b, s.e - s.b), p.at_start && s.b == 0});
    }
  }
  pieces.swap(out);
}

// Char-predicate pattern: every matching character is its own match (HF `Fn(char) -> bool`).
FindFn char_pattern(std::function<bool(char32_t)> pred) {
  return [pred](std::string_view s, std::vector<std::pair<size_t, size_t>>& m) {
    size_t i = 0;
    while (i < s.size()) {
      size_t b = i;
      if (pred(next_cp(s, i))) m.emplace_back(b, i);
    }
  };
}

FindFn regex_pattern(std::shared_ptr<Regex> re) {
  return [re](std::string_view s, std::vector<std::pair<size_t, size_t>>& m) { re->find_all(s, m); };
}

struct Split final : PreTokenizer {
  FindFn find;
  Behavior beh;
  bool invert;
  void apply(std::vector<Piece>& pieces) const override { split_pieces(pieces, find, beh, invert); }
};

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteLevel final : PreTokenizer {
  bool add_prefix_space = false;
  std::shared_ptr<Regex> re;  // null when use_regex is false
  void apply(std::vector<Piece>& pieces) const override {
    if (add_prefix_space)
      for (auto& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, " ");
    if (re) split_pieces(pieces, regex_pattern(re), Behavior::Isolated, false);
    const auto& t = byte_to_utf8();
    for (auto& p : pieces) {
      std::string out;
      out.reserve(p.text.size() + p.text.size() / 2);
      for (unsigned char b : p.text) out.append(t[b]);
      p.text.swap(out);
    }
  }
};

struct Metaspace final : PreTokenizer {
  std::string rep;
  char32_t rep_cp = 0x2581;
  enum class Scheme { Always, Never, First } scheme = Scheme::Always;
  bool split = true;
  void apply(std::vector<Piece>& pieces) const override {
    for (auto& p : pieces) {
      std::string out;
      out.reserve(p.text.size() + rep.size());
      for (char c : p.text) {
        if (c == ' ') out.append(rep);
        else out.push_back(c);
      }
      bool starts = out.compare(0, rep.size(), rep) == 0;
      if (!starts && (scheme == Scheme::Always || (scheme == Scheme::First && p.at_start))) out.insert(0, rep);
      p.text.swap(out);
    }
    if (split) {
      char32_t rc = rep_cp;
      split_pieces(pieces, char_pattern([rc](char32_t c) { return c == rc; }), Behavior::MergedWithNext, false);
    }
  }
};

// HF UnicodeScripts: a piece starts at every character whose script differs from the last
// non-"Any" script; text before the first such character is dropped (HF's split ranges
// start there), so a piece of only "Any" characters (spaces) vanishes, as in HF.
struct UnicodeScripts final : PreTokenizer {
  void apply(std::vector<Piece>& pieces) const override {
    std::vector<Piece> out;
    out.reserve(pieces.size() * 2);
    std::vector<size_t> cuts;
    for (auto& p : pieces) {
      cuts.clear();
      int last = -2;  // none yet
      size_t i = 0;
      while (i < p.text.size()) {
        size_t b = i;
        int s = script_class(next_cp(p.text, i));
        if (s != -1 && s != last) cuts.push_back(b);
        if (s != -1) last = s;
      }
      cuts.push_back(p.text.size());
      for (size_t k = 0; k + 1 < cuts.size(); ++k)
        out.push_back({p.text.substr(cuts[k], cuts[k + 1] - cuts[k]), p.at_start && cuts[k] == 0});
    }
    pieces.swap(out);
  }
};

struct Sequence final : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> items;
  void apply(std::vector<Piece>& pieces) const override {
    for (auto& p : items) p->apply(pieces);
  }
};

std::unique_ptr<PreTokenizer> make_split(FindFn f, Behavior b, bool invert = false) {
  auto s = std::make_unique<Split>();
  s->find = std::move(f);
  s->beh = b;
  s->invert = invert;
  return s;
}

}  // namespace

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  MS_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), "pre_tokenizer without a 'type': {}",
           j.dump().substr(0, 200));
  std::string type = j["type"].get<std::string>();
  if (type == "Split") {
    std::shared_ptr<Regex> re = make_pattern(j.at("pattern"), "pre_tokenizer Split");
    return make_split(regex_pattern(re), parse_behavior(j.at("behavior").get<std::string>()), j.value("invert", false));
  }
  if (type == "ByteLevel") {
    auto b = std::make_unique<ByteLevel>();
    b->add_prefix_space = j.value("add_prefix_space", true);
    if (j.value("use_regex", true)) b->re = std::make_shared<Regex>(kGpt2Pattern, false);
    return b;
  }
  if (type == "Digits") {
    bool individual = j.value("individual_digits", false);
    return make_split(char_pattern(is_numeric), individual ? Behavior::Isolated : Behavior::Contiguous);
  }
  if (type == "Whitespace") {
    // HF: split on \w+|[^\w\s]+ inverted with Removed == keep only the matches.
    std::shared_ptr<Regex> re = std::make_shared<Regex>(R"(\w+|[^\w\s]+)", false);
    return make_split(regex_pattern(re), Behavior::Removed, true);
  }
  if (type == "WhitespaceSplit") return make_split(char_pattern(is_white_space), Behavior::Removed);
  if (type == "Punctuation") {
    std::string beh = j.value("behavior", "Isolated");
    return make_split(char_pattern(is_punctuation), parse_behavior(beh));
  }
  if (type == "CharDelimiterSplit") {
    std::string d = j.at("delimiter").get<std::string>();
    size_t i = 0;
    MS_CHECK(!d.empty(), "tokenizer.json: CharDelimiterSplit with an empty delimiter");
    char32_t c = next_cp(d, i);
    return make_split(char_pattern([c](char32_t x) { return x == c; }), Behavior::Removed);
  }
  if (type == "BertPreTokenizer") {
    auto s = std::make_unique<Sequence>();
    s->items.push_back(make_split(char_pattern(is_white_space), Behavior::Removed));
    s->items.push_back(make_split(char_pattern(is_punctuation), Behavior::Isolated));
    return s;
  }
  if (type == "Metaspace") {
    auto m = std::make_unique<Metaspace>();
    std::string rep = j.value("replacement", std::string("\xE2\x96\x81"));
    MS_CHECK(!rep.empty(), "tokenizer.json: Metaspace with an empty replacement");
    size_t i = 0;
    m->rep_cp = next_cp(rep, i);
    m->rep = rep.substr(0, i);
    std::string scheme = j.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
    if (scheme == "always") m->scheme = Metaspace::Scheme::Always;
    else if (scheme == "never") m->scheme = Metaspace::Scheme::Never;
    else if (scheme == "first") m->scheme = Metaspace::Scheme::First;
    else fail("tokenizer.json: Metaspace prepend_scheme '{}' unknown", scheme);
    m->split = j.value("split", true);
    return m;
  }
  if (type == "UnicodeScripts") return std::make_unique<UnicodeScripts>();
  if (type == "Sequence") {
    auto s = std::make_unique<Sequence>();
    for (auto& p : j.at("pretokenizers")) {
      auto item = make_pre_tokenizer(p);
      if (item) s->items.push_back(std::move(item));
    }
    return s;
  }
  fail("unsupported pre_tokenizer type '{}'", type);
}

}  // namespace moeserve::tok
