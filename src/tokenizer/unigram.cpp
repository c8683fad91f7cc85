#include "tokenizer/unigram.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {

namespace {
constexpr double kUnkPenalty = 10.0;

// HF reads scores with serde_json's default float parser, which is not correctly rounded:
// it takes the decimal digits as a u64 significand s and a power of ten e and returns
// f64(s) * 10^e or f64(s) / 10^-e (10^k from a correctly rounded table), so some scores end up
// one ulp away from the correctly rounded value. Viterbi ties between equal-sum paths then
// break differently, so moeserve reproduces HF's value. nlohmann has already parsed the
// number (correctly rounded); tokenizer.json files are written with the shortest round-trip
// digits (ryu), so the shortest representation of that double gives back the digits.
double serde_json_f64(double d) {
  if (!std::isfinite(d) || d == 0) return d;
  char buf[48];
  for (int prec = 1; prec <= 17; ++prec) {
    std::snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf = [-]D[.DDD]e[+-]XX
  const char* p = buf;
  bool neg = *p == '-';
  if (neg) ++p;
  uint64_t sig = 0;
  int ndig = 0;
  for (; *p && *p != 'e'; ++p) {
    if (*p == '.') continue;
    sig = sig * 10 + static_cast<uint64_t>(*p - '0');
    ++ndig;
  }
  int exp = std::atoi(p + 1) - (ndig - 1);
  static const std::vector<double> pow10 = [] {
    std::vector<double> t(309);
    for (int k = 0; k <= 308; ++k) t[static_cast<size_t>(k)] = std::strtod(("1e" + std::to_string(k)).c_str(), nullptr);
    return t;
  }();
  double f = static_cast<double>(sig);
  for (;;) {
    int a = exp < 0 ? -exp : exp;
    if (a <= 308) {
      f = exp >= 0 ? f * pow10[static_cast<size_t>(a)] : f / pow10[static_cast<size_t>(a)];
      break;
    }
    if (exp >= 0) return d;  // out of range for serde too; keep the value
    f /= 1e308;
    exp += 308;
  }
  return neg ? -f : f;
}
}  // namespace

Unigram::Unigram(const nlohmann::json& m) {
  MS_CHECK(m.contains("vocab") && m["vocab"].is_array(), "Unigram model: 'vocab' must be an array of [piece, score]");
  const auto& v = m["vocab"];
  pieces_.reserve(v.size());
  scores_.reserve(v.size());
  min_score_ = std::numeric_limits<double>::infinity();
  for (size_t k = 0; k < v.size(); ++k) {
    const auto& e = v[k];
    MS_CHECK(e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_number(),
             "Unigram model: vocab[{}] must be [piece, score], got {}", k, e.dump());
    pieces_.push_back(e[0].get<std::string>());
    scores_.push_back(e[1].is_number_float() ? serde_json_f64(e[1].get<double>()) : e[1].get<double>());
    min_score_ = std::min(min_score_, scores_.back());
  }
  if (m.contains("unk_id") && !m["unk_id"].is_null()) {
    MS_CHECK(m["unk_id"].is_number_unsigned(), "Unigram model: unk_id must be a non-negative integer");
    size_t u = m["unk_id"].get<size_t>();
    MS_CHECK(!pieces_.empty(), "Unigram model: the vocabulary is empty but unk_id is set");
    MS_CHECK(u < pieces_.size(), "Unigram model: unk_id {} is out of range (the vocab has {} pieces)", u, pieces_.size());
    unk_id_ = static_cast<int32_t>(u);
  }
  byte_fallback_ = m.value("byte_fallback", false);
  MS_CHECK(pieces_.size() < (size_t{1} << 31), "Unigram model: vocab too large");
  ids_.reserve(pieces_.size());
  for (size_t id = 0; id < pieces_.size(); ++id) {
    const std::string& p = pieces_[id];
    ids_[p] = static_cast<int32_t>(id);
    int32_t node = 0;
    for (unsigned char b : p) {
      int32_t c = child(node, b);
      if (c < 0) {
        c = static_cast<int32_t>(node_piece_.size());
        node_piece_.push_back(-1);
        edges_.emplace((static_cast<uint64_t>(node) << 8) | b, c);
      }
      node = c;
    }
    if (!p.empty()) node_piece_[static_cast<size_t>(node)] = static_cast<int32_t>(id);
  }
  byte_ids_.assign(256, -1);
  for (int b = 0; b < 256; ++b) {
    auto it = ids_.find(fmt::format("<0x{:02X}>", b));
    if (it != ids_.end()) byte_ids_[static_cast<size_t>(b)] = it->second;
  }
}

std::optional<int32_t> Unigram::token_to_id(std::string_view t) const {
  auto it = ids_.find(t);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

const std::string* Unigram::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return nullptr;
  return &pieces_[static_cast<size_t>(id)];
}

void Unigram::encode_pieces(std::string_view s, std::vector<std::string_view>& out) const {
  // best[e]: best path ending at byte e (score, start of its last piece, piece id).
  struct Node {
    double score = 0;
    int64_t start = -1;
    int32_t id = 0;
  };
  const size_t n = s.size();
  const double unk_score = min_score_ - kUnkPenalty;
  std::vector<Node> best(n + 1);
  size_t start = 0;
  while (start < n) {
    const double here = best[start].score;
    const size_t mblen = utf8_len_of_lead(static_cast<unsigned char>(s[start]));
    bool single = false;
    int32_t node = 0;
    for (size_t e = start; e < n; ++e) {  // common-prefix search, shortest first
      node = child(node, static_cast<unsigned char>(s[e]));
      if (node < 0) break;
      int32_t pid = node_piece_[static_cast<size_t>(node)];
      if (pid < 0) continue;
      // A duplicated piece scores with the id its string maps to (HF looks it up again).
      int32_t id = ids_.find(pieces_[static_cast<size_t>(pid)])->second;
      double cand = scores_[static_cast<size_t>(id)] + here;
      Node& t = best[e + 1];
      if (t.start < 0 || cand > t.score) t = {cand, static_cast<int64_t>(start), id};
      if (e + 1 - start == mblen) single = true;
    }
    if (!single) {
      Node& t = best[start + mblen];
      double cand = unk_score + here;
      if (t.start < 0 || cand > t.score) {
        MS_CHECK(unk_id_ >= 0, "Unigram: encountered an unknown character but the model has no unk_id");
        t = {cand, static_cast<int64_t>(start), unk_id_};
      }
    }
    start += mblen;
  }
  // Backtrack; runs of unk nodes are fused into one piece.
  std::vector<std::string_view> rev;
  size_t end = n, unk_end = 0;
  bool in_unk = false;
  while (end > 0) {
    const Node& nd = best[end];
    size_t b = static_cast<size_t>(nd.start);
    if (unk_id_ >= 0 && nd.id == unk_id_) {
      if (!in_unk) unk_end = end, in_unk = true;
    } else {
      if (in_unk) rev.push_back(s.substr(end, unk_end - end)), in_unk = false;
      rev.push_back(s.substr(b, end - b));
    }
    end = b;
  }
  if (in_unk) rev.push_back(s.substr(0, unk_end));
  out.assign(rev.rbegin(), rev.rend());
}

void Unigram::tokenize(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  bool cacheable = word.size() <= WordCache::kMaxWordLen;
  if (cacheable && cache_.get(word, out)) return;
  std::vector<std::string_view> pieces;
  encode_pieces(word, pieces);
  size_t first = out.size();
  for (std::string_view p : pieces) {
    if (auto it = ids_.find(p); it != ids_.end()) {
      out.push_back(it->second);
      continue;
    }
    if (byte_fallback_) {
      bool ok = true;
      for (unsigned char c : p) ok = ok && byte_ids_[c] >= 0;
      if (ok) {
        for (unsigned char c : p) out.push_back(byte_ids_[c]);
        continue;
      }
    }
    MS_CHECK(unk_id_ >= 0, "Unigram: encountered an unknown piece but the model has no unk_id");
    out.push_back(unk_id_);
  }
  if (cacheable) cache_.put(word, out.data() + first, out.size() - first);
}

}  // namespace moeserve::tok
