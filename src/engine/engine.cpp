// The engine loop: one thread owns the scheduler, block manager, sequences and the
// executor. submit/abort/stats are called from other threads; they touch only the inbox
// (under mu_) and atomics, so they never wait for a model step.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <future>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/prompt_logprobs.h"
#include "engine/sampler.h"
#include "engine/scheduler.h"
#include "engine/spec_decode.h"
#include "engine/stop.h"
#include "engine/structured_sampling.h"

namespace moeserve {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Abort: return "abort";
    case FinishReason::Error: return "error";
    case FinishReason::None: break;
  }
  return "none";
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Resolves max_model_len: the configured one (if any) capped by the executor's, and by
// what the KV pool can hold, so a lone sequence can always run to its end.
EngineConfig resolve_config(EngineConfig c, const ExecutorInfo& info) {
  MS_CHECK(info.vocab_size > 0, "executor reports vocab_size {}", info.vocab_size);
  MS_CHECK(info.block_size > 0 && info.num_kv_blocks > 0, "executor reports block_size {} and {} KV blocks",
           info.block_size, info.num_kv_blocks);
  int len = info.max_model_len > 0 ? info.max_model_len : c.max_model_len;
  if (c.max_model_len > 0) len = std::min(len, c.max_model_len);
  MS_CHECK(len > 1, "max_model_len must be > 1 (config {}, executor {})", c.max_model_len, info.max_model_len);
  const int64_t kv_len = int64_t(info.num_kv_blocks) * info.block_size;
  if (len > kv_len) {
    spdlog::warn("max_model_len {} exceeds the KV cache ({} blocks x {} = {} tokens); capping it", len,
                 info.num_kv_blocks, info.block_size, kv_len);
    len = static_cast<int>(kv_len);
  }
  c.max_model_len = len;
  MS_CHECK(c.max_num_seqs > 0, "max_num_seqs must be positive, got {}", c.max_num_seqs);
  MS_CHECK(c.max_num_batched_tokens > 0, "max_num_batched_tokens must be positive, got {}", c.max_num_batched_tokens);
  MS_CHECK(c.long_prefill_token_threshold >= 0 && c.max_num_partial_prefills >= 0,
           "long_prefill_token_threshold ({}) and max_num_partial_prefills ({}) must be >= 0",
           c.long_prefill_token_threshold, c.max_num_partial_prefills);
  if (c.max_num_partial_prefills > 1 && c.long_prefill_token_threshold == 0)
    c.long_prefill_token_threshold = std::max(1, static_cast<int>(c.max_model_len * 0.04));
  MS_CHECK(c.max_num_partial_prefills <= 1 || c.long_prefill_token_threshold <= c.max_model_len,
           "long_prefill_token_threshold ({}) cannot be greater than max_model_len ({})",
           c.long_prefill_token_threshold, c.max_model_len);
  const SpecMethod sm = c.speculative.method;
  MS_CHECK(sm == SpecMethod::None || sm == SpecMethod::Ngram ||
               ((sm == SpecMethod::Eagle3 || sm == SpecMethod::Mtp) && info.draft_model),
           "speculative decoding method {} needs {} (ngram, and eagle3 / mtp with an executor that loaded the draft)",
           spec_method_name(sm), sm == SpecMethod::Eagle3 || sm == SpecMethod::Mtp ? "its draft loaded" : "another method");
  MS_CHECK(!info.draft_model || sm == SpecMethod::Eagle3 || sm == SpecMethod::Mtp,
           "the executor loaded a draft but the engine's speculative method is {}", spec_method_name(sm));
  if (c.speculative.enabled()) {
    const bool ngram = sm == SpecMethod::Ngram;
    MS_CHECK(c.speculative.num_speculative_tokens >= 1 && c.speculative.num_speculative_tokens <= kMaxSpecTokens &&
                 (!ngram || (c.speculative.prompt_lookup_min >= 1 &&
                             c.speculative.prompt_lookup_min <= c.speculative.prompt_lookup_max)),
             "speculative config: num_speculative_tokens {} (1..{}), prompt_lookup_min {} <= prompt_lookup_max {}",
             c.speculative.num_speculative_tokens, kMaxSpecTokens, c.speculative.prompt_lookup_min,
             c.speculative.prompt_lookup_max);
    spdlog::info("speculative decoding: {}; {}", describe(c.speculative),
                 c.spec_policy.pinned_k < 0 ? "k chosen per step (adaptive)"
                                            : "k pinned to " + std::to_string(std::min(c.spec_policy.pinned_k,
                                                                                       c.speculative.num_speculative_tokens)));
  }
  if (c.max_num_partial_prefills > 0 || c.long_prefill_token_threshold > 0)
    spdlog::info("prefill caps per step: max_num_partial_prefills {}, long_prefill_token_threshold {}",
                 c.max_num_partial_prefills > 0 ? std::to_string(c.max_num_partial_prefills) : "unlimited",
                 c.long_prefill_token_threshold > 0 ? std::to_string(c.long_prefill_token_threshold) : "none");
  return c;
}

