// Speculative decoding with draft heads on the CPU demo model (assets/demo-model): MTP modules
// (model.layers.6-8) and the EAGLE-3 head (assets/demo-model/eagle3). Output with speculation
// on equals the output with it off token for token (greedy, and seeded sampling: the host
// sampler draws the same numbers), KV usage returns to 0 after aborts mid-verify, malformed
// drafts are refused naming the tensor / key, and the acceptance per draft position on a fixed
// prompt set is within a stated tolerance of the demo card's numbers.
#include <gtest/gtest.h>

#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "engine/spec_config.h"
#include "engine/stop.h"
#include "io/safetensors.h"
#include "runtime/model_executor.h"

using namespace moeserve;
namespace fs = std::filesystem;

namespace {

fs::path source_dir() {
  const char* s = std::getenv("MOESERVE_SOURCE_DIR");
  return fs::path(s ? s : ".");
}
std::string demo() { return (source_dir() / "assets" / "demo-model").string(); }
std::string demo_eagle() { return (source_dir() / "assets" / "demo-model" / "eagle3").string(); }

struct Outcome {
  std::map<std::string, std::vector<int32_t>> tokens;
  std::map<std::string, FinishReason> reasons;
  EngineStats stats;
};

ExecutorOptions exec_opts(const SpecConfig& spec, const std::string& overrides = "", int exec_seqs = 8) {
  ExecutorOptions eo;
  eo.model_dir = demo();
  eo.hf_overrides = overrides;
  eo.block_size = 4;
  eo.num_kv_blocks = 600;
  eo.max_model_len = 1024;
  eo.max_num_seqs = exec_seqs;  // also the EAGLE-3 chain's scratch capacity (chains run in groups of it)
  eo.speculative = spec;
  return eo;
}

Outcome run(EngineConfig ec, const std::vector<std::vector<int32_t>>& prompts, SamplingParams p,
            int abort_after = 0, int exec_seqs = 8) {
  auto engine = make_engine(ec, make_cpu_executor(exec_opts(ec.speculative, "", exec_seqs)));
  std::mutex mu;
  std::condition_variable cv;
  Outcome out;
  size_t done = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.id = "r" + std::to_string(i);
    r.prompt_ids = prompts[i];
    r.params = p;
    if (p.seed) r.params.seed = *p.seed + i;
    r.on_output = [&, id = r.id](RequestOutput&& o) {
      std::lock_guard lk(mu);
      auto& v = out.tokens[id];
      v.insert(v.end(), o.new_token_ids.begin(), o.new_token_ids.end());
      if (o.finished) {
        out.reasons[id] = o.finish_reason;
        ++done;
        cv.notify_all();
      } else if (abort_after > 0 && int(v.size()) >= abort_after) {
        engine->abort(id);  // mid-generation: the engine takes it between steps
      }
    };
    EXPECT_TRUE(engine->submit(std::move(r)));
  }
  {
    std::unique_lock lk(mu);
    EXPECT_TRUE(cv.wait_for(lk, std::chrono::seconds(600), [&] { return done == prompts.size(); }));
  }
  for (int i = 0; i < 1000 && engine->stats().kv_cache_usage != 0.0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  out.stats = engine->stats();
  engine->shutdown(std::chrono::milliseconds(1000));
  return out;
}

SpecConfig spec(const std::string& json) { return parse_speculative_config(json); }
SpecConfig mtp(int k) { return spec(R"({"method": "mtp", "num_speculative_tokens": )" + std::to_string(k) + "}"); }
SpecConfig eagle(int k) {
  return spec(R"({"method": "eagle3", "model": ")" + demo_eagle() + R"(", "num_speculative_tokens": )" +
              std::to_string(k) + "}");
}

void expect_same(const Outcome& a, const Outcome& b) {
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (const auto& [id, t] : a.tokens) {
    EXPECT_EQ(t, b.tokens.at(id)) << id;
    EXPECT_EQ(a.reasons.at(id), b.reasons.at(id)) << id;
  }
}

std::vector<std::vector<int32_t>> golden_prompts() {
  std::ifstream f(source_dir() / "tests" / "fixtures" / "golden" / "demo_bf16" / "golden.json");
  const auto j = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : j["cases"]) prompts.push_back(c["prompt_ids"].get<std::vector<int32_t>>());
  // Shorter variants (other contexts, other block alignments).
  for (size_t i = 0; i < 3 && i < prompts.size(); ++i)
    prompts.push_back(std::vector<int32_t>(prompts[i].begin(), prompts[i].begin() + prompts[i].size() * 2 / 3));
  return prompts;
}

