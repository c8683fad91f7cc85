// `moeserve inspect DIR [--json]`: checkpoint summary from config.json + safetensors headers.
#include <cstdio>
#include <string>

#include "cli/registry.h"
#include "model/inspect.h"

namespace {
struct Args {
  std::string dir;
  bool json = false;
};

moeserve::cli::RegisterSubcommand reg("inspect", "Summarise a model checkpoint directory", [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  sub->add_option("dir", a->dir, "checkpoint directory")->required();
  sub->add_flag("--json", a->json, "print the report as JSON");
  return [a] {
    const nlohmann::json r = moeserve::inspect_checkpoint(a->dir);
    if (a->json)
      std::printf("%s\n", r.dump(2).c_str());
    else
      std::printf("%s", moeserve::format_inspect(r).c_str());
    // The report is printed either way; a checkpoint that cannot be loaded is an error.
    if (!r["complete"].get<bool>()) {
      std::fflush(stdout);
      std::string first = !r["missing_tensors"].empty() ? "missing " + r["missing_tensors"][0].get<std::string>()
                                                          : "mismatched " + r["mismatched_tensors"][0].dump();
      std::fprintf(stderr, "error: %s: checkpoint is incomplete: %zu missing, %zu mismatched tensors (first: %s)\n",
                   a->dir.c_str(), r["missing_tensors"].size(), r["mismatched_tensors"].size(), first.c_str());
      return 1;
    }
    return 0;
  };
});
}  // namespace
