// The `model` of tokenizer.json: BPE (bpe.cpp), WordPiece and WordLevel (wordpiece.cpp),
// Unigram (unigram.cpp), behind one interface. Also the helpers they share: the
// {token: id} vocab loader with its checks and a sharded word -> ids cache.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace moeserve::tok {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of one pre-tokenized word. Throws moeserve::Error where HF fails
  // (e.g. an unknown word and no unk token).
  virtual void tokenize(std::string_view word, std::vector<int32_t>& out) const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view t) const = 0;
  virtual const std::string* id_to_token(int32_t id) const = 0;
  virtual size_t vocab_entries() const = 0;  // HF Model::get_vocab_size
  virtual int32_t max_id() const = 0;
};

// Builds the model named by `type` (or guessed from the fields, as HF's untagged
// deserializer does). Throws moeserve::Error naming an unknown type.
std::unique_ptr<Model> make_model(const nlohmann::json& model);

// {token: id} object -> map + reverse table. Rejects negative ids, ids far past the vocab
// size (they would make the reverse table huge) and two tokens sharing an id.
struct Vocab {
  StringIdMap map;
  std::vector<const std::string*> by_id;  // index = id; nullptr for holes
  int32_t max_id = -1;
  void load(const nlohmann::json& vocab, const char* model_name);
  std::optional<int32_t> find(std::string_view t) const {
    auto it = map.find(t);
    if (it == map.end()) return std::nullopt;
    return it->second;
  }
  const std::string* token(int32_t id) const {
    return id < 0 || static_cast<size_t>(id) >= by_id.size() ? nullptr : by_id[static_cast<size_t>(id)];
  }
};

// Base of the models whose vocabulary is a plain {token: id} map (BPE, WordPiece,
// WordLevel): the lookups every such model answers the same way.
class VocabModel : public Model {
 public:
  std::optional<int32_t> token_to_id(std::string_view t) const override { return vocab_.find(t); }
  const std::string* id_to_token(int32_t id) const override { return vocab_.token(id); }
  size_t vocab_entries() const override { return vocab_.map.size(); }
  int32_t max_id() const override { return vocab_.max_id; }

 protected:
  Vocab vocab_;
};

// word -> ids cache, sharded so concurrent encodes do not serialise on one lock.
class WordCache {
 public:
  WordCache() : shards_(new Shard[kShards]) {}
  bool get(std::string_view word, std::vector<int32_t>& out) const;
  void put(std::string_view word, const int32_t* ids, size_t n) const;
  static constexpr size_t kMaxWordLen = 256;

 private:
  static constexpr size_t kShards = 16;
  static constexpr size_t kMaxPerShard = 16384;
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> map;
  };
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace moeserve::tok