class EngineImpl final : public Engine {
 public:
  EngineImpl(EngineConfig config, std::unique_ptr<ModelExecutor> executor)
      : info_(executor->info()),
        config_(resolve_config(std::move(config), info_)),
        exec_(std::move(executor)),
        blocks_(BlockManagerConfig{.num_blocks = info_.num_kv_blocks,
                                   .block_size = info_.block_size,
                                   .enable_prefix_caching = config_.enable_prefix_caching,
                                   .hash_fn = {}}),
        sched_(SchedulerConfig{.max_num_seqs = config_.max_num_seqs,
                               .max_num_batched_tokens = config_.max_num_batched_tokens,
                               .max_model_len = config_.max_model_len,
                               .long_prefill_token_threshold = config_.long_prefill_token_threshold,
                               .max_num_partial_prefills = config_.max_num_partial_prefills},
               blocks_),
        spec_(config_.speculative, config_.spec_policy, config_.max_model_len) {
    thread_ = std::thread([this] { loop(); });
  }
  ~EngineImpl() override { shutdown(std::chrono::milliseconds(0)); }

  bool submit(Request request) override {
    validate(request);
    auto req = std::make_shared<const Request>(std::move(request));
    {
      std::lock_guard lk(mu_);
      if (!accepting_) return false;
      MS_CHECK(!live_ids_.count(req->id), "request id '{}' is already in use", req->id);
      if (static_cast<int>(inbox_.size()) + waiting_.load() >= config_.max_waiting_requests) return false;
      live_ids_.insert(req->id);
      inbox_.push_back(std::move(req));
    }
    cv_.notify_one();
    return true;
  }

  void abort(const std::string& request_id) override {
    {
      std::lock_guard lk(mu_);
      if (!live_ids_.count(request_id)) return;
      abort_inbox_.push_back(request_id);
    }
    cv_.notify_one();
  }

  EngineStats stats() const override {
    EngineStats s;
    s.num_running = running_.load(std::memory_order_relaxed);
    s.num_waiting = waiting_.load(std::memory_order_relaxed);
    s.kv_cache_usage = kv_usage_.load(std::memory_order_relaxed);
    s.prefix_cache_queries = prefix_queries_.load(std::memory_order_relaxed);
    s.prefix_cache_hits = prefix_hits_.load(std::memory_order_relaxed);
    s.num_preemptions = preemptions_.load(std::memory_order_relaxed);
    for (size_t i = 0; i < s.iteration_tokens.size(); ++i)
      s.iteration_tokens[i] = iteration_tokens_[i].load(std::memory_order_relaxed);
    s.iteration_tokens_sum = iteration_tokens_sum_.load(std::memory_order_relaxed);
    s.num_steps = steps_.load(std::memory_order_relaxed);
    s.step_ns = step_ns_.load(std::memory_order_relaxed);
    s.execute_ns = execute_ns_.load(std::memory_order_relaxed);
    s.loop_gap_ns = loop_gap_ns_.load(std::memory_order_relaxed);
    if (config_.speculative.enabled()) {
      s.spec_k = config_.speculative.num_speculative_tokens;
      s.spec_num_drafts = spec_drafts_.load(std::memory_order_relaxed);
      s.spec_num_draft_tokens = spec_draft_tokens_.load(std::memory_order_relaxed);
      s.spec_num_accepted_tokens = spec_accepted_.load(std::memory_order_relaxed);
      for (int i = 0; i < s.spec_k; ++i) s.spec_accepted_per_pos.push_back(spec_per_pos_[i].load(std::memory_order_relaxed));
      spec_.fill_stats(s);
    }
    return s;
  }

