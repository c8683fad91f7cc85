// Checkpoints: a sharded directory (model.safetensors.index.json), a directory of
// .safetensors files without an index, or one file; and the sharded writer.
//
// With an index the weight_map is authoritative: every listed tensor must be in the shard it
// names (else an error naming tensor and shard, and the shard that does hold it, if any); a
// tensor listed under one shard but also stored in another is an error (two copies that may
// differ); tensors stored in a shard but not listed are not exposed (a warning counts them).
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "core/bounded_json.h"
#include "io/safetensors.h"

namespace fs = std::filesystem;

namespace moeserve {
namespace {

constexpr const char* kIndexName = "model.safetensors.index.json";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MS_CHECK(in.good(), "{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  MS_CHECK(!in.bad(), "{}: read failed", path);
  return ss.str();
}

// A shard name from the index must stay inside the checkpoint directory.
void check_shard_name(const std::string& index_path, const std::string& tensor,
                      const std::string& shard) {
  fs::path p(shard);
  bool ok = !shard.empty() && p.is_relative();
  for (const auto& part : p) ok = ok && part != "..";
  MS_CHECK(ok, "{}: tensor '{}' maps to shard '{}', which is not a file name inside the directory",
           index_path, tensor, shard);
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir_or_file) {
  Checkpoint ck;
  std::error_code ec;
  MS_CHECK(fs::exists(dir_or_file, ec), "{}: checkpoint path does not exist", dir_or_file);

  if (!fs::is_directory(dir_or_file, ec)) {
    // One file: dir() is its directory (config.json etc. live next to it).
    ck.dir_ = fs::path(dir_or_file).parent_path().string();
    if (ck.dir_.empty()) ck.dir_ = ".";
    auto f = SafetensorsFile::open(dir_or_file);
    ck.files_[dir_or_file] = f;
    for (const auto& [name, _] : f->tensors()) ck.index_[name] = f;
    return ck;
  }

  ck.dir_ = dir_or_file;
  fs::path index_path = fs::path(dir_or_file) / kIndexName;
  if (fs::exists(index_path, ec)) {
    const std::string ip = index_path.string();
    const std::string index_text = read_text(ip);
    MS_CHECK(json_nesting_depth(index_text, json_depth_limit()) <= json_depth_limit(),
             "{}: JSON nested deeper than {} levels (the nesting limit)", ip, json_depth_limit());
    nlohmann::json index = parse_json_bounded_or_discarded(index_text);
    MS_CHECK(!index.is_discarded(), "{}: not valid JSON", ip);
    MS_CHECK(index.is_object(), "{}: not a JSON object", ip);
    auto wm = index.find("weight_map");
    MS_CHECK(wm != index.end(), "{}: missing 'weight_map'", ip);
    MS_CHECK(wm->is_object(), "{}: 'weight_map' is not an object", ip);

    // Open every shard once, in name order; the first tensor naming a shard is reported if the
    // shard cannot be opened.
    std::map<std::string, std::string> shard_first_tensor;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      MS_CHECK(it->is_string(), "{}: weight_map entry for tensor '{}' is not a string", ip,
               it.key());
      const std::string& shard = it->get_ref<const std::string&>();
      check_shard_name(ip, it.key(), shard);
      shard_first_tensor.emplace(shard, it.key());
    }
    std::map<std::string, std::shared_ptr<SafetensorsFile>> by_shard;
    for (const auto& [shard, tensor] : shard_first_tensor) {
      std::string sp = (fs::path(dir_or_file) / shard).string();
      MS_CHECK(fs::is_regular_file(sp, ec),
               "{}: shard '{}' (holding tensor '{}') does not exist or is not a file", ip, sp,
               tensor);
      by_shard[shard] = SafetensorsFile::open(sp);
      ck.files_[sp] = by_shard[shard];
    }
    // Which shards hold each stored tensor (one pass over all headers, not shards x tensors).
    std::map<std::string, std::vector<std::string>> holders;
    for (const auto& [shard, f] : by_shard) {
      for (const auto& [name, _] : f->tensors()) holders[name].push_back(shard);
    }
    size_t unlisted = 0;
    for (const auto& [name, _] : holders) unlisted += wm->contains(name) ? 0 : 1;
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      const std::string& name = it.key();
      const std::string& shard = it->get_ref<const std::string&>();
      const auto& f = by_shard.at(shard);
      std::string elsewhere;
      auto h = holders.find(name);
      if (h != holders.end()) {
        for (const std::string& other : h->second) {
          if (other != shard) elsewhere = by_shard.at(other)->path();
        }
      }
      if (!f->contains(name)) {
        fail("{}: tensor '{}' is listed in shard '{}' but that shard does not contain it{}", ip,
             name, f->path(), elsewhere.empty() ? "" : " (it is in '" + elsewhere + "')");
      }
      MS_CHECK(elsewhere.empty(),
               "{}: tensor '{}' is listed in shard '{}' but is also stored in '{}' (ambiguous)", ip,
               name, f->path(), elsewhere);
      ck.index_[name] = f;
    }
    if (unlisted) {
      spdlog::warn("{}: {} tensors stored in shards are not in weight_map and are ignored", ip,
                   unlisted);
    }
    return ck;
  }