struct Acceptance {
  std::vector<double> rate;  // conditional per position (the card's definition)
  double mean_accepted = 0;  // accepted drafts per verify step
};
Acceptance acceptance(const EngineStats& s) {
  Acceptance a;
  double prev = double(s.spec_num_drafts);
  for (uint64_t n : s.spec_accepted_per_pos) {
    a.rate.push_back(prev > 0 ? double(n) / prev : 0);
    prev = double(n);
  }
  a.mean_accepted = double(s.spec_num_accepted_tokens) / double(std::max<uint64_t>(1, s.spec_num_drafts));
  return a;
}

void greedy_identical(const SpecConfig& sc, const char* name, int exec_seqs = 8) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 64;
  EngineConfig off;
  off.max_num_batched_tokens = 24;  // chunked prefills next to decodes and verify steps
  off.max_num_seqs = 8;
  off.eos_token_ids = read_eos_token_ids(demo());
  EngineConfig on = off;
  on.speculative = sc;
  on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
  const auto prompts = golden_prompts();
  const Outcome a = run(off, prompts, p), b = run(on, prompts, p, 0, exec_seqs);
  expect_same(a, b);
  EXPECT_GT(b.stats.spec_num_drafts, 20u);
  EXPECT_EQ(b.stats.kv_cache_usage, 0.0);
  const Acceptance acc = acceptance(b.stats);
  ASSERT_EQ(acc.rate.size(), 3u);
  // A draft head that reads the wrong taps / hidden states accepts almost nothing.
  EXPECT_GT(acc.rate[0], 0.4) << name;
  std::printf("%s greedy (chunked prefill, batch %zu): drafts %llu, per-position acceptance %.3f %.3f %.3f, mean "
              "accepted %.3f\n",
              name, prompts.size(), (unsigned long long)b.stats.spec_num_drafts, acc.rate[0], acc.rate[1],
              acc.rate[2], acc.mean_accepted);
}

TEST(SpecHeads, MtpGreedyIdentical) { greedy_identical(mtp(3), "mtp"); }
TEST(SpecHeads, Eagle3GreedyIdentical) { greedy_identical(eagle(3), "eagle3"); }
// More drafting sequences than the executor's max_num_seqs: the chains run in groups.
TEST(SpecHeads, Eagle3ChainsInGroups) { greedy_identical(eagle(3), "eagle3 (chains in groups of 2)", 2); }

// Adaptive k (engine/spec_policy.h) with a fake clock: verifying is expensive at 4 or more
// sequences and free of extra cost below, so the engine runs plain (k = 0) steps while the batch
// is large and speculates as it drains. The draft's cache follows the k = 0 steps too (their
// verified rows still go to propose with k = 0), so greedy output equals speculation off.
TEST(SpecHeads, AdaptiveKGreedyIdenticalBothMethods) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 64;
  EngineConfig off;
  off.max_num_batched_tokens = 512;  // the prompts in one step, then pure decode steps (measured)
  off.max_num_seqs = 8;
  off.eos_token_ids = read_eos_token_ids(demo());
  const auto prompts = golden_prompts();
  const Outcome a = run(off, prompts, p);
  for (const SpecConfig& sc : {mtp(3), eagle(3)}) {
    EngineConfig on = off;
    on.speculative = sc;
    on.spec_policy.clock = [](SpecPhase ph, const SpecStepShape& shape, int k, double) {
      if (ph == SpecPhase::Draft) return 0.0;
      return shape.num_seqs >= 4 ? 0.001 * (1 + 3 * k) : 0.001;
    };
    const Outcome b = run(on, prompts, p);
    SCOPED_TRACE(spec_method_name(sc.method));
    expect_same(a, b);
    EXPECT_EQ(b.stats.kv_cache_usage, 0.0);
    ASSERT_EQ(b.stats.spec_chosen_k.size(), 4u);
    EXPECT_GE(b.stats.spec_chosen_k[0], 4u);
    EXPECT_GE(b.stats.spec_chosen_k[3], 4u);
    EXPECT_GT(b.stats.spec_num_accepted_tokens, 0u);
    std::printf("%s adaptive: chosen k0 %llu k1 %llu k2 %llu k3 %llu, explorations %llu, verify rows %llu\n",
                spec_method_name(sc.method), (unsigned long long)b.stats.spec_chosen_k[0],
                (unsigned long long)b.stats.spec_chosen_k[1], (unsigned long long)b.stats.spec_chosen_k[2],
                (unsigned long long)b.stats.spec_chosen_k[3], (unsigned long long)b.stats.spec_k_explorations,
                (unsigned long long)b.stats.spec_num_drafts);
  }
}

