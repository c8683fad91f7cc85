#include "runtime/spec_runner.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"
#include "io/safetensors.h"

namespace moeserve {
namespace {

// One sequence of a draft pass: query rows at positions [start_pos, start_pos + n), context
// start_pos + n, and the physical block of each logical block the context touches.
struct PassSeq {
  int start_pos = 0;
  int n = 0;
  std::vector<int32_t> table;
};

enum Slot : int { kPos, kQs, kCtx, kTables, kSlots, kIds, kRows, kGather, kIdx, kNumSlots };

}  // namespace

SpecRunner::SpecRunner(const SpecRunnerOptions& opts, Backend& backend, Model& target)
    : opts_(opts), be_(backend), target_(target), H_(target.desc().hidden_size) {
  const SpecConfig& c = opts_.config;
  const int k = c.num_speculative_tokens;
  i32_bufs_.resize(kNumSlots);
  act_bufs_.resize(8);
  if (c.method == SpecMethod::Eagle3) {
    Eagle3Config ec = Eagle3Config::from_dir(c.model, target.desc());
    eagle_ = std::make_unique<Eagle3Head>(ec, be_, target.embedding_table());
    eagle_->load(Checkpoint::open(c.model));
    target_.set_capture(HiddenCapture{ec.boundaries, false});
    scratch_per_seq_ = (k + opts_.block_size - 1) / opts_.block_size + 1;
    kv_layout_ = eagle_->kv_layout();
  } else if (c.method == SpecMethod::Mtp) {
    const ModelDesc d = target.desc();
    MS_CHECK(d.num_mtp_modules > 0,
             "--speculative-config method \"mtp\": {} ({}) declares no MTP modules (num_mtp_modules / "
             "num_nextn_predict_layers); use an EAGLE-3 draft ({{\"method\": \"eagle3\", ...}}) or \"ngram\"",
             d.architecture, opts_.target_dir);
    MS_CHECK(k <= d.num_mtp_modules,
             "--speculative-config: num_speculative_tokens {} exceeds the checkpoint's {} MTP module(s); vLLM "
             "reuses modules cyclically (k a multiple of the module count), moeserve chains each module once: use "
             "num_speculative_tokens <= {}",
             k, d.num_mtp_modules, d.num_mtp_modules);
    target_.load_mtp(Checkpoint::open(opts_.target_dir), d.num_mtp_modules);
    num_mtp_ = d.num_mtp_modules;
    target_.set_capture(HiddenCapture{{}, true});
    kv_layout_ = target_.mtp_kv_layout();
  } else {
    fail("SpecRunner: method {} has no draft model", spec_method_name(c.method));
  }
}

int64_t SpecRunner::kv_bytes_per_block() const {
  return kv_layout_.bytes_per_block(opts_.block_size, int64_t(dtype_size(be_.activation_dtype())));
}

void SpecRunner::allocate_kv(int num_kv_blocks) {
  opts_.num_kv_blocks = num_kv_blocks;
  const int pool = num_kv_blocks + 1;  // + the executor's dummy block index (never written here)
  // EAGLE-3 chains write past a sequence's blocks into per-sequence scratch blocks after the pool.
  const int blocks = pool + (eagle_ ? std::max(1, opts_.max_num_seqs) * scratch_per_seq_ : 0);
  kv_ = allocate_kv_cache(be_, kv_layout_, blocks, opts_.block_size, be_.activation_dtype());
}

void SpecRunner::note_step(const StepBatch& batch) {
  last_step_.clear();
  int off = 0;
  for (const auto& s : batch.seqs) {
    last_step_[s.seq_id] = StepRows{off, s.start_pos, int(s.tokens.size())};
    off += int(s.tokens.size());
  }
}

const SpecRunner::StepRows& SpecRunner::rows_of(const DraftSeq& s) const {
  auto it = last_step_.find(s.seq_id);
  MS_CHECK(it != last_step_.end(), "draft: sequence {} did not run in the last step", s.seq_id);
  const StepRows& r = it->second;
  MS_CHECK(s.first_row >= r.start_pos && s.end_row <= r.start_pos + r.count && s.first_row <= s.end_row,
           "draft: sequence {} rows [{}, {}) outside its last step [{}, {})", s.seq_id, s.first_row, s.end_row,
           r.start_pos, r.start_pos + r.count);
  MS_CHECK(s.tokens && int(s.tokens->size()) > s.end_row, "draft: sequence {} has {} tokens for rows up to {}",
           s.seq_id, s.tokens ? s.tokens->size() : 0, s.end_row);
  return r;
}

Tensor SpecRunner::upload_i32(const std::vector<int32_t>& v, int slot) {
  Tensor& b = i32_bufs_[size_t(slot)];
  const int64_t n = std::max<int64_t>(int64_t(v.size()), 1);
  if (!b.data || b.numel() < n) b = be_.alloc(DType::I32, {std::max<int64_t>(2 * n, 256)});
  Tensor view = b.slice_rows(0, int64_t(v.size()));
  if (!v.empty()) be_.copy_from_host(view, v.data(), v.size() * sizeof(int32_t));
  return view;
}

std::vector<int32_t> SpecRunner::argmax_rows(const Tensor& logits) {
  const int64_t R = logits.dim(0), W = logits.dim(1);
  const std::vector<float> h = be_.download_f32(logits);
  std::vector<int32_t> out(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) {
    const float* row = h.data() + r * W;
    out[size_t(r)] = int32_t(std::max_element(row, row + W) - row);  // first maximum: lowest id
  }
  return out;
}

namespace {

// The step metadata of a draft pass (device views of the runner's I32 buffers).
template <typename Upload>
AttentionMeta pass_meta(const std::vector<PassSeq>& ps, int bs, Upload&& upload) {
  std::vector<int32_t> pos, qs{0}, ctx, slots, tables;
  int max_blocks = 1, max_q = 0, max_ctx = 0;
  for (const auto& p : ps) {
    const int c = p.start_pos + p.n;
    max_blocks = std::max(max_blocks, (c + bs - 1) / bs);
    max_q = std::max(max_q, p.n);
    max_ctx = std::max(max_ctx, c);
  }
  tables.assign(ps.size() * size_t(max_blocks), 0);
  for (size_t i = 0; i < ps.size(); ++i) {
    const PassSeq& p = ps[i];
    const int c = p.start_pos + p.n;
    MS_CHECK(int(p.table.size()) >= (c + bs - 1) / bs, "draft pass: {} blocks for a context of {}", p.table.size(), c);
    for (int b = 0; b < (c + bs - 1) / bs; ++b) tables[i * size_t(max_blocks) + size_t(b)] = p.table[size_t(b)];
    for (int t = 0; t < p.n; ++t) {
      const int q = p.start_pos + t;
      pos.push_back(q);
      slots.push_back(p.table[size_t(q / bs)] * bs + q % bs);
    }
    qs.push_back(int32_t(pos.size()));
    ctx.push_back(c);
  }
  AttentionMeta m;
  m.num_seqs = int(ps.size());
  m.num_tokens = int(pos.size());
  m.block_size = bs;
  m.max_blocks_per_seq = max_blocks;
  m.max_query_len = max_q;
  m.max_context_len = max_ctx;
  m.positions = upload(pos, kPos);
  m.query_start = upload(qs, kQs);
  m.context_lens = upload(ctx, kCtx);
  m.block_tables = upload(tables, kTables).reshaped({int64_t(ps.size()), int64_t(max_blocks)});
  m.slot_mapping = upload(slots, kSlots);
  return m;
}

}  // namespace

std::vector<std::vector<int32_t>> SpecRunner::propose(const DraftBatch& batch) {
  if (eagle_) return propose_eagle(batch);
  return propose_mtp(batch);
}

std::vector<std::vector<int32_t>> SpecRunner::propose_eagle(const DraftBatch& batch) {
  std::vector<std::vector<int32_t>> out(batch.seqs.size());
  const int bs = opts_.block_size;
  auto up = [this](const std::vector<int32_t>& v, int slot) { return upload_i32(v, slot); };
  // Step 0 over every sequence's verified rows (teacher rows of the draft cache).
  std::vector<PassSeq> ps;
  std::vector<int32_t> ids, gather, logit_rows;
  std::vector<size_t> chain;  // sequences that draft (k > 0), in order
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const DraftSeq& s = batch.seqs[i];
    if (s.end_row <= s.first_row) continue;
    const StepRows& sr = rows_of(s);
    ps.push_back(PassSeq{s.first_row, s.end_row - s.first_row, s.block_table});
    for (int r = s.first_row; r < s.end_row; ++r) {
      ids.push_back((*s.tokens)[size_t(r) + 1]);
      gather.push_back(sr.offset + r - sr.start_pos);
    }
    if (s.k > 0) {
      logit_rows.push_back(int32_t(ids.size()) - 1);
      chain.push_back(i);
    }
  }
  if (ids.empty()) return out;
  const int64_t T0 = int64_t(ids.size());
  const std::vector<Tensor>& cap = target_.captured();
  MS_CHECK(cap.size() == 3, "EAGLE-3: the target captured {} hidden states, expected 3", cap.size());
  const Tensor gidx = up(gather, kGather);
  std::vector<Tensor> taps;
  for (int t = 0; t < 3; ++t) {
    Tensor& buf = act_bufs_[size_t(t)];
    if (!buf.data || buf.dim(0) < T0) buf = be_.alloc(be_.activation_dtype(), {std::max<int64_t>(T0, 64), H_});
    Tensor v = buf.slice_rows(0, T0);
    be_.embedding(cap[size_t(t)], gidx, v);  // the verified rows' taps [T0, Ht]
    taps.push_back(v);
  }
  Tensor g = eagle_->fc(taps);
  const Tensor ids_t = up(ids, kIds), rows_t = up(logit_rows, kRows);
  AttentionMeta meta = pass_meta(ps, bs, up);
  Tensor logits = eagle_->step(Eagle3StepArgs{&ids_t, &g, &meta, &kv_[0], &rows_t});
  if (chain.empty()) return out;
  std::vector<int32_t> d = argmax_rows(logits);
  for (size_t c = 0; c < chain.size(); ++c) out[chain[c]].push_back(eagle_->to_target(d[c]));
  // The chain: prenorm rows of the drafting sequences (in `chain` order) feed step 1. Chains
  // run in groups of at most the scratch capacity (a group's chain rows are dead once its
  // last step ran, so the next group reuses the scratch blocks).
  const int64_t C = int64_t(chain.size());
  auto grown = [&](Tensor& b) -> Tensor& {
    if (!b.data || b.dim(0) < C) b = be_.alloc(be_.activation_dtype(), {std::max<int64_t>(C, 64), H_});
    return b;
  };
  Tensor& g0_buf = grown(act_bufs_[3]);  // step 0's prenorm, row c = chain[c]
  Tensor& gs_buf = grown(act_bufs_[4]);  // this step's g
  Tensor& gc_buf = grown(act_bufs_[5]);  // the previous step's prenorm, row r = prev[r]
  {
    Tensor g0 = g0_buf.slice_rows(0, C);
    be_.embedding(eagle_->prenorm(), rows_t, g0);
  }
  const size_t group = size_t(std::max(1, opts_.max_num_seqs));
  for (size_t lo = 0; lo < chain.size(); lo += group) {
    const size_t hi = std::min(chain.size(), lo + group);
    std::vector<size_t> prev;  // indices into `chain` of the previous step's rows
    for (size_t c = lo; c < hi; ++c) prev.push_back(c);
    for (int j = 1;; ++j) {
      std::vector<int32_t> sel, jids, jrows;
      std::vector<size_t> active;
      std::vector<PassSeq> jps;
      for (size_t r = 0; r < prev.size(); ++r) {
        const size_t c = prev[r];
        const DraftSeq& s = batch.seqs[chain[c]];
        if (s.k <= j) continue;
        const int t = s.end_row - 1, p = t + j;
        PassSeq q{p, 1, {}};
        // Logical blocks past the sequence's own go to its scratch blocks after the pool.
        const int scratch0 = opts_.num_kv_blocks + 1 + int(c - lo) * scratch_per_seq_;
        MS_CHECK(p / bs - int(s.block_table.size()) < scratch_per_seq_, "EAGLE-3 chain past its scratch blocks");
        for (int b = 0; b <= p / bs; ++b)
          q.table.push_back(b < int(s.block_table.size()) ? s.block_table[size_t(b)]
                                                          : scratch0 + (b - int(s.block_table.size())));
        jps.push_back(std::move(q));
        sel.push_back(int32_t(j == 1 ? c : r));
        jids.push_back(out[chain[c]].back());
        jrows.push_back(int32_t(jrows.size()));
        active.push_back(c);
      }
      if (active.empty()) break;
      const int64_t A = int64_t(active.size());
      Tensor gsel = gs_buf.slice_rows(0, A);
      be_.embedding(j == 1 ? g0_buf.slice_rows(0, C) : gc_buf.slice_rows(0, int64_t(prev.size())), up(sel, kIdx), gsel);
      const Tensor jids_t = up(jids, kIds), jrows_t = up(jrows, kRows);
      AttentionMeta jm = pass_meta(jps, bs, up);
      Tensor jl = eagle_->step(Eagle3StepArgs{&jids_t, &gsel, &jm, &kv_[0], &jrows_t});
      const std::vector<int32_t> dj = argmax_rows(jl);
      for (size_t a = 0; a < active.size(); ++a) out[chain[active[a]]].push_back(eagle_->to_target(dj[a]));
      Tensor next = gc_buf.slice_rows(0, A);
      be_.embedding(eagle_->prenorm(), jrows_t, next);
      prev = active;
    }
  }
  return out;
}

