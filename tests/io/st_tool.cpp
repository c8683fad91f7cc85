// Test helper for the Python cross-check (test_safetensors_compat.py):
//   st_tool dump <file|dir>                 JSON {name: {dtype, shape, hex}} on stdout
//   st_tool copy <in> <out.safetensors>     re-write every tensor with write_safetensors
//   st_tool reshard <in> <dir> <max_bytes>  re-write as a sharded checkpoint
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "core/error.h"
#include "io/safetensors.h"

using namespace moeserve;

static std::vector<NamedTensor> all(const Checkpoint& ck) {
  std::vector<NamedTensor> out;
  for (const auto& n : ck.names()) out.push_back({n, ck.get(n)});
  return out;
}

int main(int argc, char** argv) {
  try {
    std::string cmd = argc > 1 ? argv[1] : "";
    if (cmd == "dump" && argc == 3) {
      Checkpoint ck = Checkpoint::open(argv[2]);
      nlohmann::json j = nlohmann::json::object();
      static const char* digits = "0123456789abcdef";
      for (const auto& nt : all(ck)) {
        std::string hex;
        const auto* p = nt.tensor.ptr<uint8_t>();
        for (size_t i = 0; i < nt.tensor.nbytes(); ++i) {
          hex += digits[p[i] >> 4];
          hex += digits[p[i] & 15];
        }
        j[nt.name] = {{"dtype", std::string(dtype_name(nt.tensor.dtype))},
                      {"shape", nt.tensor.shape},
                      {"hex", hex}};
      }
      std::printf("%s\n", j.dump().c_str());
      return 0;
    }
    if (cmd == "copy" && argc == 4) {
      Checkpoint ck = Checkpoint::open(argv[2]);
      write_safetensors(argv[3], all(ck), {{"format", "pt"}, {"writer", "moeserve"}});
      return 0;
    }
    if (cmd == "reshard" && argc == 5) {
      Checkpoint ck = Checkpoint::open(argv[2]);
      write_sharded_checkpoint(argv[3], all(ck), std::stoull(argv[4]));
      return 0;
    }
    std::fprintf(stderr,
                 "usage: st_tool dump <path> | copy <in> <out> | reshard <in> <dir> <bytes>\n");
    return 2;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
