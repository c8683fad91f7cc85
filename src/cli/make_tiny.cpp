// `moeserve make-tiny DIR`: a deterministic seeded tiny MiniMax-M2 checkpoint (hub layout).
#include <cstdio>

#include "cli/registry.h"
#include "tools/tiny.h"

namespace {
struct Args {
  std::string dir;
  moeserve::TinyModelOptions o;
};

moeserve::cli::RegisterSubcommand reg(
    "make-tiny", "Write a deterministic tiny MiniMax-M2 checkpoint with random weights (for tests; it does not speak: scripts/run.sh serves the trained demo model)", [](CLI::App* sub) {
      auto a = std::make_shared<Args>();
      auto& o = a->o;
      sub->add_option("dir", a->dir, "output directory")->required();
      sub->option_defaults()->group("Weights");
      sub->add_option("--seed", o.seed, "random seed")->capture_default_str();
      sub->add_flag("--fp8", o.fp8, "FP8 e4m3 block-scaled linear weights");
      sub->add_option("--block-size", o.block_size, "FP8 weight block size (square)")->capture_default_str();
      sub->option_defaults()->group("Shapes");
      sub->add_option("--hidden-size", o.hidden_size)->capture_default_str();
      sub->add_option("--num-layers", o.num_layers)->capture_default_str();
      sub->add_option("--num-heads", o.num_heads)->capture_default_str();
      sub->add_option("--num-kv-heads", o.num_kv_heads)->capture_default_str();
      sub->add_option("--head-dim", o.head_dim)->capture_default_str();
      sub->add_option("--rotary-dim", o.rotary_dim)->capture_default_str();
      sub->add_option("--intermediate-size", o.intermediate_size, "per-expert intermediate size")->capture_default_str();
      sub->add_option("--num-experts", o.num_experts)->capture_default_str();
      sub->add_option("--top-k", o.top_k, "experts per token")->capture_default_str();
      sub->add_option("--vocab-size", o.vocab_size)->capture_default_str();
      sub->add_option("--max-model-len", o.max_position_embeddings, "max_position_embeddings")->capture_default_str();
      sub->add_option("--num-mtp-modules", o.num_mtp_modules, "declared in config.json only")->capture_default_str();
      sub->option_defaults()->group("Tokenizer");
      sub->add_option("--bos-token-id", o.bos_token_id)->capture_default_str();
      sub->add_option("--eos-token-id", o.eos_token_id)->capture_default_str();
      sub->add_flag("!--no-tokenizer", o.with_tokenizer, "do not write the built-in tokenizer");
      return [a] {
        moeserve::write_tiny_checkpoint(a->dir, a->o);
        std::fprintf(stderr, "wrote tiny minimax_m2 checkpoint to %s\n", a->dir.c_str());
        return 0;
      };
    });
}  // namespace
