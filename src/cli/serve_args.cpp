#include "cli/serve_args.h"
#include "core/bounded_json.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/spec_config.h"
#include "tools/serve_flags.h"

namespace moeserve::cli {
namespace {

namespace sf = serve_flags;

const sf::FlagSpec& spec_of(const std::string& name) {
  const sf::FlagSpec* s = sf::find(name);
  MS_CHECK(s && s->name == name, "serve flag table has no row '{}'", name);
  return *s;
}

std::string names_of(const sf::FlagSpec& s) {
  std::string n = "--" + s.name;
  if (s.name == "quantization") n = "-q," + n;
  if (s.name == "num-kv-blocks") n += ",--num-gpu-blocks-override";
  if (s.negatable) n += ",!--no-" + s.name;
  return n;
}

// Binds one implemented row to a field; `bound` collects the names so add_serve_options can
// check that every implemented row has a field.
class Binder {
 public:
  Binder(CLI::App* sub) : sub_(sub) {}
  template <typename T>
  CLI::Option* operator()(const std::string& name, T& field) {
    const sf::FlagSpec& s = spec_of(name);
    MS_CHECK(s.kind == sf::Kind::Implemented, "serve flag table: '{}' is bound but not implemented", name);
    bound_.insert(name);
    CLI::Option* o;
    if constexpr (std::is_same_v<T, bool>) {
      o = sub_->add_flag(names_of(s), field, s.why);
    } else {
      o = sub_->add_option(names_of(s), field, s.why);
      if constexpr (!std::is_same_v<T, std::vector<std::string>>) o->capture_default_str();
    }
    o->group(s.group);
    return o;
  }
  const std::set<std::string>& bound() const { return bound_; }

 private:
  CLI::App* sub_;
  std::set<std::string> bound_;
};

bool is_flag_arg(const std::string& s) { return s.size() > 1 && s[0] == '-' && !(s[1] >= '0' && s[1] <= '9'); }

std::string flag_name(const std::string& arg) {
  std::string n = arg.substr(0, arg.find('='));
  n.erase(0, n.find_first_not_of('-'));
  return n;
}

std::string option_value(CLI::App* sub, const std::string& name) {
  const CLI::Option* o = sub->get_option("--" + name);
  return o->results().empty() ? std::string() : o->results().back();
}

nlohmann::json parse_json_flag(const std::string& flag, const std::string& text) {
  try {
    return parse_json_bounded(text, "--" + flag);
  } catch (const JsonDepthError& e) {
    fail("{}", e.what());
  } catch (const std::exception& e) {
    fail("--{} '{}': not valid JSON ({})", flag, text, e.what());
  }
}

// A YAML node as JSON (objects for --hf-overrides and friends): scalars keep YAML 1.1's
// plain types (true/false, null, integers, floats), quoted scalars stay strings.
nlohmann::json yaml_to_json(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Map: {
      nlohmann::json j = nlohmann::json::object();
      for (const auto& kv : n) j[kv.first.as<std::string>()] = yaml_to_json(kv.second);
      return j;
    }
    case YAML::NodeType::Sequence: {
      nlohmann::json j = nlohmann::json::array();
      for (const auto& v : n) j.push_back(yaml_to_json(v));
      return j;
    }
    case YAML::NodeType::Scalar: {
      const std::string s = n.Scalar();
      if (n.Tag() == "!") return s;  // quoted
      if (s == "true" || s == "True" || s == "TRUE") return true;
      if (s == "false" || s == "False" || s == "FALSE") return false;
      if (s == "null" || s == "~" || s.empty()) return nullptr;
      try {
        size_t used = 0;
        const long long v = std::stoll(s, &used);
        if (used == s.size()) return v;
        const double d = std::stod(s, &used);
        if (used == s.size()) return d;
      } catch (...) {
      }
      return s;
    }
    default:
      return nullptr;
  }
}

std::string scalar_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  return yaml_to_json(n).dump();
}

}  // namespace

