// Deterministic tiny MiniMax-M2 checkpoints in the hub layout (config.json,
// generation_config.json, sharded safetensors + model.safetensors.index.json), for tests
// and demos. Weights are seeded normal draws scaled by 1/sqrt(fan_in) so activations stay
// O(1) and logits are well-conditioned; norms are 1 + 0.1 N(0,1); the router bias is small
// and random so selection differs from the unbiased scores.
#pragma once
#include <cstdint>
#include <string>

#include "model/arch/minimax_m2.h"

namespace moeserve {

struct TinyModelOptions {
  uint64_t seed = 0;
  int hidden_size = 256;
  int num_layers = 2;
  int num_heads = 4;
  int num_kv_heads = 2;
  int head_dim = 64;
  int rotary_dim = 32;
  int intermediate_size = 128;
  int num_experts = 8;
  int top_k = 2;
  int vocab_size = 4096;  // the tokenizer helper may size this to its vocabulary
  int max_position_embeddings = 4096;
  bool fp8 = false;
  int block_size = 128;    // FP8 weight block (square)
  int num_mtp_modules = 0; // declared in config.json only (no MTP tensors written)
  // Ids of the built-in tokenizer (assets/tiny-tokenizer): ]~!b[ = 2004, [e~[ = 2002.
  int bos_token_id = 2004, eos_token_id = 2002;
  // Also write the built-in byte-level BPE tokenizer (tokenizer.json, tokenizer_config.json
  // with the MiniMax-M2 chat template), so the checkpoint can be served with text.
  bool with_tokenizer = true;
  size_t max_shard_bytes = 4u << 20;
};

MiniMaxM2Config tiny_config(const TinyModelOptions& o);
// Writes the checkpoint into `dir` (created if needed).
void write_tiny_checkpoint(const std::string& dir, const TinyModelOptions& o);

}  // namespace moeserve
