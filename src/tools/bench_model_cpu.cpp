// bench-model on the CPU reference backend (--device cpu): decode / verify rows timed by the
// wall clock (bench_verify.h), and --measure-routing-overlap. Also the option checks and the
// report writer shared with the CUDA run (bench_model.cpp).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include "backend/factory.h"
#include "core/error.h"
#include "core/kv_cache_dtype.h"
#include "core/log.h"
#include "io/safetensors.h"
#include "model/registry.h"
#include "tools/bench_model.h"
#include "tools/bench_verify.h"
#include "tools/random_weights.h"

namespace moeserve::tools {

void check_verify_options(const BenchModelOptions& opt) {
  MS_CHECK(opt.device == "cuda" || opt.device == "cpu", "bench-model: --device {}: expected cuda or cpu", opt.device);
  for (int k : opt.verify_tokens)
    MS_CHECK(k >= 0 && k <= 32, "bench-model: --verify-tokens {}: each k must be in 0..32 (0 = the decode row)", k);
  MS_CHECK(opt.routing_overlap < 0 || opt.routing_overlap <= 1.0,
           "bench-model: --routing-overlap {}: a fraction in [0, 1]", opt.routing_overlap);
  MS_CHECK(opt.routing_overlap < 0 || !opt.verify_tokens.empty(),
           "bench-model: --routing-overlap shapes verify rows: give --verify-tokens too");
  MS_CHECK(opt.verify_tokens.empty() || opt.tensor_parallel == 1,
           "bench-model: --verify-tokens runs on one GPU (not with --tensor-parallel-size {})", opt.tensor_parallel);
  if (!opt.measure_routing_overlap.empty()) {
    MS_CHECK(opt.device == "cpu" && !opt.checkpoint.empty(),
             "bench-model: --measure-routing-overlap runs a checkpoint on the CPU reference: give MODEL_DIR and "
             "--device cpu");
    MS_CHECK(opt.overlap_decode_tokens >= 2, "bench-model: --overlap-decode-tokens must be >= 2");
  }
  if (opt.device == "cpu")
    MS_CHECK(opt.tensor_parallel == 1 && opt.profile_batches.empty(),
             "bench-model --device cpu: no --tensor-parallel-size or --profile (CUDA only)");
}

void write_report(const nlohmann::json& report, const std::string& path) {
  const std::string js = report.dump(2);
  if (!path.empty()) {
    std::ofstream f(path);
    MS_CHECK(f.good(), "bench-model: cannot write {}", path);
    f << js << "\n";
  } else {
    std::printf("%s\n", js.c_str());
  }
}

namespace {

// Mean |S_t n S_(t-1)| / K over consecutive tokens of each run, and the mean distinct experts
// of windows of w consecutive tokens; runs[r][l] is run r's [n, K] table of layer l.
struct OverlapStats {
  std::vector<double> per_layer;  // overlap
  double overlap = 0;
  int64_t pairs = 0;
  std::map<int, double> window_distinct;  // w -> mean distinct per layer
};

OverlapStats overlap_stats(const std::vector<std::vector<std::vector<int32_t>>>& runs, int layers, int K) {
  OverlapStats st;
  st.per_layer.assign(size_t(layers), 0.0);
  std::vector<int64_t> n_l(size_t(layers), 0);
  std::map<int, std::pair<double, int64_t>> win;
  for (const auto& run : runs)
    for (int l = 0; l < layers; ++l) {
      const auto& L = run[size_t(l)];
      const int64_t n = int64_t(L.size()) / K;
      for (int64_t t = 1; t < n; ++t) {
        std::set<int32_t> prev(L.begin() + (t - 1) * K, L.begin() + t * K);
        int same = 0;
        for (int j = 0; j < K; ++j) same += int(prev.count(L[size_t(t * K + j)]));
        st.per_layer[size_t(l)] += double(same) / K;
        ++n_l[size_t(l)];
      }
      for (int w = 2; w <= 5; ++w)
        for (int64_t t = 0; t + w <= n; ++t) {
          std::set<int32_t> u(L.begin() + t * K, L.begin() + (t + w) * K);
          win[w].first += double(u.size());
          ++win[w].second;
        }
    }
  double sum = 0;
  for (int l = 0; l < layers; ++l) {
    sum += st.per_layer[size_t(l)];
    st.pairs += n_l[size_t(l)];
    if (n_l[size_t(l)] > 0) st.per_layer[size_t(l)] /= double(n_l[size_t(l)]);
  }
  st.overlap = st.pairs > 0 ? sum / double(st.pairs) : 0;
  st.pairs /= std::max(1, layers);
  for (auto& [w, v] : win) st.window_distinct[w] = v.second > 0 ? v.first / double(v.second) : 0;
  return st;
}

nlohmann::json stats_json(const OverlapStats& st, int E, int K) {
  nlohmann::json win = nlohmann::json::object(), uni = nlohmann::json::object();
  for (auto& [w, v] : st.window_distinct) {
    win[std::to_string(w)] = v;
    uni[std::to_string(w)] = expected_distinct_uniform(E, K, w);
  }
  return {{"overlap", st.overlap},
          {"pairs", st.pairs},
          {"overlap_per_layer", st.per_layer},
          {"distinct_per_layer_of_window", win},
          {"distinct_uniform_of_window", uni}};
}

}  // namespace

nlohmann::json measure_routing_overlap(DecoderModel& model, Backend& b, const std::string& prompts_path,
                                       int decode_tokens) {
  std::ifstream f(prompts_path);
  MS_CHECK(f.good(), "bench-model: cannot read --measure-routing-overlap {}", prompts_path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    fail("bench-model: {} is not JSON: {}", prompts_path, e.what());
  }
  const nlohmann::json& list = j.is_object() && j.contains("prompts") ? j["prompts"] : j;
  MS_CHECK(list.is_array() && !list.empty(), "bench-model: {}: expected {{\"prompts\": [[ids...], ...]}} or a list of "
           "id lists", prompts_path);
  const ModelDesc d = model.desc();
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& p : list) {
    MS_CHECK(p.is_array() && !p.empty(), "bench-model: {}: each prompt must be a non-empty list of token ids",
             prompts_path);
    std::vector<int32_t> ids;
    for (const auto& t : p) {
      MS_CHECK(t.is_number_integer() && t.get<int64_t>() >= 0 && t.get<int64_t>() < d.vocab_size,
               "bench-model: {}: token {} outside the vocabulary of {}", prompts_path, t.dump(), d.vocab_size);
      ids.push_back(int32_t(t.get<int64_t>()));
    }
    prompts.push_back(std::move(ids));
  }
  size_t max_p = 0;
  for (const auto& p : prompts) max_p = std::max(max_p, p.size());
  const int bs = 16, K = d.experts_per_token, E = d.num_experts;
  const int max_ctx = int(max_p) + decode_tokens;
  MS_CHECK(max_ctx <= d.max_position_embeddings || d.max_position_embeddings == 0,
           "bench-model: prompts of {} tokens + {} decoded exceed the model's {} positions", max_p, decode_tokens,
           d.max_position_embeddings);
  BenchStep step(b, model, int(max_p), 1, max_ctx / bs + 2);
  step.alloc_kv(max_ctx / bs + 2, bs, b.activation_dtype());
  // runs[r][l]: the [n, K] router choices of layer l for prompt r's prompt / generated tokens.
  std::vector<std::vector<std::vector<int32_t>>> prompt_runs, gen_runs;
  int moe_layers = -1;
  auto record = [&](int T, std::vector<std::vector<int32_t>>& into) -> Tensor {
    int l = 0;
    model.set_op_hook([&](const char* op) {
      if (std::string(op) != "norm_route") return;
      const std::vector<float> v = b.download_f32(model.workspace().expert_ids.slice_rows(0, T));
      if (size_t(l) >= into.size()) into.resize(size_t(l) + 1);
      into[size_t(l)].insert(into[size_t(l)].end(), v.begin(), v.begin() + int64_t(T) * K);
      ++l;
    });
    Tensor logits = step.forward();
    model.set_op_hook({});
    MS_CHECK(moe_layers < 0 || moe_layers == l, "routing record: {} MoE layers, then {}", moe_layers, l);
    moe_layers = l;
    return logits;
  };
  auto argmax = [&](const Tensor& logits) {
    const std::vector<float> v = b.download_f32(logits);
    int32_t best = 0;
    for (int i = 1; i < d.vocab_size; ++i)
      if (v[size_t(i)] > v[size_t(best)]) best = i;  // ties: the lowest id
    return best;
  };
  int64_t generated = 0;
  for (const auto& p : prompts) {
    const int P = int(p.size());
    prompt_runs.emplace_back();
    gen_runs.emplace_back();
    step.set_ids(p);
    step.plan({P}, {P});
    int32_t next = argmax(record(P, prompt_runs.back()));
    for (int i = 0; i < decode_tokens; ++i) {
      step.set_ids({next});
      step.plan({1}, {P + i + 1});
      const Tensor logits = record(1, gen_runs.back());
      ++generated;
      if (d.eos_token_id && next == *d.eos_token_id) break;  // the routed token was EOS: the text ends
      next = argmax(logits);
    }
  }
  const OverlapStats gen = overlap_stats(gen_runs, moe_layers, K), pr = overlap_stats(prompt_runs, moe_layers, K);
  const double chance = double(K) / E;
  std::printf("routing overlap of %s (%d MoE layers, top-%d of %d experts; chance %.3f)\n", d.architecture.c_str(),
              moe_layers, K, E, chance);
  std::printf("  generated tokens: %.4f over %lld consecutive pairs (%lld tokens of %zu prompts)\n", gen.overlap,
              (long long)gen.pairs, (long long)generated, prompts.size());
  std::printf("  prompt tokens:    %.4f over %lld consecutive pairs\n", pr.overlap, (long long)pr.pairs);
  for (auto& [w, v] : gen.window_distinct)
    std::printf("  %d consecutive generated tokens: %.3f distinct experts per layer (uniform: %.3f)\n", w, v,
                expected_distinct_uniform(E, K, w));
  return {{"model_experts", E},
          {"top_k", K},
          {"moe_layers", moe_layers},
          {"prompts", prompts.size()},
          {"decode_tokens_per_prompt", decode_tokens},
          {"chance_overlap", chance},
          // Overlap above chance as a fraction of what is left: (P - K/E) / (1 - K/E).
          {"generated_excess_over_chance", (gen.overlap - chance) / (1 - chance)},
          {"generated", stats_json(gen, E, K)},
          {"prompt", stats_json(pr, E, K)},
          {"greedy", true}};
}