void add_serve_options(CLI::App* sub, ServeArgs& a) {
  sub->allow_extras();
  sub->add_option("model", a.model, "model directory or hub repo id (ORG/NAME)")->group("Model");
  Binder b(sub);
  b("model", a.model);
  b("revision", a.revision);
  b("tokenizer", a.tokenizer);
  b("tokenizer-revision", a.tokenizer_revision);
  b("download-dir", a.download_dir);
  b("hf-overrides", a.hf_overrides);
  b("load-format", a.load_format);
  b("dtype", a.dtype);
  b("kv-cache-dtype", a.kv_cache_dtype);
  b("quantization", a.quantization);
  b("served-model-name", a.served_model_names);
  b("max-model-len", a.max_model_len);
  b("max-num-seqs", a.max_num_seqs);
  b("max-num-batched-tokens", a.max_num_batched_tokens);
  b("long-prefill-token-threshold", a.long_prefill_token_threshold);
  b("max-num-partial-prefills", a.max_num_partial_prefills);
  b("block-size", a.block_size);
  b("num-kv-blocks", a.num_kv_blocks);
  b("gpu-memory-utilization", a.gpu_memory_utilization);
  b("enable-prefix-caching", a.enable_prefix_caching);
  b("enforce-eager", a.enforce_eager);
  b("speculative-config", a.speculative_config);
  b("speculative-adaptive", a.speculative_adaptive);
  b("capture-graphs-at-startup", a.capture_graphs_at_startup);
  b("device", a.device);
  b("seed", a.seed);
  b("host-sampling", a.host_sampling);
  b("max-waiting-requests", a.max_waiting_requests);
  b("host", a.host);
  b("port", a.port);
  b("api-key", a.api_key);
  b("root-path", a.root_path);
  b("allowed-origins", a.allowed_origins);
  b("allowed-methods", a.allowed_methods);
  b("allowed-headers", a.allowed_headers);
  b("allow-credentials", a.allow_credentials);
  b("chat-template", a.chat_template);
  b("generation-config", a.generation_config);
  b("enable-auto-tool-choice", a.enable_auto_tool_choice);
  b("tool-call-parser", a.tool_call_parser);
  b("reasoning-parser", a.reasoning_parser);
  b("enable-request-id-headers", a.enable_request_id_headers);
  b("enable-force-include-usage", a.enable_force_include_usage);
  b("web-ui", a.web_ui);
  b("max-logprobs", a.max_logprobs);
  b("io-threads", a.io_threads);
  b("prep-threads", a.prep_threads);
  b("timeout-keep-alive", a.timeout_keep_alive);
  b("header-timeout", a.header_timeout);
  b("body-timeout", a.body_timeout);
  b("write-timeout", a.write_timeout);
  b("max-connections", a.max_connections);
  b("max-request-body-bytes", a.max_request_body_bytes);
  b("shutdown-grace-seconds", a.shutdown_grace_seconds);
  b("config", a.config);
  b("log-level", a.log_level);
  b("tensor-parallel-size", a.par.tensor_parallel);
  b("enable-expert-parallel", a.par.expert_parallel);
  b("data-parallel-size", a.par.data_parallel);
  b("pipeline-parallel-size", a.pipeline_parallel);
  b("nnodes", a.par.nnodes);
  b("node-rank", a.par.node_rank);
  b("master-addr", a.par.master_addr);
  b("master-port", a.par.master_port);
  b("enable-log-requests", a.enable_log_requests);
  b("disable-log-stats", a.disable_log_stats);
#ifdef MOESERVE_HAS_TEST_BACKENDS
  b("test-replay-backend", a.replay_script);
#endif
  std::set<std::string> bound = b.bound();
#ifndef MOESERVE_HAS_TEST_BACKENDS
  bound.insert("test-replay-backend");
#endif
  for (const auto& s : sf::table()) {
    if (s.kind == sf::Kind::Implemented) {
      MS_CHECK(s.name == "num-gpu-blocks-override" || bound.count(s.name),
               "serve flag table: implemented row '{}' has no field", s.name);
      continue;
    }
    CLI::Option* o;
    if (s.arity == sf::Arity::Flag) {
      o = sub->add_flag(names_of(s), a.other_flags[s.name], s.why);
    } else {
      o = sub->add_option(names_of(s), a.other_values[s.name], s.why);
      if (s.arity == sf::Arity::One) o->expected(1);
      else o->expected(1, -1);
    }
    // The not-supported rows stay out of --help (docs/deploy.md lists them); no-ops are shown.
    o->group(s.kind == sf::Kind::NoOp ? s.group : std::string());
  }
}

