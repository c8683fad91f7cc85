// ChatTemplate: the variables transformers passes to a chat template, and the
// tokenizer_config.json fields it reads.
#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/bounded_json.h"

namespace moeserve {

ChatTemplate ChatTemplate::compile(const std::string& source) {
  ChatTemplate t;
  t.tpl_ = jinja::CompiledTemplate::compile(source);
  return t;
}

std::string ChatTemplate::render(const ChatTemplateInputs& in) const {
  // transformers: render(messages=..., tools=..., documents=..., add_generation_prompt=...,
  // **special_tokens_map, **chat_template_kwargs); later keys win.
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  ctx["messages"] = in.messages;
  ctx["tools"] = in.tools;
  ctx["documents"] = nullptr;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  if (!in.bos_token.empty()) ctx["bos_token"] = in.bos_token;
  if (!in.eos_token.empty()) ctx["eos_token"] = in.eos_token;
  if (!in.extra.is_null()) {
    MS_CHECK(in.extra.is_object(), "chat template kwargs must be a JSON object");
    for (auto it = in.extra.begin(); it != in.extra.end(); ++it) ctx[it.key()] = it.value();
  }
  return tpl_.render(ctx);
}

namespace {

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  MS_CHECK(f, "cannot open {}", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A special token is a string, null, or {"__type": "AddedToken", "content": ...}.
std::string token_string(const nlohmann::ordered_json& cfg, const char* key, const std::string& file) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  fail("{}: field '{}' must be a string, null or an AddedToken object", file, key);
}

void set_templates(TokenizerConfig& c, const nlohmann::ordered_json& t, const std::string& file) {
  if (t.is_string()) {
    c.chat_template = t.get<std::string>();
    c.named_templates.clear();
    return;
  }
  MS_CHECK(t.is_array(), "{}: chat_template must be a string or a list of {{name, template}}", file);
  c.named_templates.clear();
  for (const auto& e : t) {
    MS_CHECK(e.is_object() && e.contains("name") && e.contains("template") && e["name"].is_string() &&
                 e["template"].is_string(),
             "{}: chat_template list entries need string 'name' and 'template'", file);
    c.named_templates[e["name"].get<std::string>()] = e["template"].get<std::string>();
  }
  auto def = c.named_templates.find("default");
  c.chat_template = def != c.named_templates.end() ? def->second
                    : t.empty()                   ? ""
                                                  : t[0]["template"].get<std::string>();
}

}  // namespace

TokenizerConfig TokenizerConfig::load(const std::string& dir) {
  namespace fs = std::filesystem;
  TokenizerConfig c;
  fs::path cfg_path = fs::path(dir) / "tokenizer_config.json";
  if (fs::exists(cfg_path)) {
    nlohmann::ordered_json cfg;
    try {
      cfg = parse_json_bounded<nlohmann::ordered_json>(read_file(cfg_path), cfg_path.string());
    } catch (const nlohmann::json::exception& e) {
      fail("{}: invalid JSON: {}", cfg_path.string(), e.what());
    }
    MS_CHECK(cfg.is_object(), "{}: expected a JSON object", cfg_path.string());
    c.bos_token = token_string(cfg, "bos_token", cfg_path.string());
    c.eos_token = token_string(cfg, "eos_token", cfg_path.string());
    c.pad_token = token_string(cfg, "pad_token", cfg_path.string());
    c.unk_token = token_string(cfg, "unk_token", cfg_path.string());
    if (cfg.contains("add_bos_token") && cfg["add_bos_token"].is_boolean()) c.add_bos_token = cfg["add_bos_token"].get<bool>();
    if (cfg.contains("add_eos_token") && cfg["add_eos_token"].is_boolean()) c.add_eos_token = cfg["add_eos_token"].get<bool>();
    if (cfg.contains("chat_template") && !cfg["chat_template"].is_null())
      set_templates(c, cfg["chat_template"], cfg_path.string());
  } else {
    MS_CHECK(fs::exists(fs::path(dir) / "chat_template.jinja"), "{}: no tokenizer_config.json or chat_template.jinja",
             dir);
  }
  fs::path jinja_path = fs::path(dir) / "chat_template.jinja";
  if (fs::exists(jinja_path)) {
    c.chat_template = read_file(jinja_path);
    c.named_templates.clear();
  }
  return c;
}

std::string TokenizerConfig::template_for(bool has_tools) const {
  if (named_templates.empty()) {
    MS_CHECK(!chat_template.empty(), "the tokenizer has no chat template");
    return chat_template;
  }
  if (has_tools) {
    auto it = named_templates.find("tool_use");
    if (it != named_templates.end()) return it->second;
  }
  auto it = named_templates.find("default");
  MS_CHECK(it != named_templates.end(), "the tokenizer has named chat templates but none called 'default'");
  return it->second;
}

}  // namespace moeserve
