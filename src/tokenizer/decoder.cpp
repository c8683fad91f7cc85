#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace moeserve::tok {
namespace {

// Tokens -> bytes through the GPT-2 map; a token with a character outside the map is
// taken as its raw UTF-8. The whole byte string is then decoded lossily (one token out).
struct ByteLevelDec final : Decoder {
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (auto& t : tokens) {
      size_t mark = bytes.size();
      size_t i = 0;
      bool ok = true;
      while (i < t.size()) {
        int b = cp_to_byte(next_cp(t, i));
        if (b < 0) {
          ok = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!ok) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

// HF: every replacement character becomes a space, except in the first token, where
// (unless prepend_scheme is "never") they are all dropped.
struct MetaspaceDec final : Decoder {
  std::string rep;
  bool strip_first = true;  // prepend_scheme != never
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string out;
      const std::string& t = tokens[k];
      bool drop = k == 0 && strip_first;
      for (size_t i = 0; i < t.size();) {
        if (t.compare(i, rep.size(), rep) == 0) {
          if (!drop) out.push_back(' ');
          i += rep.size();
        } else {
          out.push_back(t[i++]);
        }
      }
      tokens[k].swap(out);
    }
  }
};

int hex_val(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "<0xXX>" -> byte (Rust u8::from_str_radix also accepts a leading '+').
int byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  if (t[3] == '+') return hex_val(t[4]);
  int h = hex_val(t[3]), l = hex_val(t[4]);
  return h < 0 || l < 0 ? -1 : h * 16 + l;
}

struct ByteFallbackDec final : Decoder {
  bool groups_byte_tokens() const override { return true; }
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (find_invalid_utf8(pending) == std::string::npos) out.push_back(pending);
      else
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back("\xEF\xBF\xBD");
      pending.clear();
    };
    for (auto& t : tokens) {
      int b = byte_token(t);
      if (b >= 0) {
        pending.push_back(static_cast<char>(b));
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }
};

struct FuseDec final : Decoder {
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string all;
    for (auto& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

struct StripDec final : Decoder {
  char32_t content;
  size_t start, stop;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<size_t, char32_t>> cps;  // (byte offset, code point)
      for (size_t i = 0; i < t.size();) {
        size_t b = i;
        cps.emplace_back(b, next_cp(t, i));
      }
      size_t start_cut = 0;
      for (size_t i = 0; i < start && i < cps.size(); ++i) {
        if (cps[i].second != content) break;
        start_cut = i + 1;
      }
      size_t stop_cut = cps.size();
      for (size_t i = 0; i < stop && i < cps.size(); ++i) {
        size_t idx = cps.size() - i - 1;
        if (cps[idx].second != content) break;
        stop_cut = idx;
      }
      if (stop_cut <= start_cut) {
        t.clear();
        continue;
      }
      size_t b = start_cut < cps.size() ? cps[start_cut].first : t.size();
      size_t e = stop_cut < cps.size() ? cps[stop_cut].first : t.size();
      t = t.substr(b, e - b);
    }
  }
};

struct ReplaceDec final : Decoder {
  std::unique_ptr<Regex> re;
  std::string content;
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::pair<size_t, size_t>> m;
    for (auto& t : tokens) {
      m.clear();
      re->find_all(t, m);
      if (m.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (auto [b, e] : m) {
        out.append(t, prev, b - prev);
        out += content;
        prev = e;
      }
      out.append(t, prev, std::string::npos);
      t.swap(out);
    }
  }
};

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty() || s.find(from) == std::string::npos) return;
  std::string out;
  size_t prev = 0, k;
  while ((k = s.find(from, prev)) != std::string::npos) {
    out.append(s, prev, k - prev);
    out.append(to);
    prev = k + from.size();
  }
  out.append(s, prev, std::string::npos);
  s.swap(out);
}

// HF wordpiece::cleanup (the BERT detokenizer's spacing fixes), applied in this order.
void wordpiece_cleanup(std::string& s) {
  static const std::pair<const char*, const char*> kRules[] = {
      {" .", "."},   {" ?", "?"},     {" !", "!"},          {" ,", ","},   {" ' ", "'"},  {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto& [from, to] : kRules) replace_all(s, from, to);
}

// WordPiece decoder: tokens after the first lose their prefix ("##") or get a leading space.
struct WordPieceDec final : Decoder {
  std::string prefix = "##";
  bool cleanup = true;
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string& t = tokens[k];
      if (k != 0) {
        if (t.compare(0, prefix.size(), prefix) == 0) t.erase(0, prefix.size());
        else t.insert(0, " ");
      }
      if (cleanup) wordpiece_cleanup(t);
    }
  }
};

// CTC decoder: collapse repeats, drop the pad token, word delimiter -> ' ' (with cleanup).
struct CtcDec final : Decoder {
  std::string pad = "<pad>", delim = "|";
  bool cleanup = true;
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    for (size_t k = 0; k < tokens.size(); ++k) {
      if (k > 0 && tokens[k] == tokens[k - 1]) continue;
      std::string t = tokens[k];
      replace_all(t, pad, "");
      if (cleanup) {
        wordpiece_cleanup(t);
        replace_all(t, delim, " ");
      }
      if (!t.empty()) out.push_back(std::move(t));
    }
    tokens.swap(out);
  }
};

// BPEDecoder: the end-of-word suffix becomes a space, except in the last token.
struct BpeDec final : Decoder {
  std::string suffix = "</w>";
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t k = 0; k < tokens.size(); ++k) replace_all(tokens[k], suffix, k + 1 == tokens.size() ? "" : " ");
  }
};

