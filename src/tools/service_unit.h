// `moeserve service`: the text of a systemd unit that runs `moeserve serve` with the given
// flags (shared/reference/serving-api.md §10.2): Type=notify (serve sends READY=1 after load
// and warm-up, STATUS= while loading, STOPPING=1 on drain), Restart=on-failure, a generous
// TimeoutStartSec, LimitNOFILE, and the usual CUDA/NCCL/HF environment.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace moeserve::service {

struct ServiceOptions {
  std::string name = "moeserve";   // SyslogIdentifier, default paths (/etc/<name>/env, /var/lib/<name>)
  std::string exec_path;           // absolute path of the moeserve binary
  std::vector<std::string> serve_args;  // passed to `moeserve serve` verbatim (quoted for systemd)
  std::string user, group;         // empty: no User=/Group= (runs as root)
  std::string env_file;            // empty: "-/etc/<name>/env" (optional file)
  std::string hf_home;             // empty: /var/lib/<name>/huggingface
  std::optional<std::string> cuda_visible_devices;  // empty optional: 0..tp*dp-1 from the serve flags
  std::vector<std::string> env;    // extra KEY=VALUE lines
  std::string timeout_start = "2h";  // download + load + warm-up
  std::string working_directory;   // empty: none
};

// One argument for ExecStart=, escaped so that systemd's parser gives back exactly `arg`:
// plain words stay bare; anything else is double-quoted with C escapes; '%' -> "%%"
// (specifiers), '$' -> "$$" (variable expansion); a lone ";" is quoted, so not a separator.
std::string quote_exec_arg(const std::string& arg);
// A value for Environment="KEY=VALUE" (quoted, C escapes, '%' -> "%%").
std::string quote_env_assignment(const std::string& key_value);

// GPUs the serve flags ask for: tensor-parallel-size * data-parallel-size (1 when absent);
// 0 when --device cpu.
int gpus_from_serve_args(const std::vector<std::string>& args);

std::string make_service_unit(const ServiceOptions& opt);  // throws on a bad name/user/env entry

}  // namespace moeserve::service