int run_bench_model_cpu(const BenchModelOptions& opt) {
  check_verify_options(opt);
  MS_CHECK(opt.checkpoint.empty() != opt.synthetic.empty(),
           "bench-model: give either a checkpoint directory or --synthetic NAME ({})", synthetic_model_names());
  MS_CHECK(opt.layers >= 0 && opt.iters >= 1, "bench-model: --layers must be >= 0 and --iters >= 1");
  std::unique_ptr<Backend> backend = make_backend("cpu");
  Backend& b = *backend;
  SyntheticModel bench = bench_model_config(opt.checkpoint, opt.synthetic, opt.layers);
  std::unique_ptr<ArchConfig> cfg = std::move(bench.config);
  const SynthShapes s = bench.shapes;
  std::unique_ptr<DecoderModel> model = make_bench_model(*cfg, b);
  if (opt.checkpoint.empty())
    load_random_weights(*model, RandomWeightOptions{1000, true});
  else
    model->load(Checkpoint::open(opt.checkpoint));
  nlohmann::json out;
  out["command"] = opt.command_line;
  out["device"] = "cpu";
  out["layers"] = model->desc().num_layers;
  out["total_layers"] = s.total_layers;
  out["model"] = opt.checkpoint.empty() ? opt.synthetic + " (synthetic weights)" : opt.checkpoint;
  if (!opt.measure_routing_overlap.empty()) {
    out["routing_overlap"] = measure_routing_overlap(*model, b, opt.measure_routing_overlap, opt.overlap_decode_tokens);
    write_report(out, opt.json_out);
    return 0;
  }
  std::vector<int> ks = opt.verify_tokens.empty() ? std::vector<int>{0} : opt.verify_tokens;
  const int kmax = *std::max_element(ks.begin(), ks.end());
  const int max_batch = *std::max_element(opt.batches.begin(), opt.batches.end());
  const int max_ctx = *std::max_element(opt.contexts.begin(), opt.contexts.end()) + kmax;
  const int bs = opt.block_size;
  MS_CHECK(bs >= 1 && max_batch >= 1 && max_ctx >= 1, "bench-model: batch sizes, contexts and --block-size must be >= 1");
  const int max_blocks = (max_ctx + bs - 1) / bs + 1;
  const DType kv_dtype = kv_cache_storage_dtype(parse_kv_cache_dtype(opt.kv_cache_dtype), b.activation_dtype());
  const int64_t pool = int64_t(max_batch) * ((max_ctx + bs - 1) / bs);
  const KvLayout kvl = model->kv_layout();
  const double kv_bytes = double(pool) * double(kvl.bytes_per_block(bs, int64_t(dtype_size(kv_dtype))));  // all layers
  MS_CHECK(kv_bytes < 16e9, "bench-model --device cpu: a KV cache of {:.1f} GB for batch {} x context {}: use smaller "
           "shapes on the CPU", kv_bytes / 1e9, max_batch, max_ctx);
  BenchStep step(b, *model, max_batch * (1 + kmax), max_batch * (1 + kmax), max_blocks);
  step.alloc_kv(int(pool), bs, kv_dtype);
  out["kv_cache_dtype"] = dtype_name(kv_dtype);
  VerifySweepOptions vo;
  vo.batches = opt.batches, vo.contexts = opt.contexts, vo.verify_tokens = ks;
  vo.routing_overlap = opt.routing_overlap, vo.routing_seed = opt.routing_seed;
  vo.layers = model->desc().num_layers, vo.total_layers = s.total_layers;
  auto time_step = [&]() {
    step.forward();  // warm (workspaces)
    std::vector<double> v;
    for (int i = 0; i < opt.iters; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      step.forward();
      v.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto fits = [&](int B, int C, int k) { return int64_t(B) * ((C + k + bs - 1) / bs) <= pool; };
  out["verify"] = run_verify_sweep(b, *model, step, vo, time_step, fits);
  out["verify"]["graph"] = false;
  out["note"] = "CPU reference backend: wall-clock medians, eager steps, no roofline or prefill";
  write_report(out, opt.json_out);
  return 0;
}

}  // namespace moeserve::tools
