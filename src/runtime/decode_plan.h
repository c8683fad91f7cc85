// Host planning of padded decode steps for whole-step CUDA graphs (pure host code, tested on
// the CPU). A pure-decode step (every sequence has one query token) of S sequences is padded
// to a batch-size bucket B >= S; all its metadata is written into one I32 host buffer laid
// out like the fixed device buffer the bucket's graph reads (DecodeLayout), so a step is one
// host->device copy plus a graph replay.
//
// Padded rows (S <= r < B) are harmless by construction: token id 0 at position 0, slot -1
// (write_kv skips negative slots, so the KV cache is not touched), context length 1 over a
// dummy KV block that no sequence owns and nothing ever writes (it stays zero, so their
// attention output is 0), and their logits rows are ignored. Rows of a step are independent
// in every op, so real rows get the same values as in an unpadded step.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/executor.h"

namespace moeserve {

// Capture sizes like vLLM's: 1, 2, 4, 8, then steps of 8 up to 32, then x1.5 / x2 (48, 64, 96,
// 128, 192, 256, 384, 512, ...), cut at max_num_seqs, which is always the last bucket.
std::vector<int> graph_buckets(int max_num_seqs);
// Smallest bucket >= num_seqs; 0 when num_seqs is larger than every bucket (or <= 0).
int pick_bucket(const std::vector<int>& buckets, int num_seqs);
// True when every sequence has exactly one query token (and there is at least one).
bool is_pure_decode(const StepBatch& batch);

// Offsets (in I32 elements) of one bucket's arrays in the fixed metadata buffer.
struct DecodeLayout {
  int bucket = 0;  // B rows (tokens = sequences = logits rows)
  int stride = 0;  // block-table row stride (blocks of a max_model_len sequence)
  int64_t ids = 0, positions = 0, slots = 0, rows = 0;  // [B] each
  int64_t query_start = 0;                               // [B + 1]
  int64_t context_lens = 0;                              // [B]
  int64_t tables = 0;                                    // [B, stride]
  int64_t total = 0;
  static DecodeLayout make(int bucket, int stride);
};

struct DecodePadding {
  int block_size = 16;
  int num_kv_blocks = 0;  // blocks the engine may use: [0, num_kv_blocks)
  int dummy_block = 0;    // the extra block padded rows attend to (>= num_kv_blocks)
  int vocab_size = 0;
  int max_model_len = 0;
};

// Fills host[0, layout.total) for `batch` (a pure decode step of at most layout.bucket
// sequences). Validates ids, positions and block tables like the eager path (throws with the
// sequence named). Only the used prefix of each block-table row is written; the rest is
// never read (attention reads ceil(context_len / block_size) entries). Returns the widest used
// prefix (>= 1): the executor uploads only those columns of the [B, stride] table.
int plan_padded_decode(const StepBatch& batch, const DecodeLayout& layout, const DecodePadding& pad,
                        int32_t* host);

}  // namespace moeserve
