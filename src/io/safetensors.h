// safetensors checkpoints: memory-mapped single files and sharded directories
// (model.safetensors.index.json). Every tensor is validated against its file when the
// file is opened (offsets in range, no overlap, byte size == numel * dtype size), so a
// lookup never reads out of bounds. Errors name the file and the tensor.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace moeserve {

struct TensorInfo {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t offset_begin = 0;  // relative to the data section
  uint64_t offset_end = 0;
  std::string file;  // path of the file holding it
};

// One .safetensors file, mmapped read-only for its lifetime.
class SafetensorsFile {
 public:
  static std::shared_ptr<SafetensorsFile> open(const std::string& path);
  ~SafetensorsFile();
  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return tensors_.count(name) != 0; }
  // A host view into the mapping; the returned Tensor keeps the mapping alive.
  Tensor get(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
  const uint8_t* data_ = nullptr;  // start of the data section
  void* map_ = nullptr;
  size_t map_size_ = 0;
  std::weak_ptr<SafetensorsFile> self_;
};

// A checkpoint directory: model.safetensors.index.json (weight_map -> shard) or, without
// an index, every *.safetensors file in the directory (or a single file path).
class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir_or_file);
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const TensorInfo& info(const std::string& name) const;  // throws naming the tensor
  Tensor get(const std::string& name) const;              // throws naming the tensor
  std::vector<std::string> names() const;                 // sorted
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;  // by path
  std::map<std::string, std::shared_ptr<SafetensorsFile>> index_;  // tensor -> file
};

// Writer used by make-tiny, tests and tools. Tensors are written in the order given.
struct NamedTensor {
  std::string name;
  Tensor tensor;  // host
};
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// Splits tensors over shards of at most max_shard_bytes each (a tensor never straddles),
// named model-0000k-of-0000n.safetensors, plus model.safetensors.index.json.
void write_sharded_checkpoint(const std::string& dir, const std::vector<NamedTensor>& tensors,
                              size_t max_shard_bytes);

}  // namespace moeserve
