#include "tokenizer/model.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/unigram.h"
#include "tokenizer/wordpiece.h"

namespace moeserve::tok {

void Vocab::load(const nlohmann::json& vocab, const char* model_name) {
  MS_CHECK(vocab.is_object(), "model.vocab of a {} model must be an object {{token: id}}, got {}", model_name,
           vocab.type_name());
  map.reserve(vocab.size());
  // Ids are dense in real files; allow holes, but not ids so large that the reverse table
  // would take gigabytes (a corrupt file, not a tokenizer).
  const int64_t limit = static_cast<int64_t>(vocab.size()) + (int64_t{1} << 20);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    MS_CHECK(it.value().is_number_integer(), "model.vocab: id of token '{}' is not an integer: {}", it.key(),
             it.value().dump());
    int64_t id = it.value().get<int64_t>();
    MS_CHECK(id >= 0 && id < limit, "model.vocab: id {} of token '{}' is out of range (the vocab has {} entries)", id,
             it.key(), vocab.size());
    map[it.key()] = static_cast<int32_t>(id);
    max_id = std::max(max_id, static_cast<int32_t>(id));
  }
  by_id.assign(static_cast<size_t>(max_id + 1), nullptr);
  for (auto& [tok, id] : map) {
    const std::string*& slot = by_id[static_cast<size_t>(id)];
    MS_CHECK(slot == nullptr, "model.vocab: tokens '{}' and '{}' both have id {}", *slot, tok, id);
    slot = &tok;
  }
}

bool WordCache::get(std::string_view word, std::vector<int32_t>& out) const {
  Shard& sh = shards_[std::hash<std::string_view>{}(word) % kShards];
  std::lock_guard<std::mutex> lk(sh.mu);
  auto it = sh.map.find(word);
  if (it == sh.map.end()) return false;
  out.insert(out.end(), it->second.begin(), it->second.end());
  return true;
}

void WordCache::put(std::string_view word, const int32_t* ids, size_t n) const {
  Shard& sh = shards_[std::hash<std::string_view>{}(word) % kShards];
  std::lock_guard<std::mutex> lk(sh.mu);
  if (sh.map.size() >= kMaxPerShard) sh.map.clear();
  sh.map.emplace(std::string(word), std::vector<int32_t>(ids, ids + n));
}

std::unique_ptr<Model> make_model(const nlohmann::json& m) {
  MS_CHECK(m.is_object(), "'model' must be an object, got {}", m.type_name());
  std::string type;
  if (m.contains("type")) {
    MS_CHECK(m["type"].is_string(), "model.type must be a string");
    type = m["type"].get<std::string>();
  } else if (m.contains("merges")) {
    type = "BPE";  // HF's untagged fallback: the fields say which model it is
  } else if (m.contains("vocab") && m["vocab"].is_array()) {
    type = "Unigram";
  } else if (m.contains("continuing_subword_prefix") || m.contains("max_input_chars_per_word")) {
    type = "WordPiece";
  } else {
    type = "WordLevel";
  }
  if (type == "BPE") return std::make_unique<Bpe>(m);
  if (type == "WordPiece") return std::make_unique<WordPiece>(m);
  if (type == "WordLevel") return std::make_unique<WordLevel>(m);
  if (type == "Unigram") return std::make_unique<Unigram>(m);
  fail("unsupported model type '{}' (BPE, WordPiece, WordLevel and Unigram are supported)", type);
}

}  // namespace moeserve::tok
