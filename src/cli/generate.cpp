// `moeserve generate --model DIR (--prompt TEXT | --messages FILE | --prompt-ids "1,2,3")`:
// one sequence through the ModelExecutor (no engine, no server). --prompt is encoded with the
// model's tokenizer (special tokens added as HF's encode does); --messages renders a JSON
// messages list with the chat template, as chat/completions does (same normalisation,
// protocol.h); both print the generated text (up to the first end-of-sequence token).
// --prompt-ids takes token ids and prints the generated ids. --json prints
// {"prompt_ids": [...], "generated_ids": [...]} (and "text" for text prompts) on stdout;
// --dump-logits writes float32 .npy [N, vocab] whose row k holds the logits generated token
// k was chosen from. --speculative-config (serve's flag) runs the request through the engine
// instead (one sequence, EOS ignored as here), so greedy output is the same; sampled output is
// then the engine sampler's (as serve with that seed), and the speculative counters are printed
// on stderr. k is pinned to num_speculative_tokens (serve's --no-speculative-adaptive), so the
// printed acceptance per position is measured at every position, every step.
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/parallel_cli.h"
#include "cli/model_source.h"
#include "cli/registry.h"
#include "core/bounded_json.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/spec_config.h"
#include "engine/stop.h"
#include "server/protocol.h"
#include "server/tokenizer_frontend.h"
#include "model/registry.h"
#include "tools/generate.h"
#include "runtime/model_executor.h"
#include "backend/cpu/cpu_backend.h"
#ifdef MOESERVE_WITH_CUDA
#include "backend/factory.h"
#endif

namespace {
struct Args {
  std::string model, prompt_ids, prompt, messages, chat_template, dump_logits, device = "cpu";
  std::string speculative_config;
  int max_tokens = 16, block_size = 16, prefill_chunk = 0;
  std::string kv_cache_dtype = "auto";
  float temperature = 0.f;
  uint64_t seed = 0;
  bool json = false;
  bool enforce_eager = false;
  moeserve::cli::ParallelFlags par;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    MS_CHECK(b != std::string::npos, "--prompt-ids: empty entry in '{}'", s);
    item = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    // Plain decimal integers only (no '+', hex, or trailing text).
    const bool numeric = used == item.size() && (std::isdigit(static_cast<unsigned char>(item[0])) ||
                                                 (item[0] == '-' && item.size() > 1));
    MS_CHECK(numeric, "--prompt-ids: '{}' is not an integer token id", item);
    MS_CHECK(v >= 0, "--prompt-ids: token id {} is negative", v);
    MS_CHECK(v <= INT32_MAX, "--prompt-ids: token id {} is out of range", item);
    ids.push_back(int32_t(v));
  }
  MS_CHECK(!ids.empty(), "--prompt-ids is empty");
  MS_CHECK(s.find_last_not_of(" \t") == std::string::npos || s[s.find_last_not_of(" \t")] != ',',
           "--prompt-ids: trailing comma in '{}'", s);
  return ids;
}

// The prompt of --prompt / --messages as token ids, with the model's tokenizer and template.
std::vector<int32_t> text_prompt_ids(const Args& a, const moeserve::server::TokenizerFrontend& fe) {
  using moeserve::server::ojson;
  if (a.messages.empty()) return fe.encode(a.prompt, /*add_special_tokens=*/true);
  std::ifstream f(a.messages, std::ios::binary);
  MS_CHECK(f.good(), "--messages: cannot read {}", a.messages);
  ojson doc;
  try {
    doc = moeserve::parse_json_bounded<ojson>(std::string(std::istreambuf_iterator<char>(f), {}), a.messages);
  } catch (const nlohmann::json::exception& e) {
    moeserve::fail("--messages {}: invalid JSON: {}", a.messages, e.what());
  }
  // A list of messages, or {"messages": [...], "tools": [...]}: checked and normalised as a
  // chat/completions body is (content parts flattened, roles and tool calls validated).
  ojson body = doc.is_array() ? ojson{{"messages", doc}} : doc;
  MS_CHECK(body.is_object() && body.contains("messages"),
           "--messages {}: expected a JSON list of messages or an object with \"messages\"", a.messages);
  for (auto it = body.begin(); it != body.end();)
    it = it.key() == "messages" || it.key() == "tools" ? std::next(it) : body.erase(it);
  body["model"] = "generate";
  moeserve::server::GenRequest r;
  try {
    moeserve::server::ProtocolLimits limits;
    limits.auto_tool_choice_enabled = true;  // tools given are rendered by the template; no parser runs here
    r = moeserve::server::parse_chat_request(body, limits);
  } catch (const std::exception& e) {
    moeserve::fail("--messages {}: {}", a.messages, e.what());
  }
  moeserve::server::ChatRenderInputs in;
  in.messages = r.messages;
  in.tools = r.tools;
  in.add_generation_prompt = true;
  return fe.encode(fe.render_chat(in), /*add_special_tokens=*/false);
}

