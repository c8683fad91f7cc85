#include "runtime/parallel_executor.h"

#include <algorithm>
#include <filesystem>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "dist/in_process.h"

namespace moeserve {

void check_parallel_layout(const ArchConfig& cfg, const ParallelLayout& l) {
  const ModelDesc d = cfg.desc();
  MS_CHECK(l.data_parallel == 1,
           "--data-parallel-size {}: attention data parallelism is not implemented (only 1); use "
           "--tensor-parallel-size N with --enable-expert-parallel instead",
           l.data_parallel);
  MS_CHECK(l.tensor_parallel >= 1, "--tensor-parallel-size must be >= 1, got {}", l.tensor_parallel);
  MS_CHECK(l.available_devices <= 0 || l.tensor_parallel <= l.available_devices,
           "--tensor-parallel-size {} needs {} GPUs but only {} are visible", l.tensor_parallel, l.tensor_parallel,
           l.available_devices);
  if (l.expert_parallel)
    MS_CHECK(d.num_experts % l.tensor_parallel == 0,
             "--enable-expert-parallel: {} experts do not divide over {} ranks (experts % ranks must be 0)",
             d.num_experts, l.tensor_parallel);
  const ParallelConfig par{0, l.tensor_parallel, l.expert_parallel};
  if (const std::string p = cfg.shard_problem(par); !p.empty())
    fail("--tensor-parallel-size {}{}: {}", l.tensor_parallel, l.expert_parallel ? " --enable-expert-parallel" : "",
         p);
  if (!l.allow_fp8_block_split) {
    const std::string p = cfg.fp8_split_problem(par);
    MS_CHECK(p.empty(), "--tensor-parallel-size {}: {}", l.tensor_parallel, p);
  }
}

struct ParallelExecutor::Rank {
  int index = 0;
  std::thread thread;
  std::unique_ptr<Backend> backend;  // until the executor takes it
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<RankExecutor> exec;
  StepResult result;
  std::exception_ptr error;
};

ParallelExecutor::ParallelExecutor(ParallelExecutorOptions opts) : opts_(std::move(opts)) {
  const ParallelLayout& l = opts_.layout;
  world_ = l.tensor_parallel;
  MS_CHECK(opts_.make_backend && (world_ == 1 || opts_.make_comm), "ParallelExecutor needs backend and comm factories");
  const LoadedConfig cfg = load_model_config(opts_.exec.model_dir, opts_.exec.hf_overrides);
  check_parallel_layout(*cfg.config, l);
  kv_local_.assign(size_t(world_), 0);
  for (int r = 0; r < world_; ++r) {
    ranks_.push_back(std::make_unique<Rank>());
    ranks_.back()->index = r;
  }
  for (int r = 0; r < world_; ++r) ranks_[size_t(r)]->thread = std::thread([this, r] { rank_main(r); });

  // Three phases, each on every rank: backends, then communicators (NCCL init is collective
  // and blocks until every rank joins, so it only starts once every backend exists), then
  // the weights and KV cache (no collectives while loading; the KV-pool agreement below
  // gives up when another rank failed).
  auto make_backends = [this](Rank& k) { k.backend = opts_.make_backend(k.index); };
  auto make_comms = [this](Rank& k) {
    if (world_ == 1) return;
    auto comm = opts_.make_comm(k.index, *k.backend);
    std::lock_guard<std::mutex> lk(mu_);
    k.comm = std::move(comm);
  };
  auto load = [this](Rank& k) {
    const int r = k.index;
    Backend* be = k.backend.get();
    ExecutorOptions eo = opts_.exec;
    eo.expert_parallel = opts_.layout.expert_parallel;
    eo.comm = k.comm.get();
    eo.logits = r == 0;  // only rank 0's logits are returned
    // Rank 0 samples on its GPU after its forward (its graph replay); the other ranks have no
    // logits to sample.
    eo.device_sampler = nullptr;
    if (r == 0 && opts_.make_device_sampler) eo.device_sampler = opts_.make_device_sampler(*be);
    if (opts_.kv_blocks_for_memory && eo.num_kv_blocks <= 0) {
      eo.kv_blocks_for_memory = [this, r, be](int64_t per_block) {
        const int local = opts_.kv_blocks_for_memory(*be, per_block);
        std::unique_lock<std::mutex> lk(mu_);
        kv_local_[size_t(r)] = local;
        ++kv_arrived_;
        cv_.notify_all();
        cv_.wait(lk, [&] { return kv_arrived_ == world_ || broken_; });
        MS_CHECK(!broken_, "another rank failed while sizing the KV cache");
        return *std::min_element(kv_local_.begin(), kv_local_.end());
      };
    }
    k.exec = std::make_unique<RankExecutor>(std::move(k.backend), eo);
  };
  for (const auto& phase : {std::function<void(Rank&)>(make_backends), std::function<void(Rank&)>(make_comms),
                            std::function<void(Rank&)>(load)})
    if (std::exception_ptr e = run_on_ranks(phase)) {
      shutdown();  // the destructor does not run for a throwing constructor
      std::rethrow_exception(e);
    }
  info_ = ranks_[0]->exec->info();
}

ParallelExecutor::~ParallelExecutor() { shutdown(); }

// Read between steps (the rank threads are idle then; run_on_ranks' mutex orders the reads).
int ParallelExecutor::graphs_captured(int r) const { return ranks_.at(size_t(r))->exec->graphs_captured(); }
int ParallelExecutor::graph_replays(int r) const { return ranks_.at(size_t(r))->exec->graph_replays(); }

void ParallelExecutor::shutdown() {
  if (ranks_.empty()) return;
  // Executors (and their backends) go on their own threads, before the communicators
  // they use.
  run_on_ranks([](Rank& k) {
    k.exec.reset();
    k.comm.reset();
    k.backend.reset();
  });
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& k : ranks_)
    if (k->thread.joinable()) k->thread.join();
  ranks_.clear();
}