  const EngineConfig& config() const override { return config_; }
  ExecutorInfo executor_info() const override { return info_; }

  void shutdown(std::chrono::milliseconds grace) override {
    {
      std::lock_guard lk(mu_);
      if (!stop_requested_) {
        accepting_ = false;
        stop_requested_ = true;
        deadline_ = std::chrono::steady_clock::now() + grace;
      }
    }
    cv_.notify_one();
    std::lock_guard jl(join_mu_);
    if (thread_.joinable()) thread_.join();
  }

 private:
  void validate(const Request& r) const {
    MS_CHECK(!r.id.empty(), "request id must not be empty");
    MS_CHECK(r.on_output, "request '{}' has no on_output callback", r.id);
    const int n = static_cast<int>(r.prompt_ids.size());
    MS_CHECK(n > 0, "request '{}': the prompt is empty", r.id);
    MS_CHECK(n < config_.max_model_len,
             "request '{}': the prompt has {} tokens; this model's maximum context length is {} (prompt "
             "plus at least one generated token)",
             r.id, n, config_.max_model_len);
    for (int i = 0; i < n; ++i)
      MS_CHECK(r.prompt_ids[i] >= 0 && r.prompt_ids[i] < info_.vocab_size,
               "request '{}': prompt token {} at position {} is outside the vocabulary [0, {})", r.id,
               r.prompt_ids[i], i, info_.vocab_size);
    const SamplingParams& p = r.params;
    MS_CHECK(p.max_tokens >= 1, "request '{}': max_tokens must be at least 1, got {}", r.id, p.max_tokens);
    MS_CHECK(p.min_tokens >= 0, "request '{}': min_tokens must be >= 0, got {}", r.id, p.min_tokens);
    MS_CHECK(p.temperature >= 0, "request '{}': temperature must be >= 0, got {}", r.id, p.temperature);
    MS_CHECK(p.top_p > 0 && p.top_p <= 1, "request '{}': top_p must be in (0, 1], got {}", r.id, p.top_p);
    MS_CHECK(p.top_k >= -1, "request '{}': top_k must be -1, 0 or positive, got {}", r.id, p.top_k);
    MS_CHECK(p.min_p >= 0 && p.min_p <= 1, "request '{}': min_p must be in [0, 1], got {}", r.id, p.min_p);
    MS_CHECK(p.repetition_penalty > 0, "request '{}': repetition_penalty must be > 0, got {}", r.id,
             p.repetition_penalty);
    MS_CHECK(p.logprobs >= -1, "request '{}': logprobs must be >= -1, got {}", r.id, p.logprobs);
  }