// One request through the engine (--speculative-config): max_tokens tokens, EOS ignored.
moeserve::GenerateResult generate_in_engine(std::unique_ptr<moeserve::ModelExecutor> exec,
                                            const moeserve::GenerateOptions& g, const moeserve::SpecConfig& spec) {
  using namespace moeserve;
  const ExecutorInfo info = exec->info();
  EngineConfig ec;
  ec.max_num_seqs = 1;
  ec.max_num_batched_tokens = g.prefill_chunk > 0 ? g.prefill_chunk : int(g.prompt_ids.size()) + kMaxSpecTokens + 1;
  ec.max_model_len = info.max_model_len;
  ec.seed = g.seed;
  ec.speculative = spec;
  ec.spec_policy.pinned_k = kMaxSpecTokens;  // every draft every step: the acceptance printed below
  auto engine = make_engine(ec, std::move(exec));
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  GenerateResult res;
  res.vocab_size = info.vocab_size;
  std::string error;
  Request r;
  r.id = "generate";
  r.prompt_ids = g.prompt_ids;
  r.params.max_tokens = g.max_tokens;
  r.params.temperature = g.temperature;
  r.params.seed = g.seed;
  r.params.ignore_eos = true;
  r.on_output = [&](RequestOutput&& o) {
    std::lock_guard lk(mu);
    res.generated_ids.insert(res.generated_ids.end(), o.new_token_ids.begin(), o.new_token_ids.end());
    if (o.finished) {
      error = o.error;
      done = true;
      cv.notify_all();
    }
  };
  MS_CHECK(engine->submit(std::move(r)), "the engine refused the request");
  {
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return done; });
  }
  MS_CHECK(error.empty(), "generation failed: {}", error);
  const EngineStats st = engine->stats();
  std::string per_pos;
  for (size_t i = 0; i < st.spec_accepted_per_pos.size(); ++i)
    per_pos += fmt::format("{}{:.3f}", i ? ", " : "", st.spec_num_drafts ? double(st.spec_accepted_per_pos[i]) / double(st.spec_num_drafts) : 0.0);
  std::fprintf(stderr, "speculative decoding (%s): %llu verify steps, %llu draft tokens, %llu accepted; mean acceptance "
                       "length %.3f; accepted per position [%s]\n",
               describe(spec).c_str(), (unsigned long long)st.spec_num_drafts,
               (unsigned long long)st.spec_num_draft_tokens, (unsigned long long)st.spec_num_accepted_tokens,
               1.0 + double(st.spec_num_accepted_tokens) / double(std::max<uint64_t>(1, st.spec_num_drafts)),
               per_pos.c_str());
  engine->shutdown(std::chrono::milliseconds(0));
  return res;
}

