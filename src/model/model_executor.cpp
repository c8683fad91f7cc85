#include "model/model_executor.h"

#include <algorithm>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace moeserve {

MiniMaxM2Executor::MiniMaxM2Executor(std::unique_ptr<Backend> backend, const ExecutorOptions& opts)
    : backend_(std::move(backend)) {
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
  device_sampler_ = opts.device_sampler;
  info_.device_sampling = bool(device_sampler_);
  MS_CHECK(!device_sampler_ || info_.vocab_size < (1 << 24), "device sampling: vocab {} >= 2^24", info_.vocab_size);
  kv_ = model_->allocate_kv_cache(info_.num_kv_blocks, info_.block_size, backend_->activation_dtype());
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
  for (const auto& s : batch.seqs) {
    MS_CHECK(!s.tokens.empty(), "sequence {}: no query tokens this step", s.seq_id);
    MS_CHECK(s.start_pos >= 0, "sequence {}: negative start_pos", s.seq_id);
    const int ctx = s.start_pos + int(s.tokens.size());
    MS_CHECK(ctx <= info_.max_model_len, "sequence {}: {} tokens exceed max_model_len {}", s.seq_id, ctx,
             info_.max_model_len);
    const int need = (ctx + bs - 1) / bs;
    MS_CHECK(int(s.block_table.size()) >= need, "sequence {}: block table has {} blocks, {} tokens need {}", s.seq_id,
             s.block_table.size(), ctx, need);
    for (int b = 0; b < need; ++b)
      MS_CHECK(s.block_table[b] >= 0 && s.block_table[b] < info_.num_kv_blocks,
               "sequence {}: block {} out of range [0, {})", s.seq_id, s.block_table[b], info_.num_kv_blocks);
    max_blocks = std::max(max_blocks, need);
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
      MS_CHECK(tok >= 0 && tok < info_.vocab_size, "sequence {}: token id {} out of range [0, {})", s.seq_id, tok,
               info_.vocab_size);
      const int pos = s.start_pos + int(t);
      ids.push_back(tok);
      positions.push_back(pos);
      slots.push_back(s.block_table[pos / bs] * bs + pos % bs);
    }
    query_start.push_back(int32_t(ids.size()));
    context_lens.push_back(ctx);
    if (s.need_logits) rows.push_back(int32_t(ids.size()) - 1);
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
  if (!rows.empty()) collect_rows(batch, logits, res);
  return res;
}

void MiniMaxM2Executor::collect_rows(const StepBatch& batch, const Tensor& logits, StepResult& res) {
  const int64_t R = logits.dim(0);
  // Per logits row: its device parameters, or greedy as a placeholder for a host row (the
  // kernel costs one block per row; sampling all rows keeps the logits one contiguous input).
  std::vector<DeviceSampling> params;
  std::vector<char> host(size_t(R), 0);
  int64_t num_host = 0;
  for (const auto& s : batch.seqs) {
    if (!s.need_logits) continue;
    MS_CHECK(!s.device_sample || device_sampler_, "sequence {}: device sampling requested, executor has none",
             s.seq_id);
    host[params.size()] = !s.device_sample;
    num_host += !s.device_sample;
    params.push_back(s.device_sample.value_or(DeviceSampling{}));
  }
  MS_CHECK(int64_t(params.size()) == R, "{} logits rows for {} sampling sequences", R, params.size());
  if (num_host == R) {
    res.logits = backend_->download_f32(logits);
    return;
  }
  // (An empty Tensor has shape [] and numel() 1: test the data pointer too.)
  if (!sampled_buf_.data || sampled_buf_.numel() < R) sampled_buf_ = backend_->alloc(DType::I32, {std::max<int64_t>(R, 256)});
  Tensor ids = sampled_buf_.slice_rows(0, R);
  device_sampler_(logits, params, ids);
  const std::vector<float> got = backend_->download_f32(ids);  // exact: ids < 2^24
  res.sampled_ids.reserve(size_t(R - num_host));
  for (int64_t r = 0; r < R; ++r)
    if (!host[r]) res.sampled_ids.push_back(int32_t(got[r]));
  // Host rows' logits, one download per contiguous run of host rows.
  res.logits.reserve(size_t(num_host) * size_t(info_.vocab_size));
  for (int64_t r = 0; r < R;) {
    if (!host[r]) {
      ++r;
      continue;
    }
    int64_t e = r;
    while (e < R && host[e]) ++e;
    const std::vector<float> part = backend_->download_f32(logits.slice_rows(r, e));
    res.logits.insert(res.logits.end(), part.begin(), part.end());
    r = e;
  }
}

std::unique_ptr<MiniMaxM2Executor> make_cpu_executor(const ExecutorOptions& opts) {
  return std::make_unique<MiniMaxM2Executor>(make_cpu_backend(), opts);
}

}  // namespace moeserve
