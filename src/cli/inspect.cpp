// `moeserve inspect DIR [--json]`: checkpoint summary from config.json + safetensors headers.
#include <cstdio>
#include <string>

#include "cli/model_source.h"
#include "cli/registry.h"
#include "tools/inspect.h"

namespace {
struct Args {
  std::string dir;
  bool json = false;
};

moeserve::cli::RegisterSubcommand reg("inspect", "Summarise a model checkpoint directory", [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  auto src = std::make_shared<moeserve::cli::ModelSource>();
  sub->add_option("dir", a->dir, "checkpoint directory, a folder with config.json only, or a hub repo id")->required();
  sub->add_flag("--json", a->json, "print the report as JSON");
  sub->add_option("--revision", src->revision, "revision of a repo id")->capture_default_str();
  sub->add_option("--download-dir", src->download_dir, "hub cache folder (default: $HF_HUB_CACHE)");
  return [a, src] {
    src->tokenizer = false;
    src->weights = false;  // a repo id: what the cache holds, else config.json and the index only
    a->dir = moeserve::cli::resolve_model_path(a->dir, *src);
    const nlohmann::json r = moeserve::inspect_checkpoint(a->dir);
    if (a->json)
      std::printf("%s\n", r.dump(2).c_str());
    else
      std::printf("%s", moeserve::format_inspect(r).c_str());
    // The report is printed either way; a checkpoint that cannot be loaded is an error.
    if (!r["weights_present"].get<bool>()) return 0;  // config only: nothing to load, nothing missing
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
