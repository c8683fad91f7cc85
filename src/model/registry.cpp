#include "model/registry.h"

#include <filesystem>

#include "core/error.h"

namespace moeserve {

// One line per architecture: NAME has `ArchEntry NAME_arch()` in its file of model/arch/
// (NAME.cpp; kimi_k25 is in deepseek_v3.cpp: the same decoder).
#define MOESERVE_ARCHITECTURES(X) \
  X(minimax_m2)                   \
  X(qwen3_moe)                    \
  X(deepseek_v3)                  \
  X(kimi_k25)

#define MOESERVE_DECLARE_ARCH(name) ArchEntry name##_arch();
MOESERVE_ARCHITECTURES(MOESERVE_DECLARE_ARCH)
#undef MOESERVE_DECLARE_ARCH

const std::vector<ArchEntry>& architectures() {
#define MOESERVE_ARCH_ENTRY(name) name##_arch(),
  static const std::vector<ArchEntry> all{MOESERVE_ARCHITECTURES(MOESERVE_ARCH_ENTRY)};
#undef MOESERVE_ARCH_ENTRY
  return all;
}

namespace {
std::string supported_list() {
  std::string s;
  for (const auto& e : architectures()) {
    if (!s.empty()) s += ", ";
    s += e.architecture + " (model_type ";
    for (size_t i = 0; i < e.model_types.size(); ++i) s += (i ? "/" : "") + e.model_types[i];
    s += ")";
  }
  return s;
}
}  // namespace

const ArchEntry& find_architecture(const nlohmann::json& j) {
  MS_CHECK(j.is_object(), "config.json: top level must be an object");
  std::string arch, type;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  if (j.contains("model_type") && j["model_type"].is_string()) type = j["model_type"].get<std::string>();
  for (const auto& e : architectures())
    if (!arch.empty() && e.architecture == arch) return e;
  for (const auto& e : architectures())
    for (const auto& t : e.model_types)
      if (!type.empty() && t == type) return e;
  fail("config.json: architecture '{}' (model_type '{}') is not supported; supported: {}", arch, type,
       supported_list());
}

LoadedConfig parse_config(const nlohmann::json& j) {
  LoadedConfig c;
  c.entry = &find_architecture(j);
  c.config = c.entry->parse(j);
  return c;
}

LoadedConfig load_config(const std::string& path, const std::string& overrides_json) {
  const nlohmann::json j = config_json::read_file(path, overrides_json);
  try {
    return parse_config(j);
  } catch (const Error& e) {
    fail("{}: {}", path, e.what());
  }
}

LoadedConfig load_model_config(const std::string& model_dir, const std::string& overrides_json) {
  return load_config((std::filesystem::path(model_dir) / "config.json").string(), overrides_json);
}

}  // namespace moeserve
