// `moeserve serve`'s arguments, registered from the one flag table (tools/serve_flags.h), and
// the checks that run after parsing and before anything loads. `service` uses the same
// registration and checks on its serve flags, so it rejects exactly what serve would.
#pragma once
#include <CLI/CLI.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cli/parallel_cli.h"

namespace moeserve::cli {

struct ServeArgs {
  std::string model;
  std::string revision = "main", tokenizer, tokenizer_revision, download_dir, hf_overrides;
  std::string load_format = "auto", dtype = "auto", kv_cache_dtype = "auto", quantization;
  std::string host = "0.0.0.0";
  int port = 8000;
  std::vector<std::string> served_model_names;
  std::string max_model_len;
  int max_num_seqs = 0;            // 0: vLLM's default for the device (resolve_batch_defaults)
  int max_num_batched_tokens = 0;  // 0: likewise
  int long_prefill_token_threshold = 0;  // 0: none (engine/scheduler.h)
  int max_num_partial_prefills = 0;      // 0: no limit
  int block_size = 16;
  int num_kv_blocks = 0;
  std::string api_key;
  std::string root_path;
  std::string allowed_origins = "[\"*\"]", allowed_methods = "[\"*\"]", allowed_headers = "[\"*\"]";
  bool allow_credentials = false;
  std::string config;
  std::string log_level;
  std::string chat_template;
  std::string generation_config = "auto";
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
  std::string reasoning_parser;
  std::string device;  // empty: cuda when built with CUDA and a GPU is visible, else cpu
  bool enable_prefix_caching = true;
  bool enable_request_id_headers = false;
  bool enable_force_include_usage = false;
  bool web_ui = true;  // --no-web-ui: no chat page at /
  bool enable_log_requests = false;
  bool disable_log_stats = false;
  double gpu_memory_utilization = 0.9;
  bool enforce_eager = false;
  std::string speculative_config;  // --speculative-config JSON (engine/spec_config.h); "" = off
  bool speculative_adaptive = true;  // --no-speculative-adaptive: k = num_speculative_tokens every step
  bool capture_graphs_at_startup = false;
  int max_logprobs = 20;
  int io_threads = 2;
  int prep_threads = 2;
  double timeout_keep_alive = 5;
  double header_timeout = 10;
  double body_timeout = 60;
  double write_timeout = 30;
  int max_connections = 0;
  int max_waiting_requests = 1024;
  size_t max_request_body_bytes = 32u << 20;
  double shutdown_grace_seconds = 30;
  uint64_t seed = 0;
  bool host_sampling = false;
  std::string replay_script;
  std::string pipeline_parallel = "1";
  ParallelFlags par;
  // Rows of the table that are not bound to a field (no-op and not-supported flags).
  std::map<std::string, bool> other_flags;
  std::map<std::string, std::vector<std::string>> other_values;
};

// Adds every row of the flag table to `sub` (allow_extras: unknown flags are reported by
// check_serve_args with "not supported yet", never CLI11's "not expected").
void add_serve_options(CLI::App* sub, ServeArgs& a);
// After parsing: throws moeserve::Error ("not supported yet: FLAG (...)") for unsupported
// flags or values and unknown flags; returns the one warning line for no-op flags ("" if none).
std::string check_serve_args(CLI::App* sub, ServeArgs& a);

// vLLM's spelling on the command line: `--max_model_len` = `--max-model-len` (only the name
// before '=' is rewritten) and the multi-letter short flags -tp, -dp, -pp.
void normalize_flag_spelling(std::vector<std::string>& args);
// `--config FILE.yaml` (vLLM's YAML config: keys are flag names, dashes or underscores; lists
// are several values, objects become JSON text): the file's flags are inserted at `at` (just
// after the subcommand), except those the command line already gives (command line wins).
// Throws moeserve::Error for an unreadable file or a value that cannot be a flag value.
void expand_config_file(std::vector<std::string>& args, size_t at);
// Parses `args` (without the subcommand) exactly as `serve` would and runs check_serve_args;
// throws on what serve would refuse; returns the no-op warning line. `service` calls it.
std::string validate_serve_command_line(std::vector<std::string> args);

}  // namespace moeserve::cli
