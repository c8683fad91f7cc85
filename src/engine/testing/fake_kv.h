// TEST ONLY. A stand-in for the device KV pool: each slot remembers which (token,
// position) was written there. Test executors write every step's query tokens through the
// block table and read the whole context back through it, so a wrong block table, a
// prefix-cache hit on the wrong block or a read of never-written KV is detected instead
// of silently producing plausible output.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/executor.h"

namespace moeserve::testing {

class FakeKvCache {
 public:
  FakeKvCache(int num_blocks, int block_size);
  // Writes step.tokens at positions [start_pos, start_pos + n) and returns the context
  // [0, start_pos + n) read back through the block table. Throws moeserve::Error on a
  // block id out of range, a table too short, or a slot holding another position.
  std::vector<int32_t> write_and_read(const SequenceStep& step);

 private:
  struct Slot {
    int32_t token = -1;
    int32_t pos = -1;
  };
  Slot& slot(const SequenceStep& step, int32_t pos);
  int num_blocks_, block_size_;
  std::vector<Slot> slots_;
};

}  // namespace moeserve::testing
