#include "engine/scheduler.h"

#include <algorithm>

#include "core/error.h"

namespace moeserve {

Scheduler::Scheduler(SchedulerConfig config, BlockManager& blocks) : config_(config), blocks_(blocks) {
  MS_CHECK(config_.max_num_seqs > 0, "Scheduler: max_num_seqs must be positive");
  MS_CHECK(config_.max_num_batched_tokens > 0, "Scheduler: max_num_batched_tokens must be positive");
  MS_CHECK(config_.max_model_len > 0, "Scheduler: max_model_len must be positive");
  MS_CHECK(config_.long_prefill_token_threshold >= 0, "Scheduler: long_prefill_token_threshold must be >= 0");
  MS_CHECK(config_.max_num_partial_prefills >= 0, "Scheduler: max_num_partial_prefills must be >= 0");
}

namespace {
// One uncomputed token: the sequence decodes (its last sampled token is the query).
bool in_decode(const Sequence& s) { return s.num_uncomputed() == 1; }
}  // namespace

Sequence* Scheduler::add(std::unique_ptr<Sequence> seq) {
  MS_CHECK(seq && !seq->tokens.empty(), "Scheduler::add: empty sequence");
  MS_CHECK(!seqs_.count(seq->id), "Scheduler::add: duplicate sequence id {}", seq->id);
  Sequence* s = seq.get();
  s->status = SeqStatus::Waiting;
  seqs_.emplace(s->id, std::move(seq));
  waiting_.push_back(s);
  return s;
}

Sequence* Scheduler::find(int64_t seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? nullptr : it->second.get();
}

SchedulerOutput Scheduler::schedule() {
  SchedulerOutput out;
  KvPlan plan(blocks_);
  int budget = config_.max_num_batched_tokens;
  const int threshold = config_.long_prefill_token_threshold;
  const int max_prefills = config_.max_num_partial_prefills;
  // Tokens one sequence may take now: its uncomputed rest, capped by what is `available`,
  // the threshold and max_model_len.
  auto chunk = [&](const Sequence& s, int available) {
    int n = std::min({s.num_uncomputed(), available, config_.max_model_len - s.num_computed_tokens});
    if (threshold > 0) n = std::min(n, threshold);
    return n;
  };
  auto prefill_slot_free = [&] { return max_prefills == 0 || out.num_prefills < max_prefills; };

  // 1. Running sequences, in admission order. Victims come off the back. `reserved`: one
  // token for each decode not visited yet, which no prefill chunk may take.
  size_t end = running_.size();
  int reserved = 0;
  for (size_t i = 0; i < end; ++i)
    if (in_decode(*running_[i]) && running_[i]->num_computed_tokens < config_.max_model_len) ++reserved;
  for (size_t i = 0; i < end && budget > 0; ++i) {
    Sequence* s = running_[i];
    const bool decode = in_decode(*s);
    if (decode && s->num_computed_tokens < config_.max_model_len) --reserved;
    if (!decode && !prefill_slot_free()) continue;  // waits a step; it keeps its blocks
    int n = chunk(*s, decode ? budget : budget - reserved);
    if (n <= 0) continue;
    // Drafts: what is left after this token and the other decodes' reserved ones, inside the
    // model length and the per-sequence cap.
    int num_spec = 0;
    if (decode && !s->spec_tokens.empty()) {
      num_spec = std::min({int(s->spec_tokens.size()), budget - reserved - 1,
                           config_.max_model_len - s->num_computed_tokens - 1});
      if (threshold > 0) num_spec = std::min(num_spec, threshold - 1);
      num_spec = std::max(num_spec, 0);
      if (num_spec > 0 && !plan.grow(s->blocks, s->num_computed_tokens + n + num_spec)) num_spec = 0;
    }
    bool self_preempted = false;
    while (num_spec == 0 && !plan.grow(s->blocks, s->num_computed_tokens + n)) {
      Sequence* victim = running_[--end];
      plan.free(victim->blocks);
      out.preempted.push_back(victim);
      if (victim == s) {
        self_preempted = true;
        break;
      }
      if (in_decode(*victim) && victim->num_computed_tokens < config_.max_model_len) --reserved;
    }
    if (self_preempted) break;
    out.scheduled.push_back(
        {s, s->num_computed_tokens, n + num_spec, s->num_computed_tokens + n == s->num_tokens(), num_spec});
    if (!decode) ++out.num_prefills;
    budget -= n + num_spec;
  }

  // 2. Waiting sequences, FCFS (never skipping the head), unless this step preempted.
  struct Admit {
    Sequence* seq;
    PrefixHit hit;
    int n;
  };
  std::vector<Admit> admits;
  if (out.preempted.empty()) {
    for (Sequence* w : waiting_) {
      if (budget <= 0 || static_cast<int>(end + admits.size()) >= config_.max_num_seqs) break;
      // At least the last token is recomputed: its logits are needed.
      // A prompt_logprobs request reads no cached prefix (vLLM): every prompt position's
      // logits must be computed. Its blocks are still cached for others.
      PrefixHit hit = w->params().prompt_logprobs
                          ? PrefixHit{}
                          : blocks_.lookup(w->tokens, (w->num_tokens() - 1) / blocks_.block_size(),
                                           w->request->prefix_cache_root);
      const int uncomputed = w->num_tokens() - hit.num_tokens;
      if (uncomputed > 1 && !prefill_slot_free()) break;  // FCFS: the head is never skipped
      int n = std::min(uncomputed, budget);
      if (threshold > 0) n = std::min(n, threshold);
      if (!plan.grow(w->blocks, hit.num_tokens + n, &hit)) break;
      budget -= n;
      if (uncomputed > 1) ++out.num_prefills;
      admits.push_back({w, std::move(hit), n});
    }
  }

  // 3. Commit: KV first (all or nothing), then queue moves and counters.
  blocks_.apply(plan);
  for (Sequence* v : out.preempted) {
    v->num_computed_tokens = 0;
    v->spec_tokens.clear();
    v->spec_asked = 0;
    v->status = SeqStatus::Waiting;
    ++v->num_preemptions;
    ++num_preemptions_;
    waiting_.push_front(v);  // victims were taken newest first, so the oldest ends up in front
  }
  running_.resize(end);
  for (Admit& a : admits) {
    Sequence* w = a.seq;
    MS_CHECK(!waiting_.empty() && waiting_.front() == w, "Scheduler: admission out of FCFS order");
    waiting_.pop_front();
    w->num_computed_tokens = a.hit.num_tokens;
    if (!w->admitted_once) w->num_cached_tokens = a.hit.num_tokens;
    w->admitted_once = true;
    prefix_queries_ += static_cast<uint64_t>(w->num_tokens());
    prefix_hits_ += static_cast<uint64_t>(a.hit.num_tokens);
    w->status = SeqStatus::Running;
    running_.push_back(w);
    out.scheduled.push_back({w, w->num_computed_tokens, a.n, w->num_computed_tokens + a.n == w->num_tokens()});
  }

  // 4. The executor's view.
  out.batch.seqs.reserve(out.scheduled.size());
  for (const ScheduledSeq& sc : out.scheduled) {
    SequenceStep st;
    st.seq_id = sc.seq->id;
    const int known = sc.num_tokens - sc.num_spec;
    st.tokens.assign(sc.seq->tokens.begin() + sc.start_pos, sc.seq->tokens.begin() + sc.start_pos + known);
    st.tokens.insert(st.tokens.end(), sc.seq->spec_tokens.begin(), sc.seq->spec_tokens.begin() + sc.num_spec);
    st.num_logits = 1 + sc.num_spec;
    st.start_pos = sc.start_pos;
    st.block_table = sc.seq->blocks.table;
    st.need_logits = sc.sample;
    out.batch.seqs.push_back(std::move(st));
    out.num_batched_tokens += sc.num_tokens;
  }
  return out;
}

void Scheduler::on_step_executed(const SchedulerOutput& out) {
  for (const ScheduledSeq& sc : out.scheduled) {
    Sequence* s = sc.seq;
    MS_CHECK(s->status == SeqStatus::Running && s->num_computed_tokens == sc.start_pos,
             "Scheduler: sequence {} changed between schedule() and on_step_executed()", s->id);
    s->num_computed_tokens += sc.num_tokens;
    blocks_.cache_full_blocks(s->blocks, s->tokens, s->num_computed_tokens, s->request->prefix_cache_root);
  }
}

void Scheduler::rollback_rejected(Sequence* s, int num_valid) {
  MS_CHECK(s->status == SeqStatus::Running && num_valid >= 0 && num_valid <= s->num_computed_tokens &&
               num_valid <= s->num_tokens(),
           "Scheduler::rollback_rejected: sequence {} has {} computed of {} tokens, asked to keep {}", s->id,
           s->num_computed_tokens, s->num_tokens(), num_valid);
  s->num_computed_tokens = num_valid;
  // The kept tail block held this sequence's own writes, so it is never shared: all of
  // [0, num_valid) stays valid.
  const int valid = blocks_.truncate(s->blocks, num_valid);
  MS_CHECK(valid == num_valid, "Scheduler::rollback_rejected: sequence {} kept {} of {} positions", s->id, valid,
           num_valid);
}

std::unique_ptr<Sequence> Scheduler::remove(Sequence* seq, FinishReason reason) {
  auto it = seqs_.find(seq->id);
  MS_CHECK(it != seqs_.end() && it->second.get() == seq, "Scheduler::remove: unknown sequence {}", seq->id);
  if (seq->status == SeqStatus::Running) {
    running_.erase(std::find(running_.begin(), running_.end(), seq));
  } else if (seq->status == SeqStatus::Waiting) {
    waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  }
  blocks_.free(seq->blocks);
  seq->status = SeqStatus::Finished;
  seq->finish_reason = reason;
  std::unique_ptr<Sequence> owned = std::move(it->second);
  seqs_.erase(it);
  return owned;
}

}  // namespace moeserve
