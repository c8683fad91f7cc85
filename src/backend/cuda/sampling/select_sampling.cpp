// select_sample.
#include "backend/cuda/sampling/select_sampling.h"

#include <algorithm>

#include <fmt/format.h>

namespace moeserve::cuda {

const char* SampleKernel::id_name(Id id) {
  switch (id) {
    case kNone: return "none";
    case kCooperative: return "sample_cooperative";
    case kSingleBlock: return "sample_block_per_row";
  }
  return "?";
}

std::string SampleKernel::describe() const {
  if (id == kCooperative) return fmt::format("{}({} blocks/row)", name(), blocks_per_row);
  return name();
}

int sample_blocks_per_row(int R, int vocab, int max_resident) {
  const int NC = (vocab + limits::kSampleChunk - 1) / limits::kSampleChunk;
  return std::max(1, std::min(NC, max_resident / std::max(1, R)));
}

SampleKernel select_sample(const SampleOpDesc& d, const DeviceCaps& caps, const CudaTuning& t) {
  (void)caps, (void)t;
  SampleKernel k;
  if (d.rows == 0) {
    k.id = SampleKernel::kNone;
    return k;
  }
  const int R = std::min(limits::kSampleRowsPerLaunch, d.rows);
  k.blocks_per_row = sample_blocks_per_row(R, d.vocab, d.max_resident);
  k.id = k.blocks_per_row > 1 ? SampleKernel::kCooperative : SampleKernel::kSingleBlock;
  k.launches = (d.rows + limits::kSampleRowsPerLaunch - 1) / limits::kSampleRowsPerLaunch;
  return k;
}

}  // namespace moeserve::cuda
