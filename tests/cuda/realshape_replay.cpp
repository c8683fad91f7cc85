// realshape_replay: teacher-forced, batched replay of several sequences through
// RankExecutor on CudaBackend, for scripts/realshape_check.py (device only; not a ctest:
// its reference logits come from Hugging Face transformers on the device machine).
//
//   realshape_replay MODEL_DIR SPEC.json OUT_DIR
//   SPEC: {"enforce_eager": bool, "prefill_chunk": int (0 = whole prompt), "block_size": int,
//          "twins": bool, "seqs": [{"prompt": [ids], "forced": [ids]}, ...]}
//
// Step 0 prefills every sequence in the same steps (chunk c of every prompt that still has
// one, so the batched prefill mixes lengths); decode step k (k >= 1) feeds forced[k-1] of
// every sequence in one batch (teacher forcing: each row's context equals the reference's
// even where a greedy id would flip), N = forced.size() rows per sequence. With "twins" every
// sequence runs twice in each batch on its own KV blocks; the twin's rows are sampled greedily
// on the GPU (device sampler, the serving path), so its ids can be checked against the argmax
// of the very same logits and against the reference's ids.
// Writes OUT_DIR/seq<i>.npy (f32 [N, vocab]) and OUT_DIR/replay.json (device ids per sequence,
// decode graph counts, wall times).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/error.h"
#include "runtime/device_sampler.h"
#include "tools/generate.h"
#include "runtime/model_executor.h"

