// A model argument is a local folder or a hub repo id (ORG/NAME). Repo ids resolve through the
// standard hub cache ($HF_HUB_CACHE, or --download-dir) at --revision: a complete snapshot is
// used as is (no network); a missing or incomplete one is fetched first with `pull`'s
// machinery (progress, resume, sha256), unless HF_HUB_OFFLINE=1, in which case the error names
// the missing files and the `moeserve pull` command that fetches them.
#pragma once
#include <string>
#include <vector>

namespace moeserve::cli {

struct ModelSource {
  std::string revision = "main";
  std::string download_dir;  // empty: hf_hub_cache()
  bool weights = true;       // false: config, tokenizer and template files only (--load-format dummy)
  bool tokenizer = true;     // whether tokenizer.json is required
};

// "org/name": one '/', neither part empty, no "..", no "--", no leading '.'.
bool looks_like_repo_id(const std::string& s);
// HF_HUB_OFFLINE set to a true value (1, true, yes, on): use the hub cache only.
bool hub_offline();
// Files a snapshot folder lacks for `src` (config.json, tokenizer.json, every shard named by
// model.safetensors.index.json, or a *.safetensors file); empty when complete.
std::vector<std::string> missing_model_files(const std::string& dir, const ModelSource& src);
// The folder to load `spec` from (see above). Throws moeserve::Error with the reason.
std::string resolve_model_path(const std::string& spec, const ModelSource& src);

}  // namespace moeserve::cli
