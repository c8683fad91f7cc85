// safetensors header parser and checkpoint index. First byte: 0 = the input is a whole
// .safetensors file; 1 = the input is a header JSON, written behind its length with a zeroed
// data section of the size the next two bytes say; 2 = the input is a
// model.safetensors.index.json next to one small valid shard.
#include "fuzz_common.h"
#include "io/safetensors.h"

#include <exception>

using namespace moeserve;

namespace {
std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  return s;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in{data, size};
  const uint8_t mode = in.byte() % 3;
  const std::string dir = fuzz::scratch_dir();
  try {
    if (mode == 0 || mode == 1) {
      std::string file;
      if (mode == 0) {
        file = in.rest();
      } else {
        const size_t data_bytes = (size_t{in.byte()} << 8 | in.byte()) * 4;
        const std::string header = in.rest();
        file = le64(header.size()) + header + std::string(data_bytes, '\0');
      }
      fuzz::write_file(dir + "/x.safetensors", file);
      auto f = SafetensorsFile::open(dir + "/x.safetensors");
      for (const auto& [name, info] : f->tensors()) (void)f->get(name);
    } else {
      const std::string shard = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
      fuzz::write_file(dir + "/model-1.safetensors", le64(shard.size()) + shard + std::string(8, '\0'));
      fuzz::write_file(dir + "/model.safetensors.index.json", in.rest());
      Checkpoint ck = Checkpoint::open(dir);
      for (const auto& name : ck.names()) (void)ck.get(name);
    }
  } catch (const std::exception&) {
    // Errors are the expected answer to bad input; crashes and sanitizer reports are not.
  }
  return 0;
}
