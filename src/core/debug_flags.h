// The typed debug registry: every MOESERVE_* environment switch the binary reads, in one
// table (name, type, default, what it does), read once at start and validated (a bad value is
// an Error naming the variable and what it accepts). `moeserve --help-debug` prints the table.
//
// These are diagnostics and narrowing aids, not tuning: kernel thresholds and variants are
// fields of the backend instance (tests set them per instance; CudaBackend copies the
// registry's values into its fields when it is made). The A/B switches of earlier sessions
// left the tree with their experiments (docs/bench/cuda_switch_inventory.md).
//
// No other file in src/ calls getenv for a MOESERVE_* name. The process-environment readers
// that remain are real interfaces, not switches (tests/core/test_no_getenv.cpp keeps the list
// of files allowed to read them):
//   HF_HOME, HF_ENDPOINT, HF_HUB_OFFLINE, HF_TOKEN, HF_TOKEN_PATH, HUGGING_FACE_HUB_TOKEN,
//     HF_HUB_DISABLE_IMPLICIT_TOKEN, XDG_CACHE_HOME, HOME (cli/model_source.cpp, cli/pull.cpp,
//     tools/hub_client.cpp, tools/plan_fetch.cpp: Hugging Face hub conventions)
//   MOESERVE_API_KEY, VLLM_API_KEY (cli/serve.cpp), OPENAI_API_KEY (tools/bench_serve):
//     API keys kept off the command line, as vLLM and the OpenAI clients read them
//   NOTIFY_SOCKET (server/sd_notify.cpp: systemd readiness)
//   OMPI_COMM_WORLD_*, PMI_*, MPI_LOCALRANKID, MASTER_ADDR, MASTER_PORT, NCCL_NVLS_ENABLE
//     (dist/nccl_communicator.cpp, cli/parallel_cli.cpp: launcher and NCCL conventions)
//   CUDA_VISIBLE_DEVICES and NCCL_* are read by the CUDA / NCCL libraries themselves.
//   Tests only (tests/, not src/): MOESERVE_SOURCE_DIR, MOESERVE_SHARED_DATA, MOESERVE_BIN,
//     MOESERVE_BENCH and the other test-harness variables.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace moeserve {

enum class DebugFlagType { Bool, Int, List, String };

struct DebugFlagSpec {
  const char* name;  // the environment variable
  DebugFlagType type;
  const char* default_text;
  const char* description;
  std::vector<std::string> choices;  // List: the accepted items
  int64_t min = 0, max = 0;          // Int: the accepted range
  // Timing diagnostics that give wrong results: refused unless the binary is the diagnostic
  // build (-DMOESERVE_KTRACE=ON), so a serving binary can never run them.
  bool diagnostic_only = false;
};

// Values (defaults = the shipped behaviour).
struct DebugFlags {
  bool pdl = true;                    // MOESERVE_PDL
  std::set<std::string> prefill_off;  // MOESERVE_PREFILL_OFF
  std::set<std::string> decode_off;   // MOESERVE_DECODE_OFF
  bool decode_mega = false;           // MOESERVE_DECODE_MEGA
  bool mega_timing = false;           // MOESERVE_MEGA_TIMING (diagnostic build)
  std::string op_repeat;              // MOESERVE_OP_REPEAT (diagnostic build)
  bool route_diag = false;            // MOESERVE_ROUTE_DIAG (diagnostic build)
  std::string ktrace_out;             // MOESERVE_KTRACE_OUT (diagnostic build)
  int cpu_threads = 0;                // MOESERVE_CPU_THREADS (0: one per hardware thread)
  bool p2p_allreduce = false;         // MOESERVE_P2P_ALLREDUCE
  std::optional<int64_t> test_now;    // MOESERVE_TEST_NOW

  bool prefill_off_has(const char* item) const { return prefill_off.count(item) || prefill_off.count("all"); }
  bool decode_off_has(const char* item) const { return decode_off.count(item) || decode_off.count("all"); }
  // MOESERVE_OP_REPEAT's count for op (1 when not listed).
  int op_repeat_count(const char* op) const;
};

// The table, in --help-debug order.
const std::vector<DebugFlagSpec>& debug_flag_specs();

// Looks a variable up (nullptr: unset). Tests pass a map; the process uses the environment.
using EnvLookup = std::function<const char*(const char* name)>;

// Parses and validates every flag; throws Error("MOESERVE_X=...: ...") for a bad value or a
// diagnostic-only flag in a non-diagnostic build.
DebugFlags parse_debug_flags(const EnvLookup& env, bool diagnostic_build);

// The process's flags: parsed once from the environment on the first call (main() calls it
// before any subcommand, so a bad value fails at start), then the same object.
const DebugFlags& debug_flags();

// True in the diagnostic build (-DMOESERVE_KTRACE=ON).
bool diagnostic_build();

// The table as text (moeserve --help-debug).
std::string debug_flags_help();

}  // namespace moeserve
