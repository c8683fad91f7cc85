// The sampling family's kernel selector (k_sample.cu): rows are cut into sub-chunks of
// kSampleChunk tokens; a cooperative grid of S blocks per row where more than one block per row
// stays resident, else one block per row. Pure host code.
#pragma once
#include <string>

#include "backend/cuda/common/select_common.h"

namespace moeserve::cuda {

struct SampleOpDesc {
  int rows = 0, vocab = 0;
  int max_resident = 0;  // blocks of sample_kernel resident at once (occupancy x SMs)
};

struct SampleKernel {
  enum Id : uint8_t { kNone, kCooperative, kSingleBlock };
  Id id = kSingleBlock;
  int blocks_per_row = 1;  // of the first launch (rows are launched 256 at a time)
  int launches = 0;
  const char* name() const { return id_name(id); }
  static const char* id_name(Id id);
  std::string describe() const;
  bool operator==(Id o) const { return id == o; }
};

// Blocks per row for R rows of a launch (the cooperative grid when > 1).
int sample_blocks_per_row(int R, int vocab, int max_resident);
SampleKernel select_sample(const SampleOpDesc& d, const DeviceCaps& caps, const CudaTuning& t);

}  // namespace moeserve::cuda
