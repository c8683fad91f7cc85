#include "engine/testing/fake_kv.h"

#include "core/error.h"

namespace moeserve::testing {

FakeKvCache::FakeKvCache(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size), slots_(size_t(num_blocks) * block_size) {}

FakeKvCache::Slot& FakeKvCache::slot(const SequenceStep& step, int32_t pos) {
  const size_t bi = size_t(pos / block_size_);
  MS_CHECK(bi < step.block_table.size(), "seq {}: block table ({} blocks) does not cover position {}", step.seq_id,
           step.block_table.size(), pos);
  const int32_t b = step.block_table[bi];
  MS_CHECK(b >= 0 && b < num_blocks_, "seq {}: block id {} out of range", step.seq_id, b);
  return slots_[size_t(b) * block_size_ + pos % block_size_];
}

std::vector<int32_t> FakeKvCache::write_and_read(const SequenceStep& step) {
  const int32_t end = step.start_pos + static_cast<int32_t>(step.tokens.size());
  for (size_t i = 0; i < step.tokens.size(); ++i) {
    Slot& s = slot(step, step.start_pos + int32_t(i));
    s.token = step.tokens[i];
    s.pos = step.start_pos + int32_t(i);
  }
  std::vector<int32_t> ctx(end);
  for (int32_t p = 0; p < end; ++p) {
    const Slot& s = slot(step, p);
    MS_CHECK(s.pos == p, "seq {}: KV slot for position {} holds position {} (stale or shared block)", step.seq_id, p,
             s.pos);
    ctx[p] = s.token;
  }
  return ctx;
}

}  // namespace moeserve::testing