std::string check_serve_args(CLI::App* sub, ServeArgs& a) {
  for (const std::string& r : sub->remaining()) {
    if (is_flag_arg(r)) fail("{}", sf::unknown_flag_message(r));
    fail("unexpected argument '{}' (serve takes one model: a directory or a hub repo id ORG/NAME)", r);
  }
  std::vector<std::string> noops;
  for (const auto& s : sf::table()) {
    CLI::Option* o = sub->get_option_no_throw("--" + s.name);
    if (!o || o->count() == 0) continue;
    const std::string value = s.arity == sf::Arity::Flag ? std::string() : option_value(sub, s.name);
    if (s.kind == sf::Kind::Unsupported) fail("not supported yet: --{} ({})", s.name, s.why);
    const bool checked = !s.ok_values.empty() || !s.noop_values.empty();
    if (checked) {
      auto in = [&](const std::vector<std::string>& v) { return std::find(v.begin(), v.end(), value) != v.end(); };
      if (in(s.ok_values)) continue;
      if (!in(s.noop_values)) fail("not supported yet: --{} {} ({})", s.name, value, s.unsupported_value_why);
      noops.push_back(fmt::format("--{} {} ({})", s.name, value, s.why));
      continue;
    }
    if (s.kind == sf::Kind::NoOp)
      noops.push_back(s.arity == sf::Arity::Flag ? fmt::format("--{} ({})", s.name, s.why)
                                                 : fmt::format("--{} {} ({})", s.name, value, s.why));
  }
  if (!a.device.empty())
    MS_CHECK(a.device == "cpu" || a.device == "cuda", "--device {}: expected cpu or cuda", a.device);
  // Parsed (and every refusal raised) here, before anything loads; load_serve_stack reparses it.
  if (!a.speculative_config.empty()) {
    const SpecConfig sc =
        parse_speculative_config(a.speculative_config, SpecParseContext{.tensor_parallel_size = a.par.tensor_parallel});
    // The draft directory before the target's (slow) load; its tensors are checked at load.
    if (sc.method == SpecMethod::Eagle3)
      MS_CHECK(std::filesystem::exists(std::filesystem::path(sc.model) / "config.json"),
               "--speculative-config method \"eagle3\": no config.json in draft directory '{}'", sc.model);
    // The scripted replay executor (tests) has no weights, so it cannot run draft heads.
    MS_CHECK(a.replay_script.empty() || sc.method == SpecMethod::Ngram,
             "--speculative-config method \"{}\": the test replay backend runs no draft heads; use method \"ngram\"",
             spec_method_name(sc.method));
  }
  if (!a.hf_overrides.empty())
    MS_CHECK(parse_json_flag("hf-overrides", a.hf_overrides).is_object(),
             "--hf-overrides '{}': expected a JSON object, e.g. '{{\"num_hidden_layers\": 30}}'", a.hf_overrides);
  for (auto [flag, text] : {std::pair<const char*, const std::string*>{"allowed-origins", &a.allowed_origins},
                            {"allowed-methods", &a.allowed_methods},
                            {"allowed-headers", &a.allowed_headers}}) {
    const nlohmann::json j = parse_json_flag(flag, *text);
    bool ok = j.is_array();
    for (const auto& v : j) ok = ok && v.is_string();
    MS_CHECK(ok, "--{} '{}': expected a JSON list of strings, e.g. '[\"https://app.example\"]'", flag, *text);
  }
  MS_CHECK(a.max_num_seqs >= 0 && a.max_num_batched_tokens >= 0,
           "--max-num-seqs and --max-num-batched-tokens must be positive");
  MS_CHECK(a.long_prefill_token_threshold >= 0, "--long-prefill-token-threshold {}: expected >= 0",
           a.long_prefill_token_threshold);
  MS_CHECK(a.max_num_partial_prefills >= 0, "--max-num-partial-prefills {}: expected >= 1 (0: no limit)",
           a.max_num_partial_prefills);
  if (!a.root_path.empty())
    MS_CHECK(a.root_path[0] == '/', "--root-path '{}': expected a path starting with '/'", a.root_path);
  if (noops.empty()) return "";
  return fmt::format("accepted for vllm compatibility, no effect here: {}", fmt::join(noops, "; "));
}

