// Kimi's tiktoken tokenizer (tokenization_kimi.py), loaded when a model folder has
// tiktoken.model and no tokenizer.json:
//   tiktoken.model        one "BASE64(token bytes) RANK" per line; rank = token id
//   tokenizer_config.json added_tokens_decoder {"163584": {"content": "[BOS]", ...}, ...}
// tokenization_kimi.py builds tiktoken.Encoding(pat_str=<the regex below>, mergeable_ranks,
// special_tokens) with 256 special ids right after the base tokens, named from
// added_tokens_decoder or "<|reserved_token_{id}|>", and encodes 400k-character pieces split
// into runs of at most 25k (non-)whitespace characters, each with allowed_special="all".
//
// Here the pieces run through the ordinary pipeline (tokenizer.cpp): special tokens split out
// (the added-token matcher), the regex Split, the GPT-2 byte-level map (so token strings, the
// decoder and id_to_token are those of HF's byte-level tokenizers), and TiktokenModel: rank BPE
// over the bytes of each regex piece exactly as tiktoken's byte_pair_merge (a piece that is a
// token is that token; else repeatedly merge the adjacent pair whose concatenation has the
// lowest rank, leftmost on ties).
#include <fstream>
#include "core/bounded_json.h"
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <sys/stat.h>

#include "core/error.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace moeserve {

namespace tok {
namespace {

// tokenization_kimi.py's pat_str uses class intersection ("[X&&[^\p{Han}]]"), which PCRE2 has
// not. Each intersection class is rewritten as "(?:(?!\p{Han})[X])": one character that is in X
// and is not Han, the definition of the intersection. Both \p{Han} (here and in the Rust engine
// tiktoken uses) are Script_Extensions=Han. tests/tokenizer/test_kimi_tokenizer.py checks the
// rewrite against the original under tiktoken and ours against tiktoken.
#define KIMI_NOT_HAN_UPPER "(?:(?!\\p{Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}])"
#define KIMI_NOT_HAN_LOWER "(?:(?!\\p{Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}])"
#define KIMI_SUFFIX "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
constexpr const char* kKimiPattern =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?" KIMI_NOT_HAN_UPPER "*" KIMI_NOT_HAN_LOWER "+" KIMI_SUFFIX
    "|[^\\r\\n\\p{L}\\p{N}]?" KIMI_NOT_HAN_UPPER "+" KIMI_NOT_HAN_LOWER "*" KIMI_SUFFIX
    "|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
#undef KIMI_NOT_HAN_UPPER
#undef KIMI_NOT_HAN_LOWER
#undef KIMI_SUFFIX

constexpr int kNumSpecial = 256;  // tokenization_kimi.py num_reserved_special_tokens

int b64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}
// Standard base64 with '=' padding; nullopt on anything else.
std::optional<std::string> b64_decode(std::string_view s) {
  if (s.size() % 4 != 0) return std::nullopt;
  std::string out;
  for (size_t i = 0; i < s.size(); i += 4) {
    int v[4];
    int pad = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s[i + k];
      if (c == '=' && i + 4 == s.size() && k >= 2) {
        v[k] = 0, ++pad;
        continue;
      }
      if (pad) return std::nullopt;  // data after '='
      v[k] = b64_value(c);
      if (v[k] < 0) return std::nullopt;
    }
    const uint32_t w = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    out.push_back(char(w >> 16));
    if (pad < 2) out.push_back(char((w >> 8) & 0xFF));
    if (pad < 1) out.push_back(char(w & 0xFF));
  }
  return out;
}

std::string to_byte_level(std::string_view bytes) {
  std::string s;
  for (unsigned char b : bytes) s += byte_to_utf8()[b];
  return s;
}

