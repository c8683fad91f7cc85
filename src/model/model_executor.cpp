#include "model/model_executor.h"

#include <algorithm>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace moeserve {

MiniMaxM2Executor::MiniMaxM2Executor(std::unique_ptr<Backend> backend, const ExecutorOptions& opts)
    : backend_(std::move(backend)), logits_(opts.logits) {
  MS_CHECK(backend_, "MiniMaxM2Executor needs a backend");
  const std::string cfg_path = (std::filesystem::path(opts.model_dir) / "config.json").string();
  MiniMaxM2Config cfg = MiniMaxM2Config::from_file(cfg_path);
  ParallelConfig par;
  AllReduceFn all_reduce;
  if (opts.comm) {
    par = ParallelConfig{opts.comm->rank(), opts.comm->world_size(), opts.expert_parallel};
    Communicator* comm = opts.comm;
    all_reduce = [comm](Tensor& t) { comm->all_reduce_sum(t); };
  }
  model_ = std::make_unique<MiniMaxM2Model>(cfg, *backend_, par, std::move(all_reduce));
  model_->load(Checkpoint::open(opts.model_dir));
  MS_CHECK(opts.block_size > 0, "block_size must be positive");
  info_.vocab_size = cfg.vocab_size;
  info_.max_model_len = opts.max_model_len > 0 ? opts.max_model_len : cfg.max_position_embeddings;
  info_.block_size = opts.block_size;
  info_.num_kv_blocks = opts.num_kv_blocks > 0 ? opts.num_kv_blocks
                                               : (info_.max_model_len + opts.block_size - 1) / opts.block_size;
  if (opts.num_kv_blocks <= 0 && opts.kv_blocks_for_memory) {
    const int64_t per_block = int64_t(cfg.num_hidden_layers) * 2 * opts.block_size * model_->shard().kv_heads *
                              cfg.head_dim * int64_t(dtype_size(backend_->activation_dtype()));
    info_.num_kv_blocks = opts.kv_blocks_for_memory(per_block);
    MS_CHECK(info_.num_kv_blocks > 0, "no memory left for the KV cache ({} bytes per block of {} tokens)", per_block,
             opts.block_size);
  }
  kv_ = model_->allocate_kv_cache(info_.num_kv_blocks, info_.block_size, backend_->activation_dtype());
}

void check_step_batch(const ExecutorInfo& info, const StepBatch& batch) {
  const int bs = info.block_size;
  for (const auto& s : batch.seqs) {
    MS_CHECK(!s.tokens.empty(), "sequence {}: no query tokens this step", s.seq_id);
    MS_CHECK(s.start_pos >= 0, "sequence {}: negative start_pos", s.seq_id);
    const int ctx = s.start_pos + int(s.tokens.size());
    MS_CHECK(ctx <= info.max_model_len, "sequence {}: {} tokens exceed max_model_len {}", s.seq_id, ctx,
             info.max_model_len);
    const int need = (ctx + bs - 1) / bs;
    MS_CHECK(int(s.block_table.size()) >= need, "sequence {}: block table has {} blocks, {} tokens need {}", s.seq_id,
             s.block_table.size(), ctx, need);
    for (int b = 0; b < need; ++b)
      MS_CHECK(s.block_table[b] >= 0 && s.block_table[b] < info.num_kv_blocks,
               "sequence {}: block {} out of range [0, {})", s.seq_id, s.block_table[b], info.num_kv_blocks);
    for (int32_t tok : s.tokens)
      MS_CHECK(tok >= 0 && tok < info.vocab_size, "sequence {}: token id {} out of range [0, {})", s.seq_id, tok,
               info.vocab_size);
  }
}

StepResult MiniMaxM2Executor::execute(const StepBatch& batch) {
  StepResult res;
  res.vocab_size = info_.vocab_size;
  const int S = int(batch.seqs.size());
  if (S == 0) return res;
  const int bs = info_.block_size;
  // Host planning: token ids, positions, per-sequence offsets, block tables, slots.
  std::vector<int32_t> ids, positions, query_start{0}, context_lens, slots, rows;
  int max_blocks = 1, max_q = 0, max_ctx = 0;
  check_step_batch(info_, batch);
  for (const auto& s : batch.seqs) {
    const int ctx = s.start_pos + int(s.tokens.size());
    max_blocks = std::max(max_blocks, (ctx + bs - 1) / bs);
    max_q = std::max(max_q, int(s.tokens.size()));
    max_ctx = std::max(max_ctx, ctx);
  }
  std::vector<int32_t> tables(size_t(S) * max_blocks, 0);
  for (int i = 0; i < S; ++i) {
    const auto& s = batch.seqs[i];
    const int ctx = s.start_pos + int(s.tokens.size());
    for (int b = 0; b < (ctx + bs - 1) / bs; ++b) tables[size_t(i) * max_blocks + b] = s.block_table[b];
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      const int32_t tok = s.tokens[t];
      const int pos = s.start_pos + int(t);
      ids.push_back(tok);
      positions.push_back(pos);
      slots.push_back(s.block_table[pos / bs] * bs + pos % bs);
    }
    query_start.push_back(int32_t(ids.size()));
    context_lens.push_back(ctx);
    if (s.need_logits && logits_) rows.push_back(int32_t(ids.size()) - 1);
  }
  const int T = int(ids.size());
  // Pack every I32 array into one host vector -> one copy into the persistent device buffer;
  // the step's tensors are views of it.
  std::vector<int32_t> packed;
  std::vector<std::pair<int64_t, int64_t>> spans;  // (offset, count) per array
  for (const auto* v : {&positions, &query_start, &context_lens, &tables, &slots, &ids, &rows}) {
    spans.emplace_back(int64_t(packed.size()), int64_t(v->size()));
    packed.insert(packed.end(), v->begin(), v->end());
  }
  if (meta_buf_.numel() < int64_t(packed.size()))
    meta_buf_ = backend_->alloc(DType::I32, {std::max<int64_t>(int64_t(packed.size()) * 2, 4096)});
  Tensor used = meta_buf_.slice_rows(0, int64_t(packed.size()));
  backend_->copy_from_host(used, packed.data(), packed.size() * sizeof(int32_t));
  size_t next = 0;
  auto view = [&](Shape shape) {
    const auto [off, n] = spans[next++];
    return meta_buf_.slice_rows(off, off + n).reshaped(std::move(shape));
  };
  AttentionMeta meta;
  meta.num_seqs = S;
  meta.num_tokens = T;
  meta.block_size = bs;
  meta.max_blocks_per_seq = max_blocks;
  meta.max_query_len = max_q;
  meta.max_context_len = max_ctx;
  meta.positions = view({T});
  meta.query_start = view({S + 1});
  meta.context_lens = view({S});
  meta.block_tables = view({S, max_blocks});
  meta.slot_mapping = view({T});
  Tensor ids_t = view({T});
  Tensor rows_t = view({int64_t(rows.size())});
  if (rows.empty()) rows_t = Tensor{};
  Tensor logits = model_->forward(ids_t, meta, kv_, rows_t);
  if (!rows.empty()) res.logits = backend_->download_f32(logits);
  return res;
}

std::unique_ptr<MiniMaxM2Executor> make_cpu_executor(const ExecutorOptions& opts) {
  return std::make_unique<MiniMaxM2Executor>(make_cpu_backend(), opts);
}

}  // namespace moeserve
