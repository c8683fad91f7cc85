// The architecture registry: config.json's architectures[0] (or model_type) -> the typed
// config parser and the model factory of one architecture file (model/arch/<arch>.cpp).
// Adding an architecture is one line in registry.cpp. Loading a config of an architecture not
// listed fails naming the supported ones.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"

namespace moeserve {

struct ArchEntry {
  std::string architecture;              // HF class name, e.g. "Qwen3MoeForCausalLM"
  std::vector<std::string> model_types;  // config.json model_type values it accepts
  // Typed config from config.json (errors name the field).
  std::function<std::unique_ptr<ArchConfig>(const nlohmann::json&)> parse;
  // One rank's model over `backend` (weights not loaded yet).
  std::function<std::unique_ptr<Model>(const ArchConfig&, Backend&, ParallelConfig, AllReduceFn)> create;
};

// Every registered architecture, in registry order.
const std::vector<ArchEntry>& architectures();
// The entry for a config: architectures[0] when the registry knows it, else model_type.
// Throws "architecture 'X' (model_type 'y') is not supported; supported: ..." otherwise.
const ArchEntry& find_architecture(const nlohmann::json& config);

// A parsed config with the entry that parsed it.
struct LoadedConfig {
  const ArchEntry* entry = nullptr;
  std::unique_ptr<ArchConfig> config;
};
// config.json (with --hf-overrides merged in) parsed by its architecture; errors carry the path.
LoadedConfig load_config(const std::string& config_json_path, const std::string& overrides_json = "");
// The same for a model directory (DIR/config.json).
LoadedConfig load_model_config(const std::string& model_dir, const std::string& overrides_json = "");
// The same from a JSON object already read.
LoadedConfig parse_config(const nlohmann::json& config);

}  // namespace moeserve