std::vector<std::vector<int32_t>> SpecRunner::propose_mtp(const DraftBatch& batch) {
  std::vector<std::vector<int32_t>> out(batch.seqs.size());
  const int bs = opts_.block_size, M = num_mtp_;
  auto up = [this](const std::vector<int32_t>& v, int slot) { return upload_i32(v, slot); };
  struct Rows {
    size_t seq;
    int lo, win;  // pass rows [lo, end_row); the first `win` from the kept h0 window
    int offset;   // first pass row
  };
  std::vector<Rows> rs;
  std::vector<PassSeq> ps;
  std::vector<int32_t> gather;
  int total = 0;
  for (size_t i = 0; i < batch.seqs.size(); ++i) {
    const DraftSeq& s = batch.seqs[i];
    if (s.end_row <= s.first_row) continue;
    const StepRows& sr = rows_of(s);
    MtpState& st = mtp_state_[s.seq_id];
    if (st.next_row != s.first_row) st = MtpState{};  // new, preempted or skipped a step: no window
    const int win = st.next_row == s.first_row ? s.first_row - st.win_lo : 0;
    const int lo = s.first_row - win;
    rs.push_back(Rows{i, lo, win, total});
    ps.push_back(PassSeq{lo, s.end_row - lo, s.block_table});
    for (int r = s.first_row; r < s.end_row; ++r) gather.push_back(sr.offset + r - sr.start_pos);
    total += s.end_row - lo;
  }
  if (rs.empty()) return out;
  const int64_t T = total;
  auto act = [&](int slot) {
    Tensor& b = act_bufs_[size_t(slot)];
    if (!b.data || b.dim(0) < T) b = be_.alloc(be_.activation_dtype(), {std::max<int64_t>(T, 64), H_});
    return b.slice_rows(0, T);
  };
  // h^0 of every pass row: the kept window (host) then the captured final hidden states.
  const std::vector<Tensor>& cap = target_.captured();
  MS_CHECK(cap.size() == 1, "MTP: the target captured {} hidden states, expected 1", cap.size());
  Tensor h0 = act(0);
  const Tensor gidx = up(gather, kGather);
  const bool bf16 = be_.activation_dtype() == DType::BF16;
  int g = 0;
  for (const Rows& r : rs) {
    const DraftSeq& s = batch.seqs[r.seq];
    const MtpState& st = mtp_state_[s.seq_id];
    if (r.win > 0) {
      Tensor w = h0.slice_rows(r.offset, r.offset + r.win);
      if (bf16) {
        std::vector<uint16_t> b(st.h0.size());
        for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(st.h0[i]);
        be_.copy_from_host(w, b.data(), b.size() * sizeof(uint16_t));
      } else {
        be_.copy_from_host(w, st.h0.data(), st.h0.size() * sizeof(float));
      }
    }
    const int n = s.end_row - s.first_row;
    Tensor dst = h0.slice_rows(r.offset + r.win, r.offset + r.win + n);
    be_.embedding(cap[0], gidx.slice_rows(g, g + n), dst);
    g += n;
  }
  AttentionMeta meta = pass_meta(ps, bs, up);
  // Module k (0-based): row s reads X[s + k + 1] (tokens, then this chain's drafts).
  for (int k = 0; k < M; ++k) {
    std::vector<int32_t> ids, rows;
    std::vector<size_t> drafting;
    for (const Rows& r : rs) {
      const DraftSeq& s = batch.seqs[r.seq];
      const std::vector<int32_t>& X = *s.tokens;
      const int N = int(X.size());
      const std::vector<int32_t>& d = out[r.seq];
      for (int row = r.lo; row < s.end_row; ++row) {
        const int idx = row + k + 1;
        // Past the drafts known so far: a placeholder (such rows are recomputed next pass).
        ids.push_back(idx < N ? X[size_t(idx)] : (idx - N < int(d.size()) ? d[size_t(idx - N)] : 0));
      }
      if (std::min(s.k, M) > k) {
        rows.push_back(int32_t(ids.size()) - 1);  // row end_row - 1 predicts draft k + 1
        drafting.push_back(r.seq);
      }
    }
    const Tensor ids_t = up(ids, kIds), rows_t = up(rows, kRows);
    Tensor h_prev = k == 0 ? h0 : act(1 + (k - 1) % 2), h_out = act(1 + k % 2);
    Tensor logits = target_.mtp_forward(MtpStepArgs{k, &ids_t, &h_prev, &meta, &kv_, &h_out, &rows_t});
    if (!rows.empty()) {
      const std::vector<int32_t> d = argmax_rows(logits);
      for (size_t i = 0; i < drafting.size(); ++i) out[drafting[i]].push_back(d[i]);
    }
  }
  // Keep h^0 of each sequence's last M - 1 rows for the next pass.
  for (const Rows& r : rs) {
    const DraftSeq& s = batch.seqs[r.seq];
    MtpState& st = mtp_state_[s.seq_id];
    const int keep_lo = std::max(r.lo, s.end_row - (M - 1));
    st.win_lo = keep_lo;
    st.next_row = s.end_row;
    st.h0.clear();
    if (s.end_row > keep_lo)
      st.h0 = be_.download_f32(h0.slice_rows(r.offset + (keep_lo - r.lo), r.offset + (s.end_row - r.lo)));
  }
  return out;
}

}  // namespace moeserve