namespace {

namespace fs = std::filesystem;
using moeserve::SequenceStep;
using moeserve::StepBatch;

struct Seq {
  std::vector<int32_t> prompt, forced;
  std::vector<int32_t> blocks, twin_blocks;
  std::vector<float> logits;         // [N, V]
  std::vector<int32_t> device_ids;   // twin's GPU-sampled ids, one per step
};

int run(int argc, char** argv) {
  MS_CHECK(argc == 4, "usage: realshape_replay MODEL_DIR SPEC.json OUT_DIR");
  std::ifstream f(argv[2]);
  MS_CHECK(f.good(), "cannot read {}", argv[2]);
  const auto spec = nlohmann::json::parse(f);
  const bool twins = spec.value("twins", true);
  const int block = spec.value("block_size", 16);
  const int chunk_opt = spec.value("prefill_chunk", 0);
  std::vector<Seq> seqs;
  int blocks_total = 0, n_steps = -1, prefill_tokens = 0;
  for (const auto& s : spec.at("seqs")) {
    Seq q;
    q.prompt = s.at("prompt").get<std::vector<int32_t>>();
    q.forced = s.at("forced").get<std::vector<int32_t>>();
    MS_CHECK(!q.prompt.empty() && !q.forced.empty(), "spec: empty prompt or forced ids");
    MS_CHECK(n_steps < 0 || n_steps == int(q.forced.size()), "spec: every sequence needs the same forced length");
    n_steps = int(q.forced.size());
    const int nb = (int(q.prompt.size()) + n_steps + block - 1) / block;
    // Interleave the blocks of different sequences (not contiguous per sequence).
    for (int b = 0; b < nb; ++b) q.blocks.push_back(blocks_total + 2 * b);
    for (int b = 0; b < nb; ++b) q.twin_blocks.push_back(blocks_total + 2 * b + 1);
    blocks_total += 2 * nb;
    prefill_tokens += int(q.prompt.size()) * (twins ? 2 : 1);
    seqs.push_back(std::move(q));
  }
  const int rows = int(seqs.size()) * (twins ? 2 : 1);
  moeserve::ExecutorOptions eo;
  eo.model_dir = argv[1];
  eo.block_size = block;
  eo.num_kv_blocks = blocks_total;
  eo.max_num_seqs = rows;
  eo.max_num_batched_tokens = chunk_opt > 0 ? chunk_opt * rows : prefill_tokens;
  eo.enforce_eager = spec.value("enforce_eager", false);
  // "device": "cpu" (no twins) checks this tool's own bookkeeping on a machine without a GPU.
  std::unique_ptr<moeserve::Backend> backend;
  if (spec.value("device", std::string("cuda")) == "cpu") {
    MS_CHECK(!twins, "spec: twins need the CUDA device sampler");
    backend = moeserve::make_cpu_backend();
  } else {
    auto cuda = moeserve::make_cuda_backend(0);
    eo.device_sampler = moeserve::backend_device_sampler(*cuda);
    backend = std::move(cuda);
  }
  const auto t0 = std::chrono::steady_clock::now();
  moeserve::RankExecutor exec(std::move(backend), eo);
  const int V = exec.info().vocab_size;
  const auto t1 = std::chrono::steady_clock::now();

  auto make_step = [&](size_t i, bool twin, std::vector<int32_t> toks, int start, bool logits) {
    SequenceStep s;
    s.seq_id = int64_t(2 * i + (twin ? 1 : 0));
    s.tokens = std::move(toks);
    s.start_pos = start;
    s.block_table = twin ? seqs[i].twin_blocks : seqs[i].blocks;
    s.need_logits = logits;
    if (twin && logits) s.device_sample = moeserve::DeviceSampling{};  // greedy
    return s;
  };
  // Collects one step's results: logits rows in batch order for the non-twins, sampled ids
  // for the twins (only rows with need_logits produce either).
  auto collect = [&](const StepBatch& b, const moeserve::StepResult& r) {
    size_t li = 0, si = 0;
    for (const auto& s : b.seqs) {
      if (!s.need_logits) continue;
      Seq& q = seqs[size_t(s.seq_id / 2)];
      if (s.device_sample) {
        MS_CHECK(si < r.sampled_ids.size(), "missing sampled id");
        q.device_ids.push_back(r.sampled_ids[si++]);
      } else {
        MS_CHECK((li + 1) * size_t(V) <= r.logits.size(), "missing logits row");
        q.logits.insert(q.logits.end(), r.logits.begin() + li * V, r.logits.begin() + (li + 1) * V);
        ++li;
      }
    }
  };
  size_t longest = 0;
  for (const auto& q : seqs) longest = std::max(longest, q.prompt.size());
  const size_t chunk = chunk_opt > 0 ? size_t(chunk_opt) : longest;
  for (size_t c0 = 0; c0 < longest; c0 += chunk) {
    StepBatch b;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto& p = seqs[i].prompt;
      if (c0 >= p.size()) continue;
      const size_t e = std::min(p.size(), c0 + chunk);
      std::vector<int32_t> toks(p.begin() + c0, p.begin() + e);
      b.seqs.push_back(make_step(i, false, toks, int(c0), e == p.size()));
      if (twins) b.seqs.push_back(make_step(i, true, toks, int(c0), e == p.size()));
    }
    collect(b, exec.execute(b));
  }
  const auto t2 = std::chrono::steady_clock::now();
  for (int k = 1; k < n_steps; ++k) {
    StepBatch b;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int pos = int(seqs[i].prompt.size()) + k - 1;
      b.seqs.push_back(make_step(i, false, {seqs[i].forced[k - 1]}, pos, true));
      if (twins) b.seqs.push_back(make_step(i, true, {seqs[i].forced[k - 1]}, pos, true));
    }
    collect(b, exec.execute(b));
  }
  const auto t3 = std::chrono::steady_clock::now();
  nlohmann::ordered_json out;
  out["vocab_size"] = V;
  out["rows"] = rows;
  out["graphs_captured"] = exec.graphs_captured();
  out["graph_replays"] = exec.graph_replays();
  auto ms = [](auto a, auto b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
  out["load_ms"] = ms(t0, t1);
  out["prefill_ms"] = ms(t1, t2);
  out["decode_ms"] = ms(t2, t3);
  out["device_ids"] = nlohmann::json::array();
  for (size_t i = 0; i < seqs.size(); ++i) {
    MS_CHECK(int(seqs[i].logits.size()) == n_steps * V, "seq {}: {} logits rows", i, seqs[i].logits.size() / V);
    moeserve::write_npy_f32((fs::path(argv[3]) / ("seq" + std::to_string(i) + ".npy")).string(),
                            seqs[i].logits.data(), n_steps, V);
    out["device_ids"].push_back(seqs[i].device_ids);
  }
  std::ofstream o(fs::path(argv[3]) / "replay.json");
  o << out.dump() << "\n";
  std::printf("replay: %zu sequences x %d steps, %d rows per decode step, graphs %d, replays %d, "
              "load %.0f ms, prefill %.0f ms, decode %.0f ms\n",
              seqs.size(), n_steps, rows, exec.graphs_captured(), exec.graph_replays(), ms(t0, t1), ms(t1, t2),
              ms(t2, t3));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "realshape_replay: %s\n", e.what());
    return 1;
  }
}
