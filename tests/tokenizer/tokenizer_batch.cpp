// Batch driver for the Python oracle tests: loads one tokenizer.json (argv[1]; a directory:
// Tokenizer::from_dir, e.g. a tiktoken.model folder), prints
// {"ready":true} (or {"load_error":"..."} and exits), then answers JSON-lines requests on
// stdin, one JSON line out per request:
//   {"op":"encode","text":"..."|"text_hex":"..","special":bool} -> {"ids":[...]} | {"error":"..."}
//   {"op":"decode","ids":[...],"skip":bool}                     -> {"text":"..."}
//   {"op":"stream","ids":[...],"skip":bool}                     -> {"deltas":[...]} (IncrementalDetokenizer)
//   {"op":"info"}                                               -> {"vocab_size":N}
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tokenizer_batch TOKENIZER_JSON < requests.jsonl\n");
    return 2;
  }
  std::shared_ptr<const moeserve::Tokenizer> tok;
  try {
    tok = std::filesystem::is_directory(argv[1]) ? moeserve::Tokenizer::from_dir(argv[1])
                                                : moeserve::Tokenizer::from_file(argv[1]);
  } catch (const std::exception& e) {
    std::printf("%s\n", nlohmann::json{{"load_error", e.what()}}.dump().c_str());
    return 0;
  }
  std::printf("{\"ready\":true}\n");
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
    nlohmann::json req = nlohmann::json::parse(line), resp;
    std::string op = req.at("op");
    try {
      if (op == "encode") {
        std::string text;
        if (req.contains("text_hex")) {
          std::string h = req["text_hex"];
          for (size_t i = 0; i + 1 < h.size(); i += 2) text.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
        } else {
          text = req.at("text").get<std::string>();
        }
        resp["ids"] = tok->encode(text, req.value("special", false));
      } else if (op == "decode") {
        resp["text"] = tok->decode(req.at("ids").get<std::vector<int32_t>>(), req.value("skip", false));
      } else if (op == "stream") {
        moeserve::IncrementalDetokenizer d(tok, req.value("skip", false));
        nlohmann::json deltas = nlohmann::json::array();
        for (int32_t id : req.at("ids").get<std::vector<int32_t>>()) deltas.push_back(d.push(id));
        deltas.push_back(d.finish());
        resp["deltas"] = deltas;
      } else if (op == "info") {
        resp["vocab_size"] = tok->vocab_size();
      } else {
        resp["error"] = "unknown op " + op;
      }
    } catch (const moeserve::Error& e) {
      resp = {{"error", e.what()}};
    }
    // Deltas must be valid UTF-8: dump() throws on broken sequences, which the test sees.
    std::string out;
    try {
      out = resp.dump();
    } catch (const nlohmann::json::exception&) {
      out = nlohmann::json{{"error", "output is not valid UTF-8"}}.dump();
    }
    std::printf("%s\n", out.c_str());
    std::fflush(stdout);
  }
  return 0;
}