struct SequenceDec final : Decoder {
  std::vector<std::unique_ptr<Decoder>> items;
  bool groups_byte_tokens() const override {
    for (auto& d : items)
      if (d->groups_byte_tokens()) return true;
    return false;
  }
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& d : items) d->decode_chain(tokens);
  }
};

struct TemplatePost final : PostProcessor {
  // Single-sequence template: each item is a fixed id list or the sequence itself.
  std::vector<std::vector<int32_t>> items;  // empty vector marks the sequence slot
  std::vector<bool> is_seq;
  void process(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 8);
    for (size_t k = 0; k < items.size(); ++k) {
      if (is_seq[k]) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), items[k].begin(), items[k].end());
    }
    ids.swap(out);
  }
};

struct NoopPost final : PostProcessor {
  void process(std::vector<int32_t>&) const override {}
};

struct SequencePost final : PostProcessor {
  std::vector<std::unique_ptr<PostProcessor>> items;
  void process(std::vector<int32_t>& ids) const override {
    for (auto& p : items) p->process(ids);
  }
};

// Roberta/Bert: `cls` + ids + `sep`; the JSON stores each as [token, id].
std::unique_ptr<PostProcessor> wrap_post(const nlohmann::json& j) {
  auto t = std::make_unique<TemplatePost>();
  t->items = {{j.at("cls").at(1).get<int32_t>()}, {}, {j.at("sep").at(1).get<int32_t>()}};
  t->is_seq = {false, true, false};
  return t;
}

}  // namespace

std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  MS_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), "decoder without a 'type': {}", j.dump().substr(0, 200));
  std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return std::make_unique<ByteLevelDec>();
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDec>();
  if (type == "Fuse") return std::make_unique<FuseDec>();
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDec>();
    std::string rep = j.value("replacement", std::string("\xE2\x96\x81"));
    MS_CHECK(!rep.empty(), "tokenizer.json: Metaspace decoder with an empty replacement");
    size_t i = 0;
    next_cp(rep, i);
    d->rep = rep.substr(0, i);
    std::string scheme = j.value("prepend_scheme", std::string());
    if (scheme.empty()) scheme = j.value("add_prefix_space", true) ? "always" : "never";
    d->strip_first = scheme != "never";
    return d;
  }
  if (type == "Strip") {
    auto d = std::make_unique<StripDec>();
    std::string c = j.at("content").get<std::string>();
    MS_CHECK(!c.empty(), "tokenizer.json: Strip decoder with empty content");
    size_t i = 0;
    d->content = next_cp(c, i);
    d->start = j.value("start", size_t{0});
    d->stop = j.value("stop", size_t{0});
    return d;
  }
  if (type == "Replace") {
    auto d = std::make_unique<ReplaceDec>();
    d->re = make_pattern(j.at("pattern"), "decoder Replace");
    d->content = j.at("content").get<std::string>();
    return d;
  }
  if (type == "WordPiece") {
    auto d = std::make_unique<WordPieceDec>();
    d->prefix = j.value("prefix", std::string("##"));
    d->cleanup = j.value("cleanup", true);
    return d;
  }
  if (type == "CTC") {
    auto d = std::make_unique<CtcDec>();
    d->pad = j.value("pad_token", std::string("<pad>"));
    d->delim = j.value("word_delimiter_token", std::string("|"));
    d->cleanup = j.value("cleanup", true);
    return d;
  }
  if (type == "BPEDecoder") {
    auto d = std::make_unique<BpeDec>();
    d->suffix = j.value("suffix", std::string("</w>"));
    return d;
  }
  if (type == "Sequence") {
    auto d = std::make_unique<SequenceDec>();
    for (auto& x : j.at("decoders")) {
      auto item = make_decoder(x);
      if (item) d->items.push_back(std::move(item));
    }
    return d;
  }
  fail("unsupported decoder type '{}'", type);
}

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j) {
  if (j.is_null()) return nullptr;
  MS_CHECK(j.is_object() && j.contains("type") && j["type"].is_string(), "post_processor without a 'type': {}",
           j.dump().substr(0, 200));
  std::string type = j["type"].get<std::string>();
  if (type == "ByteLevel") return std::make_unique<NoopPost>();
  if (type == "RobertaProcessing" || type == "BertProcessing") return wrap_post(j);
  if (type == "TemplateProcessing") {
    auto t = std::make_unique<TemplatePost>();
    const auto& specials = j.at("special_tokens");
    for (const auto& item : j.at("single")) {
      if (item.contains("Sequence")) {
        t->items.emplace_back();
        t->is_seq.push_back(true);
      } else if (item.contains("SpecialToken")) {
        std::string id = item["SpecialToken"].at("id").get<std::string>();
        MS_CHECK(specials.contains(id), "tokenizer.json: TemplateProcessing special token '{}' not in special_tokens", id);
        t->items.push_back(specials[id].at("ids").get<std::vector<int32_t>>());
        t->is_seq.push_back(false);
      } else {
        fail("tokenizer.json: TemplateProcessing item {} not understood", item.dump());
      }
    }
    return t;
  }
  if (type == "Sequence") {
    auto s = std::make_unique<SequencePost>();
    for (auto& x : j.at("processors")) {
      auto item = make_post_processor(x);
      if (item) s->items.push_back(std::move(item));
    }
    return s;
  }
  fail("unsupported post_processor type '{}'", type);
}

}  // namespace moeserve::tok
