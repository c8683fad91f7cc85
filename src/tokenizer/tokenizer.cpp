// Loading tokenizer.json and the encode/decode pipeline (mirrors HF `tokenizers`):
//   text -> split on non-normalized added tokens -> normalize the rest -> split on
//   normalized added tokens -> pre-tokenize -> BPE per piece -> post-process.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <climits>
#include <optional>
#include <unordered_map>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/bounded_json.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"

namespace moeserve {

void AddedMatcher::add(std::string pattern, size_t token_index) {
  if (pattern.empty()) return;
  by_first_[static_cast<unsigned char>(pattern[0])].emplace_back(std::move(pattern), token_index);
  ++count_;
}

void AddedMatcher::finalize() {
  for (auto& v : by_first_)
    std::stable_sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.first.size() > b.first.size(); });
}

void AddedMatcher::find(std::string_view s, std::vector<Match>& out) const {
  size_t i = 0;
  while (i < s.size()) {
    const auto& cands = by_first_[static_cast<unsigned char>(s[i])];
    bool hit = false;
    for (const auto& [p, idx] : cands) {
      if (s.compare(i, p.size(), p) == 0) {
        out.push_back({i, i + p.size(), idx});
        i += p.size();
        hit = true;
        break;
      }
    }
    if (!hit) ++i;
  }
}

const std::string* Tokenizer::Impl::token_of(int32_t id) const {
  if (auto it = added_by_id.find(id); it != added_by_id.end()) return &added[it->second].content;
  return model->id_to_token(id);
}

std::string Tokenizer::Impl::decode_tokens(std::vector<std::string>& tokens) const {
  if (decoder) {
    decoder->decode_chain(tokens);
    std::string out;
    for (auto& t : tokens) out += t;
    return out;
  }
  std::string out;
  for (size_t k = 0; k < tokens.size(); ++k) {
    if (k) out.push_back(' ');
    out += tokens[k];
  }
  return out;
}

Tokenizer::Tokenizer() : impl_(std::make_unique<Impl>()) {}
Tokenizer::~Tokenizer() = default;


std::shared_ptr<const Tokenizer> Tokenizer::from_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MS_CHECK(f.good(), "cannot open tokenizer file '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return from_json_string(ss.str(), path);
}

std::shared_ptr<const Tokenizer> Tokenizer::from_json_string(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = parse_json_bounded(text, origin);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", origin, e.what());
  }
  return from_parsed(j, nullptr, origin);
}