// Temperature > 0: with a seed the host sampler draws the same numbers with speculation on
// and off (engine/spec_decode.h), so the law is equal in the strongest sense: every sample.
TEST(SpecHeads, SeededSamplingIdenticalBothMethods) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_p = 0.95f;
  p.seed = 11;
  p.max_tokens = 32;
  p.logprobs = 1;
  EngineConfig off;
  off.max_num_batched_tokens = 32;
  off.eos_token_ids = read_eos_token_ids(demo());
  const auto prompts = golden_prompts();
  const Outcome a = run(off, prompts, p);
  for (const SpecConfig& sc : {mtp(2), eagle(3)}) {
    EngineConfig on = off;
    on.speculative = sc;
    on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
    const Outcome b = run(on, prompts, p);
    SCOPED_TRACE(spec_method_name(sc.method));
    expect_same(a, b);
    EXPECT_GT(b.stats.spec_num_accepted_tokens, 0u);
  }
}

TEST(SpecHeads, AbortMidVerifyReturnsKvToZero) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 200;
  p.ignore_eos = true;
  for (const SpecConfig& sc : {mtp(3), eagle(3)}) {
    EngineConfig on;
    on.max_num_batched_tokens = 32;
    on.speculative = sc;
    on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
    const Outcome b = run(on, golden_prompts(), p, /*abort_after=*/9);
    SCOPED_TRACE(spec_method_name(sc.method));
    for (const auto& [id, r] : b.reasons) EXPECT_EQ(r, FinishReason::Abort) << id;
    EXPECT_GT(b.stats.spec_num_drafts, 0u);
    EXPECT_EQ(b.stats.kv_cache_usage, 0.0);
  }
}

// --- malformed drafts --------------------------------------------------------------------