  // No index: every *.safetensors file in the directory; a name in two files is an error.
  std::vector<std::string> paths;
  for (const auto& e : fs::directory_iterator(dir_or_file, ec)) {
    if (e.path().extension() == ".safetensors" && e.is_regular_file()) {
      paths.push_back(e.path().string());
    }
  }
  MS_CHECK(!ec, "{}: cannot list directory: {}", dir_or_file, ec.message());
  MS_CHECK(!paths.empty(), "{}: no {} and no *.safetensors files", dir_or_file, kIndexName);
  std::sort(paths.begin(), paths.end());
  for (const std::string& p : paths) {
    auto f = SafetensorsFile::open(p);
    ck.files_[p] = f;
    for (const auto& [name, _] : f->tensors()) {
      auto [it, inserted] = ck.index_.emplace(name, f);
      MS_CHECK(inserted, "{}: tensor '{}' is stored in both '{}' and '{}'", dir_or_file, name,
               it->second->path(), p);
    }
  }
  return ck;
}

const TensorInfo& Checkpoint::info(const std::string& name) const {
  auto it = index_.find(name);
  MS_CHECK(it != index_.end(), "{}: checkpoint has no tensor named '{}'", dir_, name);
  return it->second->tensors().at(name);
}

Tensor Checkpoint::get(const std::string& name) const {
  auto it = index_.find(name);
  MS_CHECK(it != index_.end(), "{}: checkpoint has no tensor named '{}'", dir_, name);
  return it->second->get(name);
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  out.reserve(index_.size());
  for (const auto& [name, _] : index_) out.push_back(name);
  return out;  // std::map order: sorted
}

void write_sharded_checkpoint(const std::string& dir, const std::vector<NamedTensor>& tensors,
                              size_t max_shard_bytes) {
  MS_CHECK(max_shard_bytes > 0, "{}: max_shard_bytes must be positive", dir);
  std::set<std::string> seen;
  for (const NamedTensor& nt : tensors) {
    MS_CHECK(seen.insert(nt.name).second, "{}: tensor '{}' given twice", dir, nt.name);
  }
  // Greedy packing in the given order; a tensor larger than the limit gets a shard of its own.
  std::vector<std::vector<NamedTensor>> shards(1);
  size_t cur = 0, total = 0;
  for (const NamedTensor& nt : tensors) {
    size_t nb = nt.tensor.nbytes();
    if (!shards.back().empty() && cur + nb > max_shard_bytes) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(nt);
    cur += nb;
    total += nb;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  MS_CHECK(!ec, "{}: cannot create directory: {}", dir, ec.message());

  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  const size_t n = shards.size();
  for (size_t k = 0; k < n; ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, n);
    // "format": "pt" is what PyTorch-side loaders expect to find in shard metadata.
    write_safetensors((fs::path(dir) / name).string(), shards[k], {{"format", "pt"}});
    for (const NamedTensor& nt : shards[k]) weight_map[nt.name] = name;
  }
  nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}},
                                  {"weight_map", weight_map}};
  std::string ip = (fs::path(dir) / kIndexName).string();
  std::ofstream out(ip, std::ios::trunc);
  MS_CHECK(out.good(), "{}: cannot open for writing", ip);
  out << index.dump(2) << "\n";
  out.flush();
  MS_CHECK(out.good(), "{}: write failed", ip);
}

}  // namespace moeserve