std::shared_ptr<Tokenizer> Tokenizer::from_parsed(const nlohmann::json& j, std::unique_ptr<tok::Model> model,
                                                  const std::string& origin) {
  std::shared_ptr<Tokenizer> t(new Tokenizer());
  Impl& im = *t->impl_;
  try {
    MS_CHECK(j.is_object(), "the top level must be a JSON object");
    MS_CHECK(model || (j.contains("model") && !j["model"].is_null()), "no 'model' (the tokenizer model: BPE, WordPiece, WordLevel or Unigram)");
    if (j.contains("truncation") && !j["truncation"].is_null())
      spdlog::warn("{}: 'truncation' is ignored", origin);
    if (j.contains("padding") && !j["padding"].is_null()) spdlog::warn("{}: 'padding' is ignored", origin);
    im.normalizer = tok::make_normalizer(j.value("normalizer", nlohmann::json()));
    im.pre = tok::make_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()));
    im.model = model ? std::move(model) : tok::make_model(j["model"]);
    im.post = tok::make_post_processor(j.value("post_processor", nlohmann::json()));
    im.decoder = tok::make_decoder(j.value("decoder", nlohmann::json()));
    im.max_id = im.model->max_id();

    // Added tokens: ids follow HF AddedVocabulary::add_tokens (a token already in the
    // model keeps its id; a new one gets the next id after the vocab / previous added).
    int32_t model_size = static_cast<int32_t>(im.model->vocab_entries());
    int32_t max_added = -1;
    const nlohmann::json no_added = nlohmann::json::array();
    const nlohmann::json& added_json = j.contains("added_tokens") && !j["added_tokens"].is_null() ? j["added_tokens"] : no_added;
    MS_CHECK(added_json.is_array(), "'added_tokens' must be an array");
    std::unordered_map<int64_t, std::string> listed_ids;  // id field -> content, to catch collisions
    for (size_t k = 0; k < added_json.size(); ++k) {
      const auto& a = added_json[k];
      MS_CHECK(a.is_object() && a.contains("content") && a["content"].is_string(),
               "added_tokens[{}] must be an object with a string 'content'", k);
      AddedToken at;
      at.content = a["content"].get<std::string>();
      at.special = a.value("special", false);
      at.lstrip = a.value("lstrip", false);
      at.rstrip = a.value("rstrip", false);
      at.single_word = a.value("single_word", false);
      at.normalized = a.value("normalized", !at.special);
      MS_CHECK(tok::find_invalid_utf8(at.content) == std::string::npos, "added_tokens[{}] is not UTF-8", k);
      if (at.content.empty()) continue;
      std::optional<int64_t> listed;
      if (a.contains("id") && !a["id"].is_null()) {
        MS_CHECK(a["id"].is_number_integer(), "added_tokens[{}] ('{}'): id must be an integer", k, at.content);
        listed = a["id"].get<int64_t>();
        auto [it, fresh] = listed_ids.emplace(*listed, at.content);
        MS_CHECK(fresh || it->second == at.content, "added tokens '{}' and '{}' both have id {}", it->second, at.content, *listed);
      }
      if (at.special) im.special_set.insert(at.content);
      if (im.added_by_content.count(at.content)) continue;
      if (auto mid = im.model->token_to_id(at.content)) {
        at.id = *mid;
      } else if (max_added < 0) {
        at.id = model_size;
      } else {
        at.id = (max_added >= model_size || model_size == 0) ? max_added + 1 : model_size;
      }
      if (listed && *listed != at.id) {
        // HF re-assigns such a token (and only warns). When the listed id belongs to another
        // model token the file is inconsistent with the model: the embedding row of that id
        // is the other token's, so refuse it.
        const std::string* other = *listed >= 0 && *listed <= INT32_MAX ? im.model->id_to_token(static_cast<int32_t>(*listed)) : nullptr;
        MS_CHECK(other == nullptr, "added token '{}' has id {}, which the model vocab gives to '{}'", at.content, *listed, *other);
        spdlog::warn("{}: added token '{}' listed with id {} gets id {} (HF rule)", origin, at.content, *listed, at.id);
      }
      max_added = std::max(max_added, at.id);
      im.max_id = std::max(im.max_id, at.id);
      im.added_by_content[at.content] = at.id;
      im.added_by_id[at.id] = im.added.size();
      im.added.push_back(at);
    }
    for (size_t k = 0; k < im.added.size(); ++k) {
      AddedToken& at = im.added[k];
      at.match = at.content;
      if (at.normalized) {
        if (im.normalizer) im.normalizer->normalize(at.match);
        im.norm_matcher.add(at.match, k);
      } else {
        im.raw_matcher.add(at.content, k);
      }
    }
    im.raw_matcher.finalize();
    im.norm_matcher.finalize();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", origin, e.what());
  } catch (const Error& e) {
    fail("{}: {}", origin, e.what());
  }
  return t;
}

namespace {

struct Segment {
  std::string_view text;
  size_t offset;       // in the string it was cut from
  int32_t token = -1;  // added-token id, or -1 for text
};

bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = 0;
  return tok::is_word_char(tok::next_cp(s, i));
}
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size();
  return tok::is_word_char(tok::prev_cp(s, i));
}
// Offset where the trailing whitespace of s begins.
size_t trailing_space_start(std::string_view s) {
  size_t e = s.size();
  while (e > 0) {
    size_t k = e;
    if (!tok::is_white_space(tok::prev_cp(s, k))) break;
    e = k;
  }
  return e;
}
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t k = i;
    if (!tok::is_white_space(tok::next_cp(s, k))) break;
    i = k;
  }
  return i;
}

