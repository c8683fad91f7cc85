#include "tools/bench_serve/dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "core/bounded_json.h"

namespace moeserve::bench {

namespace {

// Common English words for the tokenizer-free fallback (most are one token in BPE vocabularies).
const char* const kWords[] = {
    "the",   "of",    "and",   "to",    "in",    "is",    "you",   "that",  "it",    "he",    "was",  "for",
    "on",    "are",   "as",    "with",  "his",   "they",  "at",    "be",    "this",  "have",  "from", "or",
    "one",   "had",   "by",    "word",  "but",   "not",   "what",  "all",   "were",  "we",    "when", "your",
    "can",   "said",  "there", "use",   "an",    "each",  "which", "she",   "do",    "how",   "their", "if",
    "will",  "up",    "other", "about", "out",   "many",  "then",  "them",  "these", "so",    "some", "her",
    "would", "make",  "like",  "him",   "into",  "time",  "has",   "look",  "two",   "more",  "write", "go",
    "see",   "number", "no",   "way",   "could", "people", "my",   "than",  "first", "water", "been", "call",
    "who",   "oil",   "its",   "now",   "find",  "long",  "down",  "day",   "did",   "get",   "come", "made"};

int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // inclusive
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

int64_t count_tokens(const Tokenizer* tok, const std::string& text) {
  if (tok) return static_cast<int64_t>(tok->encode(text, /*add_special_tokens=*/false).size());
  std::istringstream ss(text);
  int64_t n = 0;
  for (std::string w; ss >> w;) ++n;
  return n;
}

std::vector<SampleRequest> sample_random(const DatasetOptions& o, const Tokenizer* tok, std::string* note) {
  const double r = o.random_range_ratio;
  MS_CHECK(r >= 0.0 && r < 1.0, "--random-range-ratio must be in [0, 1), got {}", r);
  MS_CHECK(o.random_input_len >= 1 && o.random_output_len >= 1, "--random-input-len and --random-output-len must be >= 1");
  const int64_t num_special = tok ? static_cast<int64_t>(tok->encode("", /*add_special_tokens=*/true).size()) : 0;
  const int64_t real_in = std::max<int64_t>(0, o.random_input_len - num_special);
  const int64_t in_lo = static_cast<int64_t>(std::floor(real_in * (1 - r)));
  const int64_t in_hi = static_cast<int64_t>(std::ceil(real_in * (1 + r)));
  const int64_t out_lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(o.random_output_len * (1 - r))));
  const int64_t out_hi = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o.random_output_len * (1 + r))));
  MS_CHECK(in_lo >= 1, "--random-input-len {} is too small: with {} special tokens and range ratio {} a prompt could be "
           "empty", o.random_input_len, num_special, r);

  std::mt19937_64 rng(o.seed);
  std::vector<int32_t> allowed;
  if (tok) {
    for (size_t id = 0; id < tok->vocab_size(); ++id)
      if (tok->id_to_token(static_cast<int32_t>(id)) && !tok->is_special(static_cast<int32_t>(id)))
        allowed.push_back(static_cast<int32_t>(id));
    MS_CHECK(!allowed.empty(), "the tokenizer has no non-special tokens");
  } else if (note) {
    *note = "no tokenizer (pass --tokenizer DIR): random prompts are random words, about one token each; "
            "input token counts come from the server's usage";
  }
  const size_t n_allowed = tok ? allowed.size() : std::size(kWords);

  std::vector<SampleRequest> out;
  int64_t mismatch = 0;
  for (int64_t i = 0; i < o.num_prompts; ++i) {
    SampleRequest s;
    const int64_t in_len = uniform(rng, in_lo, in_hi);
    s.expected_output_len = uniform(rng, out_lo, out_hi);
    const auto offset = static_cast<size_t>(uniform(rng, 0, static_cast<int64_t>(n_allowed) - 1));
    if (!tok) {
      for (int64_t k = 0; k < in_len; ++k) {
        if (k) s.prompt += ' ';
        s.prompt += kWords[(offset + i + k) % n_allowed];
      }
      s.prompt_len = in_len;
    } else {
      std::vector<int32_t> ids;
      for (int64_t k = 0; k < in_len; ++k) ids.push_back(allowed[(offset + i + k) % n_allowed]);
      // Decoding N ids and encoding the text need not give N ids back (merges across
      // boundaries): truncate or extend with random ids and retry, a bounded number of times.
      std::string text = tok->decode(ids, false);
      std::vector<int32_t> re = tok->encode(text, false);
      for (int attempt = 0; attempt < 10 && static_cast<int64_t>(re.size()) != in_len; ++attempt) {
        if (static_cast<int64_t>(re.size()) > in_len) {
          re.resize(in_len);
        } else {
          while (static_cast<int64_t>(re.size()) < in_len) re.push_back(allowed[uniform(rng, 0, n_allowed - 1)]);
        }
        text = tok->decode(re, false);
        re = tok->encode(text, false);
      }
      mismatch += static_cast<int64_t>(re.size()) - in_len;
      s.prompt = std::move(text);
      s.prompt_len = static_cast<int64_t>(re.size());
    }
    out.push_back(std::move(s));
  }
  if (tok && mismatch != 0 && note)
    *note = fmt::format("random prompts have {} {} tokens in total than asked for after decode/re-encode",
                        std::llabs(mismatch), mismatch > 0 ? "more" : "fewer");
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  MS_CHECK(f.good(), "cannot open dataset file {}", path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string turn_text(const nlohmann::json& turn, const std::string& path, size_t idx) {
  MS_CHECK(turn.is_object() && turn.contains("value") && turn["value"].is_string(),
           "{}: entry {}: a conversation turn has no string \"value\"", path, idx);
  return turn["value"].get<std::string>();
}

std::vector<SampleRequest> sample_sharegpt(const DatasetOptions& o, const Tokenizer* tok, std::string* note) {
  MS_CHECK(!o.path.empty(), "--dataset-name sharegpt needs --dataset-path FILE (ShareGPT JSON)");
  auto j = moeserve::parse_json_bounded_or_discarded(read_file(o.path));
  MS_CHECK(!j.is_discarded() && j.is_array(), "{}: not a JSON array of conversations", o.path);
  std::vector<std::pair<std::string, std::string>> pairs;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    if (!e.is_object() || !e.contains("conversations") || !e["conversations"].is_array()) continue;
    const auto& c = e["conversations"];
    if (c.size() < 2) continue;
    pairs.emplace_back(turn_text(c[0], o.path, i), turn_text(c[1], o.path, i));
  }
  std::mt19937_64 rng(o.seed);
  std::shuffle(pairs.begin(), pairs.end(), rng);
  std::vector<SampleRequest> out;
  size_t skipped = 0;
  for (const auto& [prompt, completion] : pairs) {
    if (static_cast<int64_t>(out.size()) >= o.num_prompts) break;
    const int64_t plen = count_tokens(tok, prompt);
    const int64_t olen = o.sharegpt_output_len ? *o.sharegpt_output_len : count_tokens(tok, completion);
    // vLLM's is_valid_sequence: the minimum output check is skipped for a fixed output length.
    const bool ok = plen >= 4 && (o.sharegpt_output_len || olen >= 4) && plen <= 1024 && plen + olen <= 2048;
    if (!ok) {
      ++skipped;
      continue;
    }
    out.push_back({prompt, plen, olen});
  }
  MS_CHECK(!out.empty(), "{}: no usable conversation (>= 2 turns, 4..1024 prompt tokens)", o.path);
  if (note) {
    *note = fmt::format("sharegpt: {} requests from {} conversations ({} skipped by the length filter){}", out.size(),
                        pairs.size(), skipped, tok ? "" : "; no tokenizer: lengths are word counts");
  }
  return out;
}

