#include "runtime/decode_plan.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve {

std::vector<int> graph_buckets(int max_num_seqs) {
  std::vector<int> b;
  if (max_num_seqs <= 0) return b;
  auto push = [&](int n) {
    if (n < max_num_seqs && (b.empty() || n > b.back())) b.push_back(n);
  };
  for (int n : {1, 2, 4, 8, 16, 24, 32}) push(n);
  // Past 32: 48, 64, 96, 128, ... (each power of two and the midpoint 1.5x below the next).
  for (int p = 32; p < max_num_seqs; p *= 2) {
    push(p + p / 2);
    push(2 * p);
  }
  b.push_back(max_num_seqs);
  return b;
}

int pick_bucket(const std::vector<int>& buckets, int num_seqs) {
  if (num_seqs <= 0) return 0;
  auto it = std::lower_bound(buckets.begin(), buckets.end(), num_seqs);
  return it == buckets.end() ? 0 : *it;
}

bool is_pure_decode(const StepBatch& batch) {
  if (batch.seqs.empty()) return false;
  for (const auto& s : batch.seqs)
    if (s.tokens.size() != 1) return false;
  return true;
}

DecodeLayout DecodeLayout::make(int bucket, int stride) {
  MS_CHECK(bucket > 0 && stride > 0, "DecodeLayout: bucket {} stride {}", bucket, stride);
  DecodeLayout l;
  l.bucket = bucket;
  l.stride = stride;
  int64_t at = 0;
  auto take = [&](int64_t n) {
    const int64_t off = at;
    at += n;
    return off;
  };
  l.ids = take(bucket);
  l.positions = take(bucket);
  l.slots = take(bucket);
  l.rows = take(bucket);
  l.query_start = take(bucket + 1);
  l.context_lens = take(bucket);
  l.tables = take(int64_t(bucket) * stride);
  l.total = at;
  return l;
}

int plan_padded_decode(const StepBatch& batch, const DecodeLayout& l, const DecodePadding& pad, int32_t* host) {
  const int S = int(batch.seqs.size()), B = l.bucket, bs = pad.block_size;
  MS_CHECK(S <= B, "padded decode: {} sequences in a bucket of {}", S, B);
  MS_CHECK(bs > 0 && pad.dummy_block >= pad.num_kv_blocks, "padded decode: bad padding (block_size {}, dummy {})", bs,
           pad.dummy_block);
  int32_t* ids = host + l.ids;
  int32_t* pos = host + l.positions;
  int32_t* slots = host + l.slots;
  int32_t* rows = host + l.rows;
  int32_t* qs = host + l.query_start;
  int32_t* ctx = host + l.context_lens;
  int32_t* tab = host + l.tables;
  int used = 1;  // padded rows use one column (the dummy block)
  qs[0] = 0;
  for (int r = 0; r < B; ++r) {
    rows[r] = r;
    qs[r + 1] = r + 1;
    int32_t* row = tab + int64_t(r) * l.stride;
    if (r >= S) {  // padding
      ids[r] = 0, pos[r] = 0, slots[r] = -1, ctx[r] = 1;
      row[0] = pad.dummy_block;
      continue;
    }
    const SequenceStep& s = batch.seqs[r];
    MS_CHECK(s.tokens.size() == 1, "sequence {}: {} query tokens in a decode step", s.seq_id, s.tokens.size());
    MS_CHECK(s.start_pos >= 0, "sequence {}: negative start_pos", s.seq_id);
    const int c = s.start_pos + 1;
    MS_CHECK(c <= pad.max_model_len, "sequence {}: {} tokens exceed max_model_len {}", s.seq_id, c, pad.max_model_len);
    const int need = (c + bs - 1) / bs;
    used = std::max(used, need);
    MS_CHECK(need <= l.stride, "sequence {}: {} blocks exceed the table stride {}", s.seq_id, need, l.stride);
    MS_CHECK(int(s.block_table.size()) >= need, "sequence {}: block table has {} blocks, {} tokens need {}", s.seq_id,
             s.block_table.size(), c, need);
    for (int b = 0; b < need; ++b) {
      MS_CHECK(s.block_table[b] >= 0 && s.block_table[b] < pad.num_kv_blocks,
               "sequence {}: block {} out of range [0, {})", s.seq_id, s.block_table[b], pad.num_kv_blocks);
      row[b] = s.block_table[b];
    }
    const int32_t tok = s.tokens[0];
    MS_CHECK(tok >= 0 && tok < pad.vocab_size, "sequence {}: token id {} out of range [0, {})", s.seq_id, tok,
             pad.vocab_size);
    ids[r] = tok;
    pos[r] = s.start_pos;
    slots[r] = s.block_table[s.start_pos / bs] * bs + s.start_pos % bs;
    ctx[r] = c;
  }
  return used;
}

}  // namespace moeserve