// HF AddedVocabulary::find_matches: the matches with single_word / lstrip / rstrip applied.
void split_added(const Tokenizer::Impl& im, const AddedMatcher& m, std::string_view s, std::vector<Segment>& out) {
  if (s.empty()) return;
  if (m.empty()) {
    out.push_back({s, 0, -1});
    return;
  }
  std::vector<AddedMatcher::Match> matches;
  m.find(s, matches);
  size_t start_offset = 0;
  for (const auto& mt : matches) {
    const AddedToken& at = im.added[mt.tok];
    size_t start = mt.b, stop = mt.e;
    if (at.single_word) {
      bool start_space = start == 0 || !ends_with_word(s.substr(0, start));
      bool stop_space = stop == s.size() || !starts_with_word(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (at.lstrip) start = std::max(trailing_space_start(s.substr(0, start)), start_offset);
    if (at.rstrip) stop += leading_space_len(s.substr(stop));
    if (start_offset < start) out.push_back({s.substr(start_offset, start - start_offset), start_offset, -1});
    out.push_back({s.substr(start, stop - start), start, at.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({s.substr(start_offset), start_offset, -1});
}

void encode_text(const Tokenizer::Impl& im, std::string_view text, std::vector<int32_t>& ids);
}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& im = *impl_;
  size_t bad = tok::find_invalid_utf8(text);
  MS_CHECK(bad == std::string_view::npos, "tokenize: input is not valid UTF-8 (invalid byte 0x{:02X} at offset {})",
           static_cast<unsigned>(static_cast<unsigned char>(text[bad])), bad);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (!im.tiktoken_pieces) {
    encode_text(im, text, ids);
  } else {
    std::vector<std::string_view> parts;
    tok::tiktoken_pieces(text, parts);
    for (auto part : parts) encode_text(im, part, ids);
  }
  if (add_special_tokens && im.post) im.post->process(ids);
  return ids;
}

namespace {
// Added-token split, normalisation, pre-tokenisation and the model on one text.
void encode_text(const Tokenizer::Impl& im, std::string_view text, std::vector<int32_t>& ids) {
  std::vector<Segment> raw;
  split_added(im, im.raw_matcher, text, raw);
  std::vector<tok::Piece> pieces;
  std::vector<Segment> norm;
  for (const auto& seg : raw) {
    if (seg.token >= 0) {
      ids.push_back(seg.token);
      continue;
    }
    std::string normalized(seg.text);
    if (im.normalizer) im.normalizer->normalize(normalized);
    norm.clear();
    split_added(im, im.norm_matcher, normalized, norm);
    for (const auto& ns : norm) {
      if (ns.token >= 0) {
        ids.push_back(ns.token);
        continue;
      }
      pieces.clear();
      pieces.push_back({std::string(ns.text), seg.offset == 0 && ns.offset == 0});
      if (im.pre) im.pre->apply(pieces);
      for (const auto& p : pieces) im.model->tokenize(p.text, ids);
    }
  }
}
}  // namespace

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* t = im.token_of(id);
    if (!t) continue;
    if (skip_special_tokens && im.is_special_token(*t)) continue;
    tokens.push_back(*t);
  }
  return im.decode_tokens(tokens);
}

size_t Tokenizer::vocab_size() const { return static_cast<size_t>(impl_->max_id + 1); }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(token); it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  const std::string* t = impl_->token_of(id);
  if (!t) return std::nullopt;
  return *t;
}

bool Tokenizer::is_special(int32_t id) const {
  const std::string* t = impl_->token_of(id);
  return t && impl_->is_special_token(*t);
}

}  // namespace moeserve
