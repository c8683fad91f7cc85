#include "runtime/model_executor.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include <fmt/ranges.h>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/log.h"
#include "runtime/spec_runner.h"
#include "core/kv_cache_dtype.h"
#include "model/kv_scales.h"

namespace moeserve {

RankExecutor::RankExecutor(std::unique_ptr<Backend> backend, const ExecutorOptions& opts)
    : backend_(std::move(backend)), logits_(opts.logits) {
  MS_CHECK(backend_, "RankExecutor needs a backend");
  const KvCacheDtype kv_dtype = parse_kv_cache_dtype(opts.kv_cache_dtype);  // refused before anything loads
  kv_dtype_ = kv_cache_storage_dtype(kv_dtype, backend_->activation_dtype());
  const LoadedConfig lc = load_model_config(opts.model_dir, opts.hf_overrides);
  const ModelDesc cfg = lc.config->desc();
  ParallelConfig par;
  AllReduceFn all_reduce;
  if (opts.comm) {
    par = ParallelConfig{opts.comm->rank(), opts.comm->world_size(), opts.expert_parallel};
    Communicator* comm = opts.comm;
    all_reduce = [comm](Tensor& t) { comm->all_reduce_sum(t); };
  }
  model_ = lc.entry->create(*lc.config, *backend_, par, std::move(all_reduce));
  {  // before the weights: a cache layout the backend's attention cannot run fails at load
    const KvLayout kl = model_->kv_layout();
    const std::string why = backend_->attention_layout_problem(kl);
    MS_CHECK(why.empty(), "{} ({}): KV cache of {} layers x {} KV heads, K head dim {}, V head dim {} on {}: {}",
             cfg.architecture, opts.model_dir, kl.num_layers, kl.kv_heads, kl.k_head_dim, kl.v_head_dim,
             backend_->name(), why);
  }
  std::vector<KvScales> kv_scales;
  if (opts.make_weights) {
    opts.make_weights(*backend_, *model_, opts.logits);
  } else {
    const Checkpoint ckpt = Checkpoint::open(opts.model_dir);
    model_->load(ckpt);
    if (kv_dtype == KvCacheDtype::Fp8E4M3) kv_scales = read_kv_scales(ckpt, model_->kv_layout().num_layers);
  }
  MS_CHECK(opts.block_size > 0, "block_size must be positive");
  info_.vocab_size = cfg.vocab_size;
  info_.max_model_len = opts.max_model_len > 0 ? opts.max_model_len : cfg.max_position_embeddings;
  MS_CHECK(info_.max_model_len > 0, "max_model_len: the config has no max_position_embeddings; give one");
  info_.block_size = opts.block_size;
  info_.num_kv_blocks = opts.num_kv_blocks > 0 ? opts.num_kv_blocks
                                               : (info_.max_model_len + opts.block_size - 1) / opts.block_size;
  // With several ranks, graphs need a communicator whose all-reduces are stream-ordered device
  // work (NCCL): each rank then captures its own graph, the collectives inside, and every rank
  // replays the same bucket in the same step (they all plan the same batch).
  const int world = opts.comm ? opts.comm->world_size() : 1;
  const bool comm_ok = world == 1 || opts.comm->graph_capturable();
  // A draft head needs the target's hidden states of every step (captured by the eager
  // forward's ops): decode steps run eagerly, unpadded, with one.
  const bool draft = opts.speculative.method == SpecMethod::Eagle3 || opts.speculative.method == SpecMethod::Mtp;
  const bool want_graphs = !opts.enforce_eager && comm_ok && !draft;
  graphs_ = want_graphs ? (opts.graph_runner_factory ? opts.graph_runner_factory(*backend_)
                                                     : make_graph_runner(*backend_))
                        : nullptr;
  if (!opts.enforce_eager && !comm_ok)
    spdlog::info("executor: decode graphs off with {} ranks (the communicator cannot be captured)", world);
  if ((graphs_ || opts.pad_decode) && !draft) buckets_ = moeserve::graph_buckets(std::max(1, opts.max_num_seqs));

  // Step workspaces before the KV pool is sized, so the pool gets what is really left.
  const int max_bucket = buckets_.empty() ? 0 : buckets_.back();
  const int max_tokens = std::max(opts.max_num_batched_tokens, max_bucket);
  if (max_tokens > 0) {
    const int64_t used0 = backend_memory_used(*backend_);
    model_->reserve_workspace(max_tokens, std::max(1, std::max(opts.max_num_seqs, max_bucket)));
    backend_->reserve_workspaces(model_->backend_workspace_dims(max_tokens));
    const int64_t used1 = backend_memory_used(*backend_);
    spdlog::log(used0 >= 0 ? spdlog::level::info : spdlog::level::debug,
                "executor: step workspaces for {} tokens: model {:.1f} MiB{}", max_tokens,
                 model_->workspace_bytes() / 1048576.0,
                 used0 >= 0 ? fmt::format(", device memory {:+.1f} MiB in all", (used1 - used0) / 1048576.0) : "");
  }
  // The draft loads before the KV pool is sized: its cache takes a share of the same memory.
  if (draft) {
    MS_CHECK(world == 1, "--speculative-config method \"{}\" runs on one rank only (tensor parallel {})",
             spec_method_name(opts.speculative.method), world);
    spec_ = std::make_unique<SpecRunner>(SpecRunnerOptions{.config = opts.speculative,
                                                           .target_dir = opts.model_dir,
                                                           .block_size = info_.block_size,
                                                           .max_num_seqs = opts.max_num_seqs},
                                         *backend_, *model_);
    info_.draft_model = true;
  }
  if (opts.num_kv_blocks <= 0 && opts.kv_blocks_for_memory) {
    const int64_t per_block = kv_bytes_per_block() + (spec_ ? spec_->kv_bytes_per_block() : 0);
    // One block more than the pool: the dummy block padded decode rows attend to.
    info_.num_kv_blocks = opts.kv_blocks_for_memory(per_block) - (buckets_.empty() ? 0 : 1);
    MS_CHECK(info_.num_kv_blocks > 0, "no memory left for the KV cache ({} bytes per block of {} tokens)", per_block,
             opts.block_size);
  }
  device_sampler_ = opts.device_sampler;
  info_.device_sampling = bool(device_sampler_);
  MS_CHECK(!device_sampler_ || info_.vocab_size < (1 << 24), "device sampling: vocab {} >= 2^24", info_.vocab_size);
  const int extra = buckets_.empty() ? 0 : 1;
  kv_ = allocate_kv_cache(*backend_, model_->kv_layout(), info_.num_kv_blocks + extra, info_.block_size, kv_dtype_);
  int scaled = 0;
  for (size_t l = 0; l < kv_.size() && l < kv_scales.size(); ++l) {
    kv_[l].k_scale = kv_scales[l].k, kv_[l].v_scale = kv_scales[l].v;
    scaled += kv_scales[l].k_found || kv_scales[l].v_found;
  }
  spdlog::info("KV cache: {} blocks = {} tokens (block size {}, {}{})", info_.num_kv_blocks,
               int64_t(info_.num_kv_blocks) * info_.block_size, info_.block_size, dtype_name(kv_dtype_),
               kv_dtype == KvCacheDtype::Auto ? ""
               : scaled ? fmt::format("; k_scale / v_scale from the checkpoint for {} of {} layers, 1.0 elsewhere",
                                      scaled, kv_.size())
                        : std::string("; k_scale = v_scale = 1.0: the checkpoint has no KV scales (vLLM's default "
                                      "without calculate_kv_scales)"));
  if (spec_) spec_->allocate_kv(info_.num_kv_blocks);

  if (!buckets_.empty()) {
    pad_.block_size = info_.block_size;
    pad_.num_kv_blocks = info_.num_kv_blocks;
    pad_.dummy_block = info_.num_kv_blocks;
    pad_.vocab_size = info_.vocab_size;
    pad_.max_model_len = info_.max_model_len;
    const int stride = (info_.max_model_len + info_.block_size - 1) / info_.block_size;
    const DecodeLayout big = DecodeLayout::make(max_bucket, stride);
    graph_meta_ = backend_->alloc(DType::I32, {big.total});
    staging_.assign(size_t(big.total), 0);
    spdlog::info("executor: decode steps padded to buckets [{}]{}", fmt::join(buckets_, ", "),
                 graphs_ ? " and replayed as graphs" : " (eager)");
    if (graphs_ && opts.capture_graphs_at_startup) {
      const auto t0 = std::chrono::steady_clock::now();
      const int64_t m0 = backend_memory_used(*backend_);
      for (int B : buckets_) forward_padded(StepBatch{}, B);  // all rows padding: writes no KV
      const int64_t m1 = backend_memory_used(*backend_);
      spdlog::info("executor: captured {} decode graphs in {:.2f} s{}", graphs_->size(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                   m0 >= 0 ? fmt::format(" ({:+.1f} MiB device memory)", (m1 - m0) / 1048576.0) : "");
    }
  }
}

RankExecutor::~RankExecutor() = default;

std::vector<std::vector<int32_t>> RankExecutor::propose(const DraftBatch& batch) {
  MS_CHECK(spec_, "propose: this executor has no draft");
  return spec_->propose(batch);
}

void RankExecutor::release_draft(int64_t seq_id) {
  if (spec_) spec_->release(seq_id);
}

int64_t RankExecutor::kv_bytes_per_block() const {
  return model_->kv_layout().bytes_per_block(info_.block_size, int64_t(dtype_size(kv_dtype_)));
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
    MS_CHECK(s.num_logits >= 1 && s.num_logits <= int(s.tokens.size()),
             "sequence {}: num_logits {} outside [1, {} query tokens]", s.seq_id, s.num_logits, s.tokens.size());
    MS_CHECK(s.num_logits == 1 || (!s.device_sample && !s.need_prompt_logits),
             "sequence {}: num_logits {} > 1 with device sampling or prompt logits", s.seq_id, s.num_logits);
    for (int32_t tok : s.tokens)
      MS_CHECK(tok >= 0 && tok < info.vocab_size, "sequence {}: token id {} out of range [0, {})", s.seq_id, tok,
               info.vocab_size);
  }
}

StepResult RankExecutor::execute(const StepBatch& batch) {
  StepResult res;
  res.vocab_size = info_.vocab_size;
  const int S = int(batch.seqs.size());
  if (S == 0) return res;
  Tensor logits;
  const bool all_logits = std::all_of(batch.seqs.begin(), batch.seqs.end(), [](auto& s) { return s.need_logits; });
  const bool any_prompt_logits =
      std::any_of(batch.seqs.begin(), batch.seqs.end(), [](auto& s) { return s.need_prompt_logits; });
  const int bucket = all_logits && !any_prompt_logits && is_pure_decode(batch) ? pick_bucket(buckets_, S) : 0;
  if (bucket > 0) {
    logits = forward_padded(batch, bucket);  // undefined on a rank without logits
    if (logits.defined()) logits = logits.slice_rows(0, S);  // padded rows' logits are dropped
  } else
    logits = forward_eager(batch);
  if (spec_) spec_->note_step(batch);
  if (logits.defined()) collect_rows(batch, logits, res);
  return res;
}

void RankExecutor::drop_stale_graphs() {
  if (!graphs_) return;
  const int64_t ep = model_->workspace_epoch();
  const uint64_t gen = graphs_->backend_generation();
  if (ep == graph_ws_epoch_ && gen == graph_backend_gen_) return;
  if (graphs_->size() > 0)
    spdlog::info("executor: step workspaces were reallocated; dropping {} decode graphs (recaptured on use)",
                 graphs_->size());
  graphs_->clear();
  graph_logits_.clear();
  graph_ws_epoch_ = ep;
  graph_backend_gen_ = gen;
}

Tensor RankExecutor::forward_padded(const StepBatch& batch, int bucket) {
  const int stride = (info_.max_model_len + info_.block_size - 1) / info_.block_size;
  const DecodeLayout L = DecodeLayout::make(bucket, stride);
  const int used = plan_padded_decode(batch, L, pad_, staging_.data());
  // The small arrays in one copy; of the [B, stride] block table only the used columns (a
  // full-width copy is B x max_model_len / block_size ints: ~12 MB at 196k x 256 rows).
  Tensor head = graph_meta_.slice_rows(0, L.tables);
  backend_->copy_from_host(head, staging_.data(), size_t(L.tables) * sizeof(int32_t));
  Tensor tables = graph_meta_.slice_rows(L.tables, L.total);
  const size_t pitch = size_t(stride) * sizeof(int32_t);
  backend_->copy_from_host_2d(tables, pitch, staging_.data() + L.tables, pitch, size_t(used) * sizeof(int32_t),
                              size_t(bucket));
  // The step's tensors: fixed views of graph_meta_ for this bucket.
  auto at = [&](int64_t off, Shape shape) {
    const int64_t n = shape_numel(shape);
    return graph_meta_.slice_rows(off, off + n).reshaped(std::move(shape));
  };
  const int B = bucket;
  AttentionMeta meta;
  meta.num_seqs = B;
  meta.num_tokens = B;
  meta.block_size = info_.block_size;
  meta.max_blocks_per_seq = stride;
  meta.max_query_len = 1;
  // Fixed (not this step's longest context): host decisions that depend on it, like the
  // CUDA attention's KV split count, must be the same on every replay. Splits past a
  // sequence's context are empty.
  meta.max_context_len = info_.max_model_len;
  meta.positions = at(L.positions, {B});
  meta.query_start = at(L.query_start, {B + 1});
  meta.context_lens = at(L.context_lens, {B});
  meta.block_tables = at(L.tables, {B, stride});
  meta.slot_mapping = at(L.slots, {B});
  // A rank without logits (parallel ranks other than 0) stops after the last layer.
  const Tensor ids = at(L.ids, {B}), rows = logits_ ? at(L.rows, {B}) : Tensor{};

  drop_stale_graphs();
  if (graphs_ && graphs_->has(B)) {
    graphs_->replay(B);
    ++replays_;
    return graph_logits_[B];
  }
  Tensor logits = model_->forward(ids, meta, kv_, rows);  // eager (the bucket's warm-up with graphs)
  if (graphs_) {
    drop_stale_graphs();  // the warm-up may have grown a workspace
    graphs_->capture(B, [this, meta, ids, rows]() { model_->forward(ids, meta, kv_, rows); });
    graph_logits_[B] = logits;
  }
  return logits;
}

Tensor RankExecutor::forward_eager(const StepBatch& batch) {
  const int S = int(batch.seqs.size());
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
    // Logits rows: every query token of a need_prompt_logits sequence (its last one is also
    // its sampling row), else the last num_logits tokens of a sampling sequence (1, or 1 + k
    // for a speculative verify).
    if (logits_ && s.need_prompt_logits)
      for (size_t t = 0; t < s.tokens.size(); ++t) rows.push_back(query_start[i] + int32_t(t));
    else if (s.need_logits && logits_)
      for (int j = s.num_logits; j >= 1; --j) rows.push_back(int32_t(ids.size()) - j);
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
  return model_->forward(ids_t, meta, kv_, rows_t);
}

void RankExecutor::collect_rows(const StepBatch& batch, const Tensor& logits, StepResult& res) {
  const int64_t R = logits.dim(0);
  // Per logits row (forward_eager's order): its device parameters, or greedy as a placeholder
  // for a host or prompt-only row (the kernel costs one block per row; sampling all rows keeps
  // the logits one contiguous input). sample_host: the row is sampled on the host;
  // sample_device: on the device; prompt: it goes to StepResult::prompt_logits.
  std::vector<DeviceSampling> params;
  std::vector<char> sample_host, sample_device, prompt;
  for (const auto& s : batch.seqs) {
    MS_CHECK(!s.device_sample || device_sampler_, "sequence {}: device sampling requested, executor has none",
             s.seq_id);
    const size_t n = s.need_prompt_logits ? s.tokens.size() : (s.need_logits ? size_t(s.num_logits) : 0);
    for (size_t t = 0; t < n; ++t) {
      const bool sampling = s.need_logits && t + size_t(s.num_logits) >= n;
      params.push_back(sampling ? s.device_sample.value_or(DeviceSampling{}) : DeviceSampling{});
      sample_host.push_back(sampling && !s.device_sample);
      sample_device.push_back(sampling && s.device_sample.has_value());
      prompt.push_back(s.need_prompt_logits);
    }
  }
  MS_CHECK(int64_t(params.size()) == R, "{} logits rows for {} expected rows", R, params.size());
  const auto count = [](const std::vector<char>& v) { return std::count(v.begin(), v.end(), char(1)); };
  const int64_t num_host = count(sample_host), num_device = count(sample_device), num_prompt = count(prompt);
  if (num_host == R && num_prompt == 0) {
    res.logits = backend_->download_f32(logits);
    return;
  }
  if (num_device > 0) {
    // (An empty Tensor has shape [] and numel() 1: test the data pointer too.)
    if (!sampled_buf_.data || sampled_buf_.numel() < R)
      sampled_buf_ = backend_->alloc(DType::I32, {std::max<int64_t>(R, 256)});
    Tensor ids = sampled_buf_.slice_rows(0, R);
    // Grammar masks still being made on a CPU thread: waited for here, after the forward was
    // enqueued, so their work overlaps the device's (the mask upload follows the forward on
    // the stream).
    if (batch.await_masks && std::any_of(params.begin(), params.end(), [](const DeviceSampling& d) { return d.mask; }))
      batch.await_masks();
    device_sampler_(logits, params, ids);
    const std::vector<float> got = backend_->download_f32(ids);  // exact: ids < 2^24
    res.sampled_ids.reserve(size_t(num_device));
    for (int64_t r = 0; r < R; ++r)
      if (sample_device[r]) res.sampled_ids.push_back(int32_t(got[r]));
  }
  // The selected rows' logits, one download per contiguous run.
  auto download_rows = [&](const std::vector<char>& want, int64_t num, std::vector<float>& out) {
    out.reserve(size_t(num) * size_t(info_.vocab_size));
    for (int64_t r = 0; r < R;) {
      if (!want[r]) {
        ++r;
        continue;
      }
      int64_t e = r;
      while (e < R && want[e]) ++e;
      const std::vector<float> part = backend_->download_f32(logits.slice_rows(r, e));
      out.insert(out.end(), part.begin(), part.end());
      r = e;
    }
  };
  download_rows(sample_host, num_host, res.logits);
  download_rows(prompt, num_prompt, res.prompt_logits);
}

std::unique_ptr<RankExecutor> make_cpu_executor(const ExecutorOptions& opts) {
  return std::make_unique<RankExecutor>(make_cpu_backend(), opts);
}

}  // namespace moeserve