moeserve::cli::RegisterSubcommand reg("generate", "Generate text (or token ids) from a prompt", [](CLI::App* sub) {
  auto a = std::make_shared<Args>();
  sub->option_defaults()->group("Input");
  sub->add_option("--model", a->model, "checkpoint directory")->required();
  auto* p_text = sub->add_option("--prompt", a->prompt, "prompt text (tokenized with the model's tokenizer); prints text");
  auto* p_msgs = sub->add_option("--messages", a->messages,
                                 "JSON file: a list of chat messages (or {messages, tools}) rendered with the chat "
                                 "template; prints text");
  auto* p_ids = sub->add_option("--prompt-ids", a->prompt_ids, "comma-separated prompt token ids; prints token ids");
  p_text->excludes(p_msgs)->excludes(p_ids);
  p_msgs->excludes(p_ids);
  sub->add_option("--chat-template", a->chat_template, "with --messages: a template file or text instead of the model's");
  sub->add_option("--max-tokens", a->max_tokens, "tokens to generate")->capture_default_str();
  sub->option_defaults()->group("Sampling");
  sub->add_option("--temperature", a->temperature, "0 = greedy (ties to the lowest id)")->capture_default_str();
  sub->add_option("--seed", a->seed, "sampling seed")->capture_default_str();
  sub->option_defaults()->group("Output");
  sub->add_option("--dump-logits", a->dump_logits,
                  "write float32 .npy [N, vocab]: row k = raw model logits (before temperature) that token k was "
                  "sampled from");
  sub->add_flag("--json", a->json, "print {prompt_ids, generated_ids} (and text) as JSON on stdout");
  sub->option_defaults()->group("Engine");
  sub->add_option("--device", a->device, "cpu or cuda (CUDA builds)")->capture_default_str();
  sub->add_option("--block-size", a->block_size, "KV cache block size")->capture_default_str();
  sub->add_option("--kv-cache-dtype", a->kv_cache_dtype,
                  "auto (the activation dtype) | fp8 | fp8_e4m3 (e4m3 K/V, the checkpoint's k_scale / v_scale or 1.0)")
      ->capture_default_str();
  sub->add_option("--prefill-chunk", a->prefill_chunk, "chunked prefill size (0 = whole prompt)");
  sub->add_flag("--enforce-eager", a->enforce_eager, "run decode steps eagerly (no CUDA graphs)");
  sub->add_option("--speculative-config", a->speculative_config,
                  "speculative decoding as serve's flag (vLLM JSON: ngram, eagle3, mtp); runs through the engine");
  moeserve::cli::add_parallel_flags(sub, a->par);
  return [a, p_text, p_msgs, p_ids] {
    // Given (even empty) decides the mode: `--prompt-ids ""` is an empty id list (refused by parse_ids).
    const bool text = p_text->count() > 0 || p_msgs->count() > 0;
    MS_CHECK(text || p_ids->count() > 0, "give a prompt: --prompt TEXT, --messages FILE or --prompt-ids IDS");
    MS_CHECK(p_msgs->count() == 0 || !a->messages.empty(), "--messages: give a JSON file");
    MS_CHECK(a->chat_template.empty() || !a->messages.empty(), "--chat-template applies to --messages only");
    std::unique_ptr<moeserve::Backend> backend;
    if (a->par.parallel()) {
      // Ranks make their own backends (one per GPU, on their threads).
    } else if (a->device == "cpu") {
      backend = moeserve::make_cpu_backend();
#ifdef MOESERVE_WITH_CUDA
    } else if (a->device == "cuda") {
      backend = moeserve::make_backend("cuda", 0);
#endif
    } else {
      moeserve::fail("--device {}: not available in this build (cpu{})", a->device,
#ifdef MOESERVE_WITH_CUDA
                     ", cuda"
#else
                     ""
#endif
      );
    }
    {  // a hub repo id resolves through the hub cache (downloaded when missing, as serve does)
      moeserve::cli::ModelSource src;
      src.tokenizer = text;
      a->model = moeserve::cli::resolve_model_path(a->model, src);
    }
    // Validate every argument before the (slow) model load.
    moeserve::GenerateOptions g;
    std::unique_ptr<moeserve::server::TokenizerFrontend> fe;
    if (text) {
      fe = std::make_unique<moeserve::server::TokenizerFrontend>(a->model, a->chat_template);
      g.prompt_ids = text_prompt_ids(*a, *fe);
      MS_CHECK(!g.prompt_ids.empty(), "the prompt encodes to no tokens");
    } else {
      g.prompt_ids = parse_ids(a->prompt_ids);
    }
    MS_CHECK(a->max_tokens >= 1, "--max-tokens must be >= 1, got {}", a->max_tokens);
    MS_CHECK(std::isfinite(a->temperature) && a->temperature >= 0, "--temperature must be a finite number >= 0");
    MS_CHECK(a->block_size >= 1 && a->block_size <= 4096, "--block-size must be in [1, 4096], got {}", a->block_size);
    MS_CHECK(a->prefill_chunk >= 0, "--prefill-chunk must be >= 0, got {}", a->prefill_chunk);
    {
      const auto cfg = moeserve::load_model_config(a->model).config->desc();
      for (int32_t t : g.prompt_ids)
        MS_CHECK(t < cfg.vocab_size, "prompt token id {} is out of range [0, {}) (config vocab_size)", t,
                 cfg.vocab_size);
      const int64_t total = int64_t(g.prompt_ids.size()) + a->max_tokens;
      MS_CHECK(total <= cfg.max_position_embeddings,
               "prompt ({} tokens) + --max-tokens {} = {} exceeds max_position_embeddings {}", g.prompt_ids.size(),
               a->max_tokens, total, cfg.max_position_embeddings);
    }
    if (!a->dump_logits.empty()) {
      // Fail now, not after generating, if the file cannot be written.
      std::FILE* f = std::fopen(a->dump_logits.c_str(), "wb");
      MS_CHECK(f, "--dump-logits: cannot write {}: {}", a->dump_logits, std::strerror(errno));
      std::fclose(f);
    }
    g.max_tokens = a->max_tokens;
    g.temperature = a->temperature;
    g.seed = a->seed;
    g.keep_logits = !a->dump_logits.empty();
    g.prefill_chunk = a->prefill_chunk;
    moeserve::SpecConfig spec;
    if (!a->speculative_config.empty()) {
      spec = moeserve::parse_speculative_config(a->speculative_config,
                                                moeserve::SpecParseContext{.tensor_parallel_size = a->par.tensor_parallel});
      MS_CHECK(a->dump_logits.empty(), "--dump-logits with --speculative-config: the engine keeps no logits");
    }
    moeserve::ExecutorOptions eo;
    eo.speculative = spec;
    eo.model_dir = a->model;
    eo.block_size = a->block_size;
    eo.kv_cache_dtype = a->kv_cache_dtype;
    // A KV pool just large enough for this one sequence.
    const int total = int(g.prompt_ids.size()) + a->max_tokens;
    eo.num_kv_blocks = std::max(1, (total + a->block_size - 1) / std::max(1, a->block_size));
    eo.max_num_seqs = 1;  // one sequence: a single decode graph (CUDA)
    eo.max_num_batched_tokens = a->prefill_chunk > 0 ? a->prefill_chunk : int(g.prompt_ids.size());
    eo.enforce_eager = a->enforce_eager;
    std::unique_ptr<moeserve::ModelExecutor> exec;
    if (a->par.parallel())
      exec = moeserve::cli::make_parallel_executor(a->par, eo, a->device);
    else
      exec = std::make_unique<moeserve::RankExecutor>(std::move(backend), eo);
    moeserve::GenerateResult res;
    if (spec.enabled()) res = generate_in_engine(std::move(exec), g, spec);
    else res = moeserve::generate(*exec, g);
    if (!a->dump_logits.empty())
      moeserve::write_npy_f32(a->dump_logits, res.logits.data(), int64_t(res.generated_ids.size()), res.vocab_size);
    std::string out_text;
    if (text) {
      // Up to the first end-of-sequence token (the loop runs --max-tokens; the ids show all).
      std::vector<int32_t> eos = moeserve::read_eos_token_ids(a->model);
      for (int32_t id : fe->eos_token_ids()) eos.push_back(id);
      std::vector<int32_t> shown;
      for (int32_t t : res.generated_ids) {
        if (std::find(eos.begin(), eos.end(), t) != eos.end()) break;
        shown.push_back(t);
      }
      out_text = fe->decode(shown, /*skip_special_tokens=*/true);
    }
    if (a->json) {
      nlohmann::ordered_json j = {{"prompt_ids", g.prompt_ids}, {"generated_ids", res.generated_ids}};
      if (text) j["text"] = out_text;
      std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else if (text) {
      std::printf("%s\n", out_text.c_str());
    } else {
      std::string s;
      for (size_t i = 0; i < res.generated_ids.size(); ++i) s += (i ? "," : "") + std::to_string(res.generated_ids[i]);
      std::printf("%s\n", s.c_str());
    }
    return 0;
  };
});
}  // namespace
