// Batch driver for the Python oracle tests: renders many chat-template requests in one
// process (the CLI would start once per case). One JSON line in, one JSON line out:
//   {"template": SOURCE, "messages": [...], "tools": [...]|null, "add_generation_prompt": bool,
//    "kwargs": {...}, "bos": str|null, "eos": str|null}
//   -> {"ok": true, "text": "..."} | {"ok": false, "error": "..."}
// Compiled templates are cached by source text.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include "tokenizer/chat_template.h"

int main() {
  using nlohmann::ordered_json;
  std::map<std::string, std::shared_ptr<moeserve::ChatTemplate>> cache;
  std::string line;
  while (std::getline(std::cin, line)) {
    ordered_json resp;
    try {
      ordered_json req = ordered_json::parse(line);
      const std::string src = req.at("template").get<std::string>();
      auto it = cache.find(src);
      if (it == cache.end())
        it = cache.emplace(src, std::make_shared<moeserve::ChatTemplate>(moeserve::ChatTemplate::compile(src))).first;
      moeserve::ChatTemplateInputs in;
      in.messages = req.value("messages", ordered_json::array());
      in.tools = req.value("tools", ordered_json());
      in.add_generation_prompt = req.value("add_generation_prompt", false);
      in.extra = req.value("kwargs", ordered_json::object());
      if (req.contains("bos") && req["bos"].is_string()) in.bos_token = req["bos"].get<std::string>();
      if (req.contains("eos") && req["eos"].is_string()) in.eos_token = req["eos"].get<std::string>();
      resp = {{"ok", true}, {"text", it->second->render(in)}};
    } catch (const std::exception& e) {
      resp = {{"ok", false}, {"error", e.what()}};
    }
    std::string out = resp.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fputc('\n', stdout);
    std::fflush(stdout);
  }
  return 0;
}
