// `moeserve plan --model DIR|REPO --gpus N --gpu-memory SIZE [...]`: valid parallel layouts
// with weights per GPU, KV-cache tokens and concurrent sequences (src/tools/plan.h).
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "cli/registry.h"
#include "core/error.h"
#include "core/bounded_json.h"
#include "tools/inspect.h"
#include "model/registry.h"
#include "tools/plan.h"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Args {
  std::string model, gpu_memory, max_model_len, revision = "main";
  int gpus = 0;
  moeserve::plan::PlanOptions opt;
  double overhead_gib = 1.0;
  bool json_out = false, replicate_embeddings = false;
};

json parse_json(const std::string& text, const std::string& where) {
  try {
    return moeserve::parse_json_bounded<json>(text, where);
  } catch (const std::exception& e) {
    moeserve::fail("{}: not valid JSON: {}", where, e.what());
  }
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  MS_CHECK(f.good(), "cannot read {}", p.string());
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A single-file checkpoint has no index: build the same facts from its header (8-byte
// little-endian length, then JSON), reading only the header.
json index_from_single_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  MS_CHECK(f.good(), "cannot read {}", p.string());
  unsigned char n8[8] = {0};
  f.read(reinterpret_cast<char*>(n8), 8);
  MS_CHECK(f.gcount() == 8, "{}: shorter than a safetensors header", p.string());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | n8[i];
  const uint64_t size = fs::file_size(p);
  MS_CHECK(n <= size - 8 && n < (uint64_t(100) << 20), "{}: header length {} is invalid", p.string(), n);
  std::string h(n, '\0');
  f.read(h.data(), std::streamsize(n));
  const json header = parse_json(h, p.string());
  MS_CHECK(header.is_object(), "{}: header is not an object", p.string());
  json idx{{"metadata", {{"total_size", int64_t(size - 8 - n)}}}, {"weight_map", json::object()}};
  for (const auto& [k, v] : header.items())
    if (k != "__metadata__") idx["weight_map"][k] = p.filename().string();
  return idx;
}

int run(Args& a) {
  using namespace moeserve::plan;
  MS_CHECK(!a.model.empty(), "plan: --model DIR|REPO is required");
  a.opt.gpus = a.gpus;
  a.opt.gpu_memory = parse_size(a.gpu_memory);
  if (!a.max_model_len.empty()) a.opt.max_model_len = parse_human_int(a.max_model_len);
  MS_CHECK(a.overhead_gib >= 0 && a.overhead_gib < 1e6, "--overhead-gib {}: expected >= 0", a.overhead_gib);
  a.opt.overhead = int64_t(a.overhead_gib * double(int64_t(1) << 30));
  a.opt.vocab_parallel = !a.replicate_embeddings;

  json config, index;
  bool have_index = false;
  std::string config_src, index_src;
  if (fs::is_directory(a.model)) {
    const fs::path d(a.model);
    config_src = (d / "config.json").string();
    config = parse_json(read_file(d / "config.json"), config_src);
    if (fs::exists(d / "model.safetensors.index.json")) {
      index_src = (d / "model.safetensors.index.json").string();
      index = parse_json(read_file(index_src), index_src);
      have_index = true;
    } else if (fs::exists(d / "model.safetensors")) {
      index_src = (d / "model.safetensors").string() + " (header)";
      index = index_from_single_file(d / "model.safetensors");
      have_index = true;
    }
  } else {
    MS_CHECK(looks_like_repo_id(a.model), "--model {}: not a directory and not a hub repo id (org/name)", a.model);
    FetchOptions fo;
    fo.revision = a.revision;
    auto c = fetch_repo_file(a.model, "config.json", fo);
    MS_CHECK(c.has_value(), "{}: config.json not found at revision {} (wrong repo id or revision?)", a.model,
             a.revision);
    config_src = a.model + "/config.json@" + a.revision;
    config = parse_json(*c, config_src);
    if (auto i = fetch_repo_file(a.model, "model.safetensors.index.json", fo)) {
      index_src = a.model + "/model.safetensors.index.json@" + a.revision;
      index = parse_json(*i, index_src);
      have_index = true;
    }
  }
  json r = make_plan(config, have_index ? &index : nullptr, a.opt);
  // Whether this build runs the model (the architecture registry), and the registry's own
  // parameter count from its weight declarations (a cross-check of plan's arithmetic).
  try {
    const moeserve::LoadedConfig lc = moeserve::parse_config(config);
    const moeserve::ParamCounts pc = moeserve::count_params(*lc.config);
    r["architecture"] = {{"supported", true}, {"name", lc.entry->architecture},
                         {"params_total", pc.total}, {"params_active_with_lm_head", pc.active}};
  } catch (const moeserve::Error& e) {
    r["architecture"] = {{"supported", false}, {"problem", e.what()}};
    r["warnings"].push_back(std::string("this build cannot serve the model: ") + e.what());
  }
  r["sources"] = {{"config", config_src}, {"index", have_index ? json(index_src) : json(nullptr)}};
  if (!r["recommended"].is_null()) r["recommended_command"] = moeserve::plan::recommended_command(r, a.model);
  if (a.json_out) {
    std::printf("%s\n", r.dump(2).c_str());
  } else {
    std::printf("config: %s\nindex:  %s\n", config_src.c_str(), have_index ? index_src.c_str() : "(none)");
    std::printf("%s", format_plan(r).c_str());
  }
  return r["recommended"].is_null() ? 2 : 0;
}

moeserve::cli::RegisterSubcommand reg(
    "plan", "List the parallel layouts (TP, TP+EP, DP+EP) that fit a model on N GPUs", [](CLI::App* sub) {
      auto a = std::make_shared<Args>();
      sub->option_defaults()->group("Model and GPUs");
      sub->add_option("--model", a->model, "model directory or hub repo id (only config.json and the index are read)")
          ->required();
      sub->add_option("--gpus", a->gpus, "number of GPUs")->required();
      sub->add_option("--gpu-memory", a->gpu_memory, "memory per GPU: 96GB (= 96e9 B), 80GiB, 141GB")->required();
      sub->add_option("--gpu-memory-utilization", a->opt.utilization, "fraction of GPU memory to use")
          ->capture_default_str();
      sub->option_defaults()->group("Serving settings");
      sub->add_option("--max-model-len", a->max_model_len, "context length (default: max_position_embeddings)");
      sub->add_option("--kv-cache-dtype", a->opt.kv_cache_dtype, "auto (model dtype) or fp8")->capture_default_str();
      sub->add_option("--block-size", a->opt.block_size, "KV cache block size (tokens)")->capture_default_str();
      sub->add_option("--max-num-batched-tokens", a->opt.max_num_batched_tokens, "tokens per step (activation reserve)")
          ->capture_default_str();
      sub->add_option("--max-num-seqs", a->opt.max_num_seqs, "sequences per step (logits reserve)")
          ->capture_default_str();
      sub->add_option("--overhead-gib", a->overhead_gib, "fixed per-GPU reserve (CUDA context, workspaces)")
          ->capture_default_str();
      sub->add_flag("--replicate-embeddings", a->replicate_embeddings,
                    "embedding and lm_head whole on every GPU (default: split by vocab over TP, as vLLM)");
      sub->option_defaults()->group("Output and hub");
      sub->add_option("--revision", a->revision, "hub revision (branch, tag or commit)")->capture_default_str();
      sub->add_flag("--json", a->json_out, "print the plan as JSON");
      return [a] { return run(*a); };
    });

}  // namespace
