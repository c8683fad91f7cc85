// `moeserve tokenize` and `moeserve detokenize`: run a model's tokenizer.json from the
// command line (ids out / text out), e.g. to compare with HF `tokenizers`.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <sys/stat.h>

#include "cli/registry.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace {

// --tokenizer takes a model directory or the tokenizer.json file itself.
std::shared_ptr<const moeserve::Tokenizer> load(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return moeserve::Tokenizer::from_dir(path);
  return moeserve::Tokenizer::from_file(path);
}

struct TokenizeArgs {
  std::string tokenizer, text_file;
  bool add_special = false, json = false;
};

moeserve::cli::RegisterSubcommand reg_tok("tokenize", "Encode text (stdin or --text-file) to token ids", [](CLI::App* sub) {
  auto a = std::make_shared<TokenizeArgs>();
  sub->add_option("--tokenizer", a->tokenizer, "Model directory with tokenizer.json, or the file")->required();
  sub->add_option("--text-file", a->text_file, "Read the text from this file (default: stdin)");
  sub->add_flag("--add-special-tokens", a->add_special, "Apply the post-processor (e.g. BOS)");
  sub->add_flag("--json", a->json, "Print {\"ids\": [...]} instead of space-separated ids");
  return [a]() -> int {
    auto tok = load(a->tokenizer);
    std::string text;
    if (a->text_file.empty()) {
      text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
    } else {
      std::ifstream f(a->text_file, std::ios::binary);
      MS_CHECK(f.good(), "cannot open --text-file '{}'", a->text_file);
      std::stringstream ss;
      ss << f.rdbuf();
      text = ss.str();
    }
    auto ids = tok->encode(text, a->add_special);
    if (a->json) {
      std::printf("%s\n", nlohmann::json{{"ids", ids}}.dump().c_str());
    } else {
      std::string out;
      for (size_t k = 0; k < ids.size(); ++k) out += (k ? " " : "") + std::to_string(ids[k]);
      std::printf("%s\n", out.c_str());
    }
    return 0;
  };
});

struct DetokenizeArgs {
  std::string tokenizer, ids;
  bool skip_special = false, json = false;
};

moeserve::cli::RegisterSubcommand reg_detok("detokenize", "Decode token ids (--ids \"1,2,3\") to text", [](CLI::App* sub) {
  auto a = std::make_shared<DetokenizeArgs>();
  sub->add_option("--tokenizer", a->tokenizer, "Model directory with tokenizer.json, or the file")->required();
  sub->add_option("--ids", a->ids, "Comma-separated token ids")->required();
  sub->add_flag("--skip-special-tokens", a->skip_special, "Drop special tokens from the text");
  sub->add_flag("--json", a->json, "Print {\"text\": ...} (JSON-escaped) instead of the raw text");
  return [a]() -> int {
    auto tok = load(a->tokenizer);
    std::vector<int32_t> ids;
    std::stringstream ss(a->ids);
    std::string item;
    while (std::getline(ss, item, ',')) {
      size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
      if (b == std::string::npos) continue;
      item = item.substr(b, e - b + 1);
      size_t used = 0;
      long long v = 0;
      try {
        v = std::stoll(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      MS_CHECK(used == item.size() && v >= 0 && v <= INT32_MAX, "--ids: '{}' is not a token id", item);
      ids.push_back(static_cast<int32_t>(v));
    }
    std::string text = tok->decode(ids, a->skip_special);
    if (a->json) std::printf("%s\n", nlohmann::json{{"text", text}}.dump().c_str());
    else std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  };
});

}  // namespace