  void loop() {
    // End of the previous step while more work was waiting (the gap to the next step start is
    // loop overhead, not idle time); unset after an idle wait.
    std::optional<std::chrono::steady_clock::time_point> busy_since;
    for (;;) {
      std::optional<std::chrono::steady_clock::time_point> step_end;
      std::deque<std::shared_ptr<const Request>> incoming;
      std::vector<std::string> aborts;
      bool stopping;
      std::chrono::steady_clock::time_point deadline;
      {
        std::unique_lock lk(mu_);
        cv_.wait(lk, [&] { return !inbox_.empty() || !abort_inbox_.empty() || stop_requested_ || sched_.has_work(); });
        incoming.swap(inbox_);
        aborts.swap(abort_inbox_);
        // Keep submit()'s queue-limit count exact while the drained requests are in flight.
        waiting_.store(sched_.num_waiting() + static_cast<int>(incoming.size()), std::memory_order_relaxed);
        stopping = stop_requested_;
        deadline = deadline_;
      }
      for (auto& r : incoming) admit(std::move(r));
      for (const auto& id : aborts) abort_now(id, FinishReason::Abort, "");
      if (stopping && std::chrono::steady_clock::now() >= deadline) abort_all(FinishReason::Abort, "");
      if (sched_.has_work()) {
        const auto t0 = std::chrono::steady_clock::now();
        if (busy_since)
          loop_gap_ns_.fetch_add(
              uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(t0 - *busy_since).count()),
              std::memory_order_relaxed);
        try {
          step();
        } catch (const std::exception& e) {  // an engine bug: fail what runs, keep serving
          spdlog::error("engine step failed: {}", e.what());
          abort_all(FinishReason::Error, std::string("internal engine error: ") + e.what());
        }
        const auto t1 = std::chrono::steady_clock::now();
        step_end = t1;
        steps_.fetch_add(1, std::memory_order_relaxed);
        step_ns_.fetch_add(uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()),
                           std::memory_order_relaxed);
      }
      publish_stats();
      busy_since.reset();
      if (step_end && sched_.has_work()) busy_since = step_end;
      if (stopping && !sched_.has_work()) {
        std::lock_guard lk(mu_);
        if (inbox_.empty()) break;
      }
    }
  }

  void admit(std::shared_ptr<const Request> r) {
    auto seq = std::make_unique<Sequence>();
    seq->id = next_seq_id_++;
    seq->request = r;
    seq->tokens = r->prompt_ids;
    seq->num_prompt_tokens = static_cast<int>(r->prompt_ids.size());
    seq->queued_time = std::chrono::steady_clock::now();
    const uint64_t seed = r->params.seed ? *r->params.seed : splitmix64(config_.seed ^ splitmix64(seq->id));
    seq->sampler.rng.seed(seed);
    by_id_[r->id] = sched_.add(std::move(seq));
  }

  RequestOutput make_output(const Sequence& s) const {
    RequestOutput o;
    o.request_id = s.request->id;
    o.num_prompt_tokens = s.num_prompt_tokens;
    o.num_cached_tokens = s.num_cached_tokens;
    o.num_generated_tokens = s.num_output_tokens();
    o.queued_time = s.queued_time;
    o.scheduled_time = s.scheduled_time;
    o.first_token_time = s.first_token_time;
    o.last_token_time = s.last_token_time;
    o.num_preemptions = s.num_preemptions;
    return o;
  }

  void deliver(const Sequence& s, RequestOutput&& o) {
    try {
      s.request->on_output(std::move(o));
    } catch (const std::exception& e) {
      spdlog::error("on_output of request '{}' threw: {}", s.request->id, e.what());
    }
  }

  // Removes a sequence and tells its owner. `o` may carry the last token.
  void finish(Sequence* s, FinishReason reason, RequestOutput o, const std::string& error) {
    o.finished = true;
    o.finish_reason = reason;
    o.error = error;
    if (info_.draft_model) exec_->release_draft(s->id);
    std::unique_ptr<Sequence> owned = sched_.remove(s, reason);
    by_id_.erase(owned->request->id);
    {
      std::lock_guard lk(mu_);
      live_ids_.erase(owned->request->id);
    }
    deliver(*owned, std::move(o));
  }

  void abort_now(const std::string& id, FinishReason reason, const std::string& error) {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return;  // already finished
    finish(it->second, reason, make_output(*it->second), error);
  }

  void abort_all(FinishReason reason, const std::string& error) {
    std::vector<std::string> ids;
    for (auto& [id, s] : by_id_) ids.push_back(id);
    for (const auto& id : ids) abort_now(id, reason, error);
  }

  void step() {
    SchedulerOutput out = sched_.schedule();
    if (out.empty()) {
      // Cannot happen with validated requests (a lone sequence always fits); fail the head
      // instead of spinning.
      if (!sched_.waiting().empty() && sched_.running().empty()) {
        Sequence* head = sched_.waiting().front();
        finish(head, FinishReason::Error, make_output(*head), "request cannot be scheduled: not enough KV blocks");
      }
      return;
    }
    spec_.begin_step(out);
    const auto t_sched = std::chrono::steady_clock::now();
    for (const auto& sc : out.scheduled)
      if (sc.seq->scheduled_time == std::chrono::steady_clock::time_point{}) sc.seq->scheduled_time = t_sched;
    count_iteration_tokens(out.num_batched_tokens);
    // Rows that sample this step, in batch order. Device rows (when the executor samples on
    // its side) get their parameters and this step's seed, drawn from the sequence's RNG so a
    // seeded request reproduces whatever batch it is in; the rest come back as logits.
    std::vector<Sequence*> rows;
    std::vector<const ScheduledSeq*> row_sched;  // parallel to rows
    std::vector<char> on_device;
    std::vector<int64_t> host_rows;  // indices into rows
    const bool use_device = config_.device_sampling && info_.device_sampling;
    size_t num_prompt_rows = 0;
    for (size_t i = 0; i < out.scheduled.size(); ++i) {
      const ScheduledSeq& sc = out.scheduled[i];
      if (wants_prompt_logits(*sc.seq, out.batch.seqs[i])) {
        out.batch.seqs[i].need_prompt_logits = true;
        num_prompt_rows += out.batch.seqs[i].tokens.size();
      }
      if (!sc.sample) continue;
      std::optional<DeviceSampling> d;
      // A verify row (drafts) is sampled position by position on the host (spec_decode.h), and
      // so is a seeded sampled row while k adapts (spec_policy.h).
      if (use_device && sc.num_spec == 0 && !spec_keeps_row_on_host(config_.speculative, config_.spec_policy, *sc.seq))
        d = device_sampling_params(*sc.seq);
      if (d) {
        d->seed = sc.seq->sampler.rng();
        // Structured outputs: the row's grammar mask, filled by the mask job below.
        const std::span<const uint32_t> m = structured_device_mask(*sc.seq);
        d->mask = m.empty() ? nullptr : m.data();
        d->mask_words = m.size();
      } else {
        host_rows.push_back(int64_t(rows.size()));
      }
      out.batch.seqs[i].device_sample = d;
      on_device.push_back(d.has_value());
      rows.push_back(sc.seq);
      row_sched.push_back(&sc);
    }
    const size_t num_device = rows.size() - host_rows.size();
    // Host row h's first logits row (a verify row has 1 + num_spec of them).
    std::vector<size_t> host_offset(host_rows.size() + 1, 0);
    for (size_t h = 0; h < host_rows.size(); ++h)
      host_offset[h + 1] = host_offset[h] + 1 + size_t(row_sched[host_rows[h]]->num_spec);
    // Grammar masks for this step's constrained rows, made while the model runs (they depend
    // only on the tokens already accepted). Device rows' masks are awaited by the executor
    // before it samples (StepBatch::await_masks), host rows' before sampling here; joined
    // before anything reads the rows.
    std::future<void> masks_ahead;
    {
      std::vector<Sequence*> constrained;
      bool device_masks = false;
      for (size_t r = 0; r < rows.size(); ++r) {
        if (!has_structured_constraint(*rows[r])) continue;
        const bool dev = on_device[r] != 0;
        if (dev && !out.batch.seqs[size_t(row_sched[r] - out.scheduled.data())].device_sample->mask) continue;
        if (!config_.overlap_structured_masks) {
          if (dev) prepare_structured_mask(*rows[r]);  // host rows compute theirs when sampled
          continue;
        }
        device_masks |= dev;
        constrained.push_back(rows[r]);
      }
      if (!constrained.empty())
        masks_ahead = std::async(std::launch::async, [constrained = std::move(constrained)] {
          for (Sequence* s : constrained) prepare_structured_mask(*s);
        });
      if (device_masks) out.batch.await_masks = [&masks_ahead] { masks_ahead.wait(); };
    }
    StepResult res;
    try {
      const auto t_exec = std::chrono::steady_clock::now();
      res = exec_->execute(out.batch);
      execute_ns_.fetch_add(
          uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t_exec)
                       .count()),
          std::memory_order_relaxed);
      if (masks_ahead.valid()) masks_ahead.wait();
      MS_CHECK(res.vocab_size == info_.vocab_size && res.logits.size() == host_offset.back() * size_t(res.vocab_size),
               "executor returned {} logits of vocab {} for {} host logits rows (expected vocab {})", res.logits.size(),
               res.vocab_size, host_offset.back(), info_.vocab_size);
      MS_CHECK(res.sampled_ids.size() == num_device, "executor returned {} sampled ids for {} device rows",
               res.sampled_ids.size(), num_device);
      MS_CHECK(res.prompt_logits.size() == num_prompt_rows * size_t(res.vocab_size),
               "executor returned {} prompt logits for {} prompt rows", res.prompt_logits.size(), num_prompt_rows);
      // kDeviceNoCandidate / kDeviceInfLogit: the device found no finite maximum in the row;
      // that row's request fails below, the others go on.
      for (int32_t t : res.sampled_ids)
        MS_CHECK(t == kDeviceNoCandidate || t == kDeviceInfLogit || (t >= 0 && t < info_.vocab_size),
                 "executor sampled token {} outside [0, {})", t, info_.vocab_size);
    } catch (const std::exception& e) {
      if (masks_ahead.valid()) masks_ahead.wait();
      spdlog::error("model step failed: {}", e.what());
      for (const auto& sc : out.scheduled) finish(sc.seq, FinishReason::Error, make_output(*sc.seq), e.what());
      return;
    }
    sched_.on_step_executed(out);
    collect_prompt_logprobs(out, res);
    // Sampling reads only its own row and its own sequence's state (RNG, counts), so rows are
    // independent: with many rows (or a large vocabulary) they run on the thread pool, and a
    // sequence's token does not depend on the batch it is in.
    const size_t V = static_cast<size_t>(res.vocab_size);
    const int64_t n = static_cast<int64_t>(rows.size());
    const int64_t nh = static_cast<int64_t>(host_rows.size());
    // Each row: verify_and_sample appends the emitted tokens (one for a plain row; for a verify
    // row the accepted drafts and the target's token) and checks the stops after each.
    std::vector<VerifyOutcome> results(rows.size());
    for (int64_t r = 0, d = 0; r < n; ++r) {
      if (!on_device[r]) continue;
      const int32_t t = res.sampled_ids[d++];
      if (t == kDeviceNoCandidate || t == kDeviceInfLogit) {
        results[r].error = no_candidate_message(t == kDeviceInfLogit ? std::numeric_limits<float>::infinity()
                                                                      : -std::numeric_limits<float>::infinity());
        if (t == kDeviceNoCandidate && has_structured_constraint(*rows[r])) {
          // An empty grammar mask: the host path's reason (apply_structured_mask throws it).
          try {
            const std::vector<float> zeros(size_t(info_.vocab_size), 0.f);
            (void)apply_structured_mask(*rows[r], zeros);
          } catch (const std::exception& e) {
            results[r].error = e.what();
          }
        }
        continue;
      }
      Sequence& s = *rows[r];
      s.tokens.push_back(t);
      note_generated(s, t);
      SampleResult sr;
      sr.token = t;
      results[r].emitted.push_back(std::move(sr));
      results[r].stop = check_stop(s, config_.eos_token_ids, config_.max_model_len);
    }
    auto sample_rows = [&](int64_t begin, int64_t end) {
      for (int64_t h = begin; h < end; ++h) {
        const int64_t r = host_rows[h];
        Sequence& s = *rows[r];
        const int k = row_sched[r]->num_spec;
        try {
          VerifyInput in{.logits = std::span<const float>(res.logits.data() + V * host_offset[h], V * size_t(1 + k)),
                         .drafts = std::span<const int32_t>(s.spec_tokens.data(), size_t(k)),
                         .eos_token_ids = &config_.eos_token_ids,
                         .max_model_len = config_.max_model_len};
          results[r] = verify_and_sample(s, in);
        } catch (const std::exception& e) {
          // The sampler is total (SamplingError for a row it cannot sample); anything else is
          // still only this request's failure, never the engine thread's.
          results[r] = VerifyOutcome{};
          results[r].error = e.what();
        }
      }
    };
    if (nh >= 2 && host_offset.back() * V >= (size_t(1) << 17)) {
      ThreadPool::global().parallel_for(nh, sample_rows, 1);
    } else {
      sample_rows(0, nh);
    }
    exec_->recycle(std::move(res));
    const auto t_token = std::chrono::steady_clock::now();
    DraftBatch drafts;                 // model drafts (info_.draft_model): proposed after the loop
    std::vector<Sequence*> going_on;   // sequences that continue (parallel to drafts.seqs)
    for (int64_t r = 0; r < n; ++r) {
      Sequence* s = rows[r];
      VerifyOutcome& vo = results[r];
      const ScheduledSeq& sc = *row_sched[r];
      if (sc.num_spec > 0) count_spec(sc.num_spec, vo.num_accepted);
      spec_.observe_row(sc, vo);
      s->spec_tokens.clear();
      if (!vo.error.empty()) {
        spdlog::warn("request {}: {}", s->request->id, vo.error);
        finish(s, FinishReason::Error, make_output(*s), vo.error);
        continue;
      }
      if (s->first_token_time == std::chrono::steady_clock::time_point{}) s->first_token_time = t_token;
      s->last_token_time = t_token;
      RequestOutput o = make_output(*s);
      for (SampleResult& sr : vo.emitted) {
        o.new_token_ids.push_back(sr.token);
        if (sr.has_logprobs) o.logprobs.push_back(std::move(sr.logprob));
      }
      if (s->params().prompt_logprobs && !s->prompt_logprobs_delivered) {
        o.prompt_logprobs = std::move(s->prompt_logprobs);
        s->prompt_logprobs_delivered = true;
      }
      if (vo.stop.reason != FinishReason::None) {
        o.stop_token_id = vo.stop.stop_token_id;
        finish(s, vo.stop.reason, std::move(o), "");
        continue;
      }
      // Rejected drafts: K/V is valid up to the last emitted token's position (exclusive).
      if (sc.num_spec > 0) sched_.rollback_rejected(s, s->num_tokens() - 1);
      // The step's rows up to the last emitted token's position are verified; k set below.
      if (info_.draft_model)
        drafts.seqs.push_back(DraftSeq{s->id, &s->tokens, sc.start_pos, s->num_tokens() - 1, 0, s->blocks.table});
      going_on.push_back(s);
      deliver(*s, std::move(o));
    }
    // The next step's k (spec_policy.h), capped per sequence by draft_budget; n-gram drafts are
    // proposed there, model drafts by the executor's draft.
    const std::vector<int> ks = spec_.choose_and_propose_ngram(going_on);
    if (info_.draft_model) {
      for (size_t i = 0; i < ks.size(); ++i) drafts.seqs[i].k = ks[i];
      run_draft(out, std::move(drafts), going_on);
    }
    spec_.end_draft();
  }

  // The executor's draft (EAGLE-3 / MTP): its cache follows every row this step verified
  // (non-final prefill chunks too, without drafts), then the drafting rows get their drafts.
  void run_draft(const SchedulerOutput& out, DraftBatch drafts, std::vector<Sequence*>& drafting) {
    for (Sequence* p : out.preempted) exec_->release_draft(p->id);
    for (const ScheduledSeq& sc : out.scheduled) {
      if (sc.sample || sc.seq->status != SeqStatus::Running) continue;
      drafts.seqs.push_back(
          DraftSeq{sc.seq->id, &sc.seq->tokens, sc.start_pos, sc.start_pos + sc.num_tokens, 0, sc.seq->blocks.table});
      drafting.push_back(nullptr);
    }
    if (drafts.seqs.empty()) return;
    std::vector<std::vector<int32_t>> d = exec_->propose(drafts);
    MS_CHECK(d.size() == drafts.seqs.size(), "executor proposed drafts for {} of {} sequences", d.size(),
             drafts.seqs.size());
    for (size_t i = 0; i < d.size(); ++i) {
      if (!drafting[i]) continue;
      MS_CHECK(int(d[i].size()) <= drafts.seqs[i].k, "executor proposed {} drafts, asked for {}", d[i].size(),
               drafts.seqs[i].k);
      for (int32_t t : d[i])
        MS_CHECK(t >= 0 && t < info_.vocab_size, "executor drafted token {} outside [0, {})", t, info_.vocab_size);
      drafting[i]->spec_tokens = std::move(d[i]);
    }
  }

  // This step's chunk of a prompt_logprobs request covers prompt positions whose logits give
  // a prompt token's logprob (positions 0 .. num_prompt - 2), not yet delivered.
  static bool wants_prompt_logits(const Sequence& s, const SequenceStep& st) {
    return s.params().prompt_logprobs && !s.prompt_logprobs_delivered && st.start_pos < s.num_prompt_tokens - 1;
  }

  // Fills each prompt_logprobs sequence's entries for this step's positions from the
  // executor's prompt logits (rows in batch order, then token order).
  void collect_prompt_logprobs(const SchedulerOutput& out, const StepResult& res) {
    const size_t V = size_t(res.vocab_size);
    size_t row = 0;
    for (size_t i = 0; i < out.scheduled.size(); ++i) {
      const SequenceStep& st = out.batch.seqs[i];
      if (!st.need_prompt_logits) continue;
      Sequence& s = *out.scheduled[i].seq;
      const int k = *s.params().prompt_logprobs;
      if (s.prompt_logprobs.size() != size_t(s.num_prompt_tokens - 1)) s.prompt_logprobs.resize(s.num_prompt_tokens - 1);
      const int64_t n = int64_t(st.tokens.size());
      auto fill = [&](int64_t begin, int64_t end) {
        for (int64_t t = begin; t < end; ++t) {
          const int pos = st.start_pos + int(t);
          if (pos + 1 >= s.num_prompt_tokens) continue;
          std::span<const float> logits(res.prompt_logits.data() + (row + size_t(t)) * V, V);
          s.prompt_logprobs[size_t(pos)] = prompt_token_logprob(logits, s.tokens[size_t(pos) + 1], k);
        }
      };
      if (n >= 2 && size_t(n) * V >= (size_t(1) << 17)) ThreadPool::global().parallel_for(n, fill, 1);
      else fill(0, n);
      row += size_t(n);
    }
  }

  void count_iteration_tokens(int tokens) {
    const auto& b = EngineStats::kIterationTokenBuckets;
    size_t i = 0;
    while (i < b.size() && tokens > b[i]) ++i;
    iteration_tokens_[i].fetch_add(1, std::memory_order_relaxed);
    iteration_tokens_sum_.fetch_add(uint64_t(tokens), std::memory_order_relaxed);
  }

  // One verify row: `drafts` drafts of which the leading `accepted` were accepted.
  void count_spec(int drafts, int accepted) {
    spec_drafts_.fetch_add(1, std::memory_order_relaxed);
    spec_draft_tokens_.fetch_add(uint64_t(drafts), std::memory_order_relaxed);
    spec_accepted_.fetch_add(uint64_t(accepted), std::memory_order_relaxed);
    for (int i = 0; i < accepted && i < kMaxSpecTokens; ++i) spec_per_pos_[i].fetch_add(1, std::memory_order_relaxed);
  }

  void publish_stats() {
    running_.store(sched_.num_running(), std::memory_order_relaxed);
    waiting_.store(sched_.num_waiting(), std::memory_order_relaxed);
    kv_usage_.store(blocks_.usage(), std::memory_order_relaxed);
    prefix_queries_.store(sched_.prefix_cache_queries(), std::memory_order_relaxed);
    prefix_hits_.store(sched_.prefix_cache_hits(), std::memory_order_relaxed);
    preemptions_.store(sched_.num_preemptions(), std::memory_order_relaxed);
  }

  const ExecutorInfo info_;
  const EngineConfig config_;
  std::unique_ptr<ModelExecutor> exec_;
  // Engine-thread state.
  BlockManager blocks_;
  Scheduler sched_;
  std::unordered_map<std::string, Sequence*> by_id_;
  int64_t next_seq_id_ = 1;
  // Shared with callers, under mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<const Request>> inbox_;
  std::vector<std::string> abort_inbox_;
  std::unordered_set<std::string> live_ids_;  // submitted and not yet finished
  bool accepting_ = true;
  bool stop_requested_ = false;
  std::chrono::steady_clock::time_point deadline_;
  // Published by the engine thread after every iteration.
  std::atomic<int> running_{0}, waiting_{0};
  std::atomic<double> kv_usage_{0};
  std::atomic<uint64_t> prefix_queries_{0}, prefix_hits_{0}, preemptions_{0};
  std::array<std::atomic<uint64_t>, EngineStats::kIterationTokenBuckets.size() + 1> iteration_tokens_{};
  std::atomic<uint64_t> iteration_tokens_sum_{0};
  std::atomic<uint64_t> steps_{0}, step_ns_{0}, execute_ns_{0}, loop_gap_ns_{0};
  std::atomic<uint64_t> spec_drafts_{0}, spec_draft_tokens_{0}, spec_accepted_{0};
  std::array<std::atomic<uint64_t>, kMaxSpecTokens> spec_per_pos_{};
  SpecController spec_;  // the per-step k; engine thread, except its counters
  std::mutex join_mu_;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<Engine> make_engine(EngineConfig config, std::unique_ptr<ModelExecutor> executor) {
  MS_CHECK(executor != nullptr, "make_engine: no executor");
  return std::make_unique<EngineImpl>(std::move(config), std::move(executor));
}

}  // namespace moeserve