class TiktokenModel final : public Model {
 public:
  explicit TiktokenModel(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    MS_CHECK(f.good(), "cannot open '{}'", path);
    std::string line;
    size_t lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      const size_t sp = line.find(' ');
      MS_CHECK(sp != std::string::npos && sp > 0, "{} line {}: expected 'BASE64 RANK'", path, lineno);
      auto bytes = b64_decode(std::string_view(line).substr(0, sp));
      MS_CHECK(bytes && !bytes->empty(), "{} line {}: the token is not base64", path, lineno);
      int64_t rank = -1;
      try {
        size_t used = 0;
        rank = std::stoll(line.substr(sp + 1), &used);
        MS_CHECK(used == line.size() - sp - 1, "trailing text");
      } catch (const std::exception&) {
        fail("{} line {}: the rank is not an integer", path, lineno);
      }
      MS_CHECK(rank >= 0 && rank < (int64_t{1} << 24), "{} line {}: rank {} is out of range", path, lineno, rank);
      auto [it, fresh] = ranks_.emplace(std::move(*bytes), int32_t(rank));
      MS_CHECK(fresh, "{} line {}: the token appears twice", path, lineno);
      max_id_ = std::max(max_id_, int32_t(rank));
    }
    MS_CHECK(!ranks_.empty(), "{}: no tokens", path);
    by_id_.assign(size_t(max_id_) + 1, std::string());
    std::vector<bool> seen(by_id_.size(), false);
    for (auto& [bytes, rank] : ranks_) {
      MS_CHECK(!seen[size_t(rank)], "{}: two tokens have rank {}", path, rank);
      seen[size_t(rank)] = true;
      by_id_[size_t(rank)] = to_byte_level(bytes);
      by_token_[by_id_[size_t(rank)]] = rank;
    }
    // Every byte must be a token, or some text could not be encoded (tiktoken would fail).
    for (int b = 0; b < 256; ++b)
      MS_CHECK(ranks_.count(std::string(1, char(b))), "{}: byte 0x{:02X} is not a token", path, b);
  }
  size_t num_tokens() const { return ranks_.size(); }

  void tokenize(std::string_view word, std::vector<int32_t>& out) const override {
    // `word` is byte-level mapped (pre-tokenizer); back to bytes.
    std::string bytes;
    for (size_t i = 0; i < word.size();) bytes.push_back(char(cp_to_byte(next_cp(word, i))));
    if (auto it = ranks_.find(bytes); it != ranks_.end()) {
      out.push_back(it->second);
      return;
    }
    if (bytes.size() <= WordCache::kMaxWordLen && cache_.get(bytes, out)) return;
    const size_t first = out.size();
    merge(bytes, out);
    if (bytes.size() <= WordCache::kMaxWordLen) cache_.put(bytes, out.data() + first, out.size() - first);
  }
  std::optional<int32_t> token_to_id(std::string_view t) const override {
    auto it = by_token_.find(t);
    if (it == by_token_.end()) return std::nullopt;
    return it->second;
  }
  const std::string* id_to_token(int32_t id) const override {
    if (id < 0 || size_t(id) >= by_id_.size() || by_id_[size_t(id)].empty()) return nullptr;
    return &by_id_[size_t(id)];
  }
  size_t vocab_entries() const override { return ranks_.size(); }
  int32_t max_id() const override { return max_id_; }

 private:
  int32_t rank_of(std::string_view s) const {
    auto it = ranks_.find(s);
    return it == ranks_.end() ? std::numeric_limits<int32_t>::max() : it->second;
  }
  // tiktoken byte_pair_merge: parts are boundaries; pair_rank[i] = rank(bytes[b[i], b[i+2])).
  void merge(const std::string& s, std::vector<int32_t>& out) const {
    constexpr int32_t kNone = std::numeric_limits<int32_t>::max();
    std::vector<size_t> b(s.size() + 1);
    for (size_t i = 0; i <= s.size(); ++i) b[i] = i;
    std::vector<int32_t> pr(s.size() + 1, kNone);
    auto pair_rank = [&](size_t i) {
      return i + 2 < b.size() ? rank_of(std::string_view(s).substr(b[i], b[i + 2] - b[i])) : kNone;
    };
    for (size_t i = 0; i + 1 < b.size(); ++i) pr[i] = pair_rank(i);
    for (;;) {
      size_t best = 0;
      int32_t best_rank = kNone;
      for (size_t i = 0; i + 1 < b.size(); ++i)
        if (pr[i] < best_rank) best_rank = pr[i], best = i;
      if (best_rank == kNone) break;
      b.erase(b.begin() + long(best) + 1);
      pr.erase(pr.begin() + long(best) + 1);
      pr[best] = pair_rank(best);
      if (best > 0) pr[best - 1] = pair_rank(best - 1);
    }
    for (size_t i = 0; i + 1 < b.size(); ++i) {
      const int32_t r = rank_of(std::string_view(s).substr(b[i], b[i + 1] - b[i]));
      MS_CHECK(r != kNone, "tiktoken: a merged piece is not a token (inconsistent ranks)");
      out.push_back(r);
    }
  }

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ranks_;  // raw bytes -> rank
  std::vector<std::string> by_id_;                                                // byte-level strings
  StringIdMap by_token_;
  int32_t max_id_ = -1;
  WordCache cache_;
};