void ParallelExecutor::rank_main(int r) {
  Rank& me = *ranks_[size_t(r)];
  uint64_t seen = 0;
  for (;;) {
    std::function<void(Rank&)> job;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || job_gen_ != seen; });
      if (stop_) return;
      seen = job_gen_;
      job = job_;
    }
    try {
      job(me);
    } catch (const std::exception& e) {
      me.error = std::current_exception();
      fail_all("rank " + std::to_string(r) + " failed: " + e.what());
    } catch (...) {
      me.error = std::current_exception();
      fail_all("rank " + std::to_string(r) + " failed");
    }
    std::lock_guard<std::mutex> lk(mu_);
    if (--pending_ == 0) cv_.notify_all();
  }
}

void ParallelExecutor::fail_all(const std::string& reason) {
  std::vector<Communicator*> comms;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (broken_) return;
    broken_ = true;
    for (auto& k : ranks_)
      if (k->comm) comms.push_back(k->comm.get());
  }
  cv_.notify_all();
  for (Communicator* c : comms) c->abort(reason);
}

std::exception_ptr ParallelExecutor::run_on_ranks(const std::function<void(Rank&)>& job) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& k : ranks_) k->error = nullptr;
    job_ = job;
    pending_ = world_;
    ++job_gen_;
  }
  cv_.notify_all();
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return pending_ == 0; });
  std::vector<std::exception_ptr> errors;
  for (auto& k : ranks_) errors.push_back(k->error);
  return first_root_cause(errors);
}

StepResult ParallelExecutor::execute(const StepBatch& batch) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    MS_CHECK(!broken_, "parallel executor: a rank failed in an earlier step; the rank group is unusable");
  }
  check_step_batch(info_, batch);  // a bad batch throws here, before any rank starts
  if (std::exception_ptr e = run_on_ranks([&batch](Rank& k) { k.result = k.exec->execute(batch); }))
    std::rethrow_exception(e);
  StepResult res = std::move(ranks_[0]->result);
  for (auto& k : ranks_) k->result = StepResult{};
  return res;
}

std::unique_ptr<ParallelExecutor> make_cpu_parallel_executor(const ExecutorOptions& exec, const ParallelLayout& layout) {
  ParallelExecutorOptions o;
  o.exec = exec;
  o.layout = layout;
  auto group = std::make_shared<InProcessGroup>(std::max(1, layout.tensor_parallel));
  o.make_backend = [](int) { return make_cpu_backend(); };
  o.make_comm = [group](int r, Backend&) { return group->communicator(r); };
  return std::make_unique<ParallelExecutor>(std::move(o));
}

}  // namespace moeserve