std::vector<SampleRequest> sample_jsonl(const DatasetOptions& o, const Tokenizer* tok) {
  MS_CHECK(!o.path.empty(), "--dataset-name jsonl needs --dataset-path FILE");
  std::ifstream f(o.path);
  MS_CHECK(f.good(), "cannot open dataset file {}", o.path);
  std::vector<SampleRequest> rows;
  std::string line;
  for (size_t ln = 1; std::getline(f, line); ++ln) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = moeserve::parse_json_bounded_or_discarded(line);
    MS_CHECK(!j.is_discarded() && j.is_object(), "{}:{}: not a JSON object", o.path, ln);
    MS_CHECK(j.contains("prompt") && j["prompt"].is_string(), "{}:{}: missing string \"prompt\"", o.path, ln);
    MS_CHECK(j.contains("output_len") && j["output_len"].is_number_integer() && j["output_len"].get<int64_t>() >= 1,
             "{}:{}: missing integer \"output_len\" >= 1", o.path, ln);
    std::string p = j["prompt"].get<std::string>();
    rows.push_back({p, count_tokens(tok, p), j["output_len"].get<int64_t>()});
  }
  MS_CHECK(!rows.empty(), "{}: no requests", o.path);
  std::vector<SampleRequest> out;
  for (int64_t i = 0; i < o.num_prompts; ++i) out.push_back(rows[static_cast<size_t>(i) % rows.size()]);
  return out;
}

}  // namespace

std::vector<SampleRequest> sample_requests(const DatasetOptions& opts, const Tokenizer* tok, std::string* note) {
  MS_CHECK(opts.num_prompts >= 1, "--num-prompts must be >= 1");
  if (opts.name == "random") return sample_random(opts, tok, note);
  if (opts.name == "sharegpt") return sample_sharegpt(opts, tok, note);
  if (opts.name == "jsonl" || opts.name == "custom") return sample_jsonl(opts, tok);
  fail("unknown dataset '{}' (random, sharegpt, jsonl)", opts.name);
}

}  // namespace moeserve::bench