bool file_exists(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

// Python str.isspace().
static bool py_isspace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

void tiktoken_pieces(std::string_view s, std::vector<std::string_view>& out) {
  constexpr size_t kMaxEncodeChars = 400'000, kMaxRun = 25'000;  // tokenization_kimi.py
  size_t i = 0;
  while (i < s.size()) {
    // One 400k-character chunk [i, end), then _split_whitespaces_or_nonwhitespaces on it.
    size_t end = i, chars = 0;
    while (end < s.size() && chars < kMaxEncodeChars) end += utf8_len_of_lead(static_cast<unsigned char>(s[end])), ++chars;
    size_t k = i, start = i, run = 0;
    bool run_space = false;
    if (k < end) {
      size_t t = k;
      run_space = py_isspace(next_cp(s, t));
    }
    while (k < end) {
      size_t next = k;
      const bool sp = py_isspace(next_cp(s, next));
      if (sp != run_space) {
        run = 1, run_space = sp;
      } else if (++run > kMaxRun) {
        out.push_back(s.substr(start, k - start));
        start = k, run = 1;
      }
      k = next;
    }
    out.push_back(s.substr(start, end - start));
    i = end;
  }
}

}  // namespace tok

std::shared_ptr<const Tokenizer> Tokenizer::from_tiktoken(const std::string& model_path, const std::string& config_path) {
  std::unique_ptr<tok::TiktokenModel> model;
  nlohmann::json added = nlohmann::json::array();
  try {
    model = std::make_unique<tok::TiktokenModel>(model_path);
    const int32_t base = int32_t(model->num_tokens());
    MS_CHECK(model->max_id() + 1 == base, "{}: ranks must be 0..{} without holes (tokenization_kimi.py puts the special "
             "tokens right after them)", model_path, base - 1);
    // added_tokens_decoder names some of the 256 special ids; the rest are reserved.
    std::map<int64_t, std::string> names;
    if (!config_path.empty()) {
      std::ifstream f(config_path, std::ios::binary);
      MS_CHECK(f.good(), "cannot open '{}'", config_path);
      std::stringstream ss;
      ss << f.rdbuf();
      nlohmann::json cfg;
      try {
        cfg = parse_json_bounded(ss.str(), config_path);
      } catch (const nlohmann::json::exception& e) {
        fail("{}: not valid JSON: {}", config_path, e.what());
      }
      if (cfg.is_object() && cfg.contains("added_tokens_decoder")) {
        const auto& atd = cfg["added_tokens_decoder"];
        MS_CHECK(atd.is_object(), "{}: added_tokens_decoder must be an object", config_path);
        for (auto it = atd.begin(); it != atd.end(); ++it) {
          int64_t id = -1;
          try {
            id = std::stoll(it.key());
          } catch (const std::exception&) {
          }
          MS_CHECK(id >= base && id < base + tok::kNumSpecial,
                   "{}: added_tokens_decoder id '{}' is outside the special ids {}..{}", config_path, it.key(), base,
                   base + tok::kNumSpecial - 1);
          MS_CHECK(it.value().is_object() && it.value().contains("content") && it.value()["content"].is_string(),
                   "{}: added_tokens_decoder['{}'] has no string 'content'", config_path, it.key());
          names[id] = it.value()["content"].get<std::string>();
        }
      }
    }
    for (int32_t id = base; id < base + tok::kNumSpecial; ++id) {
      auto it = names.find(id);
      const std::string content = it != names.end() ? it->second : "<|reserved_token_" + std::to_string(id) + "|>";
      added.push_back({{"id", id}, {"content", content}, {"special", true}, {"normalized", false}});
    }
  } catch (const Error& e) {
    fail("tiktoken tokenizer: {}", e.what());
  }
  nlohmann::json j = {
      {"model", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", tok::kKimiPattern}}}, {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}}},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}},
      {"added_tokens", added}};
  auto t = from_parsed(j, std::move(model), model_path);
  t->impl_->tiktoken_pieces = true;
  return t;
}

std::shared_ptr<const Tokenizer> Tokenizer::from_dir(const std::string& dir) {
  if (tok::file_exists(dir + "/tokenizer.json") || !tok::file_exists(dir + "/tiktoken.model"))
    return from_file(dir + "/tokenizer.json");
  const std::string cfg = dir + "/tokenizer_config.json";
  return from_tiktoken(dir + "/tiktoken.model", tok::file_exists(cfg) ? cfg : "");
}

}  // namespace moeserve