void normalize_flag_spelling(std::vector<std::string>& args) {
  for (auto& a : args) {
    for (const auto& [short_name, long_name] : {std::pair<std::string, std::string>{"-tp", "--tensor-parallel-size"},
                                                {"-dp", "--data-parallel-size"},
                                                {"-pp", "--pipeline-parallel-size"}})
      if (a == short_name || a.rfind(short_name + "=", 0) == 0) a = long_name + a.substr(short_name.size());
    if (a.rfind("--", 0) != 0) continue;
    const size_t end = std::min(a.find('='), a.size());
    std::replace(a.begin() + 2, a.begin() + static_cast<std::ptrdiff_t>(end), '_', '-');
  }
}

void expand_config_file(std::vector<std::string>& args, size_t at) {
  std::string path;
  bool positional_model = false;
  std::set<std::string> given;
  for (size_t i = at; i < args.size(); ++i) {
    const std::string& s = args[i];
    if (!is_flag_arg(s)) {
      positional_model = true;
      continue;
    }
    std::string name = flag_name(s);
    const sf::FlagSpec* spec = sf::find(name);
    if (spec) {
      given.insert(spec->name);
      if (name == "config") {
        if (s.find('=') != std::string::npos) path = s.substr(s.find('=') + 1);
        else if (i + 1 < args.size()) path = args[i + 1];
      }
      if (s.find('=') == std::string::npos && spec->arity != sf::Arity::Flag) {
        ++i;
        if (spec->arity == sf::Arity::Many)
          while (i + 1 < args.size() && !is_flag_arg(args[i + 1])) ++i;
      }
    } else {
      given.insert(name);
    }
  }
  if (path.empty()) return;
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const std::exception& e) {
    fail("--config {}: {}", path, e.what());
  }
  if (root.IsNull()) return;
  MS_CHECK(root.IsMap(), "--config {}: expected a mapping of flag names to values", path);
  std::vector<std::string> extra;
  for (const auto& kv : root) {
    std::string key = kv.first.as<std::string>();
    std::replace(key.begin(), key.end(), '_', '-');
    MS_CHECK(key != "config", "--config {}: a config file cannot name another config file", path);
    const sf::FlagSpec* spec = sf::find(key);
    const std::string canonical = spec ? spec->name : key;
    if (given.count(canonical) || given.count(key) || (key == "model" && positional_model)) continue;
    const YAML::Node& v = kv.second;
    if (spec && spec->arity == sf::Arity::Flag) {
      const nlohmann::json b = yaml_to_json(v);
      MS_CHECK(b.is_boolean(), "--config {}: '{}' is a switch; expected true or false", path, kv.first.as<std::string>());
      if (b.get<bool>()) extra.push_back("--" + key);
      else if (spec->negatable) extra.push_back("--no-" + spec->name);
      continue;
    }
    if (v.IsSequence() && (!spec || spec->arity == sf::Arity::Many)) {
      extra.push_back("--" + key);
      for (const auto& e : v) extra.push_back(scalar_text(e));
      continue;
    }
    extra.push_back("--" + key + "=" + scalar_text(v));
  }
  args.insert(args.begin() + static_cast<std::ptrdiff_t>(at), extra.begin(), extra.end());
}

std::string validate_serve_command_line(std::vector<std::string> args) {
  normalize_flag_spelling(args);
  expand_config_file(args, 0);
  CLI::App app{"serve"};
  ServeArgs a;
  add_serve_options(&app, a);
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    fail("serve flags: {}", e.what());
  }
  return check_serve_args(&app, a);
}

}  // namespace moeserve::cli