std::string load_error(const SpecConfig& sc, const std::string& overrides = "") {
  try {
    make_cpu_executor(exec_opts(sc, overrides));
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// A copy of the demo EAGLE-3 head with `edit` applied to its tensors and `cfg_edit` to its config.
std::string broken_eagle(const std::string& name, const std::function<void(std::vector<NamedTensor>&)>& edit,
                         const std::function<void(nlohmann::json&)>& cfg_edit = {}) {
  const fs::path dir = fs::temp_directory_path() / ("moeserve_eagle3_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const Checkpoint ck = Checkpoint::open(demo_eagle());
  std::vector<NamedTensor> ts;
  for (const auto& n : ck.names()) ts.push_back({n, ck.get(n)});
  edit(ts);
  write_safetensors((dir / "model.safetensors").string(), ts);
  std::ifstream f(fs::path(demo_eagle()) / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(f);
  if (cfg_edit) cfg_edit(cfg);
  std::ofstream(dir / "config.json") << cfg.dump(2);
  return dir.string();
}

SpecConfig eagle_at(const std::string& dir) {
  return spec(R"({"method": "eagle3", "model": ")" + dir + R"(", "num_speculative_tokens": 3})");
}

TEST(SpecHeads, MalformedEagle3Refused) {
  auto drop = [](const std::string& n) {
    return [n](std::vector<NamedTensor>& ts) {
      std::erase_if(ts, [&](const NamedTensor& t) { return t.name == n; });
    };
  };
  std::string e = load_error(eagle_at(broken_eagle("missing", drop("midlayer.self_attn.k_proj.weight"))));
  EXPECT_NE(e.find("'midlayer.self_attn.k_proj.weight'"), std::string::npos) << e;
  e = load_error(eagle_at(broken_eagle("shape", [](std::vector<NamedTensor>& ts) {
    for (auto& t : ts)
      if (t.name == "lm_head.weight") {
        Tensor s = Tensor::host(t.tensor.dtype, {t.tensor.dim(0) - 1, t.tensor.dim(1)});
        std::memcpy(s.data, t.tensor.data, s.nbytes());
        t.tensor = s;
      }
  })));
  EXPECT_NE(e.find("lm_head.weight"), std::string::npos) << e;
  e = load_error(eagle_at(broken_eagle("d2t", [](std::vector<NamedTensor>& ts) {
    for (auto& t : ts)
      if (t.name == "d2t") {
        Tensor c = Tensor::host(t.tensor.dtype, t.tensor.shape);
        std::memcpy(c.data, t.tensor.data, c.nbytes());
        c.ptr<int64_t>()[5] = 100000;
        t.tensor = c;
      }
  })));
  EXPECT_NE(e.find("'d2t' maps draft id 5"), std::string::npos) << e;
  e = load_error(eagle_at(broken_eagle("vocab", [](std::vector<NamedTensor>&) {},
                                       [](nlohmann::json& c) { c["vocab_size"] = 8000; })));
  EXPECT_NE(e.find("vocab_size 8000 differs from the target's 8192"), std::string::npos) << e;
  // Tap ids without a convention (and not vLLM's default tuple) are ambiguous: refused.
  e = load_error(eagle_at(broken_eagle("taps", [](std::vector<NamedTensor>&) {}, [](nlohmann::json& c) {
    c["eagle_config"].erase("eagle_aux_hidden_state_convention");
  })));
  EXPECT_NE(e.find("ambiguous"), std::string::npos) << e;
  EXPECT_NE(e.find("eagle_aux_hidden_state_convention"), std::string::npos) << e;
  // output_of_layer [2, 3, 5] asks for boundary 6 = the last layer's output: valid; 6 is not.
  e = load_error(eagle_at(broken_eagle("range", [](std::vector<NamedTensor>&) {}, [](nlohmann::json& c) {
    c["eagle_config"]["eagle_aux_hidden_state_convention"] = "output_of_layer";
    c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = {2, 3, 6};
  })));
  EXPECT_NE(e.find("boundary 7, outside"), std::string::npos) << e;
  EXPECT_EQ(load_error(eagle(3)), "");
}

TEST(SpecHeads, MtpMissingModulesRefused) {
  // A config that declares more modules than the checkpoint ships (as every public MiniMax-M2.x).
  const std::string e = load_error(mtp(3), R"({"num_mtp_modules": 4})");
  EXPECT_NE(e.find("model.layers.9."), std::string::npos) << e;
  EXPECT_NE(e.find("eagle3"), std::string::npos) << e;
  EXPECT_NE(e.find("ngram"), std::string::npos) << e;
  const std::string k = load_error(mtp(4));
  EXPECT_NE(k.find("exceeds the checkpoint's 3 MTP module"), std::string::npos) << k;
  const std::string none = load_error(mtp(1), R"({"num_mtp_modules": 0})");
  EXPECT_NE(none.find("declares no MTP modules"), std::string::npos) << none;
}

// Acceptance per draft position (greedy chain of 3, the card's conditional definition: rate k
// = accepted at k / accepted at k - 1) on a fixed held-out prompt set shaped like the card's
// (scripts/spec_acceptance_prompts.py: 16 dialog and 16 prose windows of 96 tokens, 96 greedy
// tokens each, EOS ignored). The card (the retrained model of branch hdemo) measured MTP
// 0.832/0.843/0.905 and EAGLE-3 0.727/0.793/0.870 with the torch reference
// (scripts/train_eagle.py) on its own held-out set (Python-docs prose, which is not on this
// machine, and dialogs) at every position of the continuation; the engine measures at its
// verify steps. Measured here (CPU, this set): MTP 0.740/0.799/0.827, EAGLE-3 0.627/0.656/0.720,
// 0.04-0.15 under the card (the prose half is moeserve's own docs, harder than held-out Python
// docs). Stated tolerance: 0.2 absolute per position of the card. (On the first demo model
// taps one layer late cost little, so the convention itself is pinned by the loader tests,
// not by acceptance.)
TEST(SpecHeads, AcceptanceOnHeldOutText) {
  const double card[2][3] = {{0.832, 0.843, 0.905}, {0.727, 0.793, 0.870}};
  std::ifstream f(source_dir() / "tests" / "fixtures" / "spec_acceptance" / "prompts.json");
  const auto j = nlohmann::json::parse(f);
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& pr : j["prompts"]) prompts.push_back(pr.get<std::vector<int32_t>>());
  ASSERT_EQ(prompts.size(), 32u);
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 96;
  p.ignore_eos = true;
  int m = 0;
  for (const SpecConfig& sc : {mtp(3), eagle(3)}) {
    EngineConfig on;
    on.max_num_batched_tokens = 512;
    on.max_num_seqs = 8;
    on.speculative = sc;
    on.spec_policy.pinned_k = kMaxSpecTokens;  // every draft, every step (vLLM's behaviour)
    const Outcome b = run(on, prompts, p);
    const Acceptance a = acceptance(b.stats);
    std::printf("acceptance %s: per position %.3f %.3f %.3f (card %.3f %.3f %.3f), mean accepted %.3f of 3, "
                "%llu verify steps\n",
                spec_method_name(sc.method), a.rate[0], a.rate[1], a.rate[2], card[m][0], card[m][1], card[m][2],
                a.mean_accepted, (unsigned long long)b.stats.spec_num_drafts);
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(a.rate[size_t(i)], card[m][i], 0.2) << spec_method_name(sc.method) << i;
    ++m;
  }
}

}  // namespace
