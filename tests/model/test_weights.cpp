// Weight loader: declarations checked against checkpoints (missing, shape, dtype, FP8
// scales) and TP/EP slicing, including FP8 slices that start inside a scale block.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/arch/minimax_m2.h"
#include "model/weights.h"

#include "load_error.h"

using namespace moeserve;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("moeserve_weights_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

Tensor random_f32(Shape s, uint32_t seed) {
  Tensor t = Tensor::host(DType::F32, s);
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = d(g);
  return t;
}

// FP8 weight + [ceil(r/bo), ceil(c/bi)] scales with distinct per-block magnitudes.
std::pair<Tensor, Tensor> random_fp8(int64_t rows, int64_t cols, int bo, int bi, uint32_t seed) {
  Tensor w = Tensor::host(DType::F8_E4M3, {rows, cols});
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-400.f, 400.f);
  for (int64_t i = 0; i < w.numel(); ++i) w.ptr<uint8_t>()[i] = f32_to_fp8_e4m3(d(g));
  const int64_t sr = (rows + bo - 1) / bo, sc = (cols + bi - 1) / bi;
  Tensor s = Tensor::host(DType::F32, {sr, sc});
  for (int64_t i = 0; i < s.numel(); ++i) s.ptr<float>()[i] = 0.001f * float(i + 1) + 0.0001f * float(seed % 7);
  return {w, s};
}

std::vector<float> dequant(const LoadedTensor& t) {
  const int64_t r = t.tensor.dim(0), c = t.tensor.dim(1);
  std::vector<float> out(size_t(r * c));
  if (t.tensor.dtype != DType::F8_E4M3) {
    convert_to_f32(t.tensor.dtype, t.tensor.data, out.data(), out.size());
    return out;
  }
  const int64_t sc = t.scale_inv.dim(1);
  EXPECT_EQ(t.scale_inv.dim(0), (r + t.block_out - 1) / t.block_out);
  EXPECT_EQ(sc, (c + t.block_in - 1) / t.block_in);
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j)
      out[i * c + j] = fp8_e4m3_to_f32(t.tensor.ptr<uint8_t>()[i * c + j]) *
                       t.scale_inv.ptr<float>()[(i / t.block_out) * sc + j / t.block_in];
  return out;
}

QuantizationConfig fp8_quant(int bo, int bi) {
  QuantizationConfig q;
  q.quant_method = "fp8";
  q.fmt = "float8_e4m3fn";
  q.block_out = bo;
  q.block_in = bi;
  return q;
}

const std::vector<DType> kLin{DType::BF16, DType::F32, DType::F8_E4M3};

}  // namespace

TEST(WeightLoader, MissingWrongShapeWrongDtype) {
  TempDir d;
  write_safetensors((d.path / "model.safetensors").string(),
                    {{"a.weight", random_f32({4, 6}, 1)}, {"n.weight", Tensor::host(DType::I32, {6})}});
  Checkpoint ck = Checkpoint::open(d.path.string());
  QuantizationConfig none;
  EXPECT_NO_THROW(load_weight(ck, {"a.weight", {4, 6}, kLin, {}}, none));
  std::string e = load_error(ck, {"b.weight", {4, 6}, kLin, {}}, none);
  EXPECT_NE(e.find("missing tensor 'b.weight'"), std::string::npos) << e;
  e = load_error(ck, {"a.weight", {6, 4}, kLin, {}}, none);
  EXPECT_NE(e.find("'a.weight': shape [4, 6]"), std::string::npos) << e;
  EXPECT_NE(e.find("expected [6, 4]"), std::string::npos) << e;
  e = load_error(ck, {"n.weight", {6}, {DType::BF16, DType::F32}, {}}, none);
  EXPECT_NE(e.find("'n.weight': dtype I32"), std::string::npos) << e;
}

TEST(WeightLoader, Fp8ScaleChecks) {
  TempDir d;
  auto [w, s] = random_fp8(200, 130, 128, 128, 3);  // scales [2, 2] (ceil-divided)
  Tensor bad_scale = Tensor::host(DType::F32, {1, 2});
  write_safetensors((d.path / "model.safetensors").string(),
                    {{"ok.weight", w},
                     {"ok.weight_scale_inv", s},
                     {"noscale.weight", w},
                     {"bad.weight", w},
                     {"bad.weight_scale_inv", bad_scale}});
  Checkpoint ck = Checkpoint::open(d.path.string());
  auto q = fp8_quant(128, 128);
  LoadedTensor lt = load_weight(ck, {"ok.weight", {200, 130}, kLin, {}}, q);
  EXPECT_EQ(lt.scale_inv.shape, (Shape{2, 2}));
  EXPECT_EQ(lt.block_out, 128);
  std::string e = load_error(ck, {"bad.weight", {200, 130}, kLin, {}}, q);
  EXPECT_NE(e.find("'bad.weight_scale_inv': scale shape [1, 2], expected [2, 2]"), std::string::npos) << e;
  e = load_error(ck, {"noscale.weight", {200, 130}, kLin, {}}, q);
  EXPECT_NE(e.find("no scale tensor 'noscale.weight_scale_inv'"), std::string::npos) << e;
  e = load_error(ck, {"ok.weight", {200, 130}, kLin, {}}, QuantizationConfig{});
  EXPECT_NE(e.find("no quantization_config"), std::string::npos) << e;
  // A scale shape that is right for another block size is wrong for this one.
  e = load_error(ck, {"ok.weight", {200, 130}, kLin, {}}, fp8_quant(64, 128));
  EXPECT_NE(e.find("expected [4, 2]"), std::string::npos) << e;
  // FP8 where only dense dtypes are accepted (e.g. a norm or the router).
  e = load_error(ck, {"ok.weight", {200, 130}, {DType::F32, DType::BF16}, {}}, q);
  EXPECT_NE(e.find("dtype F8_E4M3"), std::string::npos) << e;
}

// Every TP slice of an FP8 weight, dequantised with its local scales and block sizes, must
// equal the same slice of the fully dequantised weight, bit for bit, including slices
// that start inside a checkpoint block (rows 160.. of blocks of 128) and partial edge blocks.
TEST(WeightLoader, Fp8TensorParallelSlicesWithPartialBlocks) {
  struct Case {
    int64_t rows, cols;
    int bo, bi, world, replicate;
    ShardKind kind;
  };
  const Case cases[] = {
      {320, 200, 128, 128, 2, 1, ShardKind::ColumnParallel},  // rank 1 starts at row 160
      {320, 200, 128, 128, 2, 1, ShardKind::RowParallel},     // rank 1 starts at col 100
      {384, 96, 128, 64, 3, 1, ShardKind::ColumnParallel},    // 128-row slices, aligned
      {96, 384, 64, 128, 4, 1, ShardKind::RowParallel},       // 96-col slices: offsets 96, 192, 288
      {160, 192, 128, 128, 4, 2, ShardKind::ColumnParallel},  // 2 distinct slices, each on 2 ranks
      {200, 130, 48, 40, 5, 1, ShardKind::ColumnParallel},    // odd block sizes, 40-row slices
  };
  for (const auto& c : cases) {
    auto [w, s] = random_fp8(c.rows, c.cols, c.bo, c.bi, uint32_t(c.rows + c.cols));
    LoadedTensor full{w, s, c.bo, c.bi};
    const auto ref = dequant(full);
    for (int r = 0; r < c.world; ++r) {
      ShardSpec spec{c.kind, r, c.world, c.replicate};
      LoadedTensor lt = slice_weight("w", w, s, c.bo, c.bi, spec);
      const int groups = c.world / c.replicate, slice = r / c.replicate;
      const auto got = dequant(lt);
      const int64_t lr = lt.tensor.dim(0), lc = lt.tensor.dim(1);
      if (c.kind == ShardKind::ColumnParallel) {
        ASSERT_EQ(lr, c.rows / groups);
        ASSERT_EQ(lc, c.cols);
      } else {
        ASSERT_EQ(lr, c.rows);
        ASSERT_EQ(lc, c.cols / groups);
      }
      const int64_t r0 = c.kind == ShardKind::ColumnParallel ? slice * lr : 0;
      const int64_t c0 = c.kind == ShardKind::RowParallel ? slice * lc : 0;
      for (int64_t i = 0; i < lr; ++i)
        for (int64_t j = 0; j < lc; ++j)
          ASSERT_EQ(got[i * lc + j], ref[(r0 + i) * c.cols + c0 + j])
              << "case " << c.rows << "x" << c.cols << " rank " << r << " at " << i << "," << j;
    }
  }
  // A split that does not divide names the tensor.
  auto [w, s] = random_fp8(10, 8, 4, 4, 9);
  EXPECT_THROW(slice_weight("w10", w, s, 4, 4, ShardSpec{ShardKind::ColumnParallel, 0, 3}), Error);
}

TEST(WeightLoader, DenseSlicesAndExpertOwnership) {
  TempDir d;
  Tensor a = random_f32({6, 4}, 5);
  write_safetensors((d.path / "model.safetensors").string(), {{"a.weight", a}});
  Checkpoint ck = Checkpoint::open(d.path.string());
  auto col = load_weight(ck, {"a.weight", {6, 4}, kLin, {ShardKind::ColumnParallel, 1, 3}}, {});
  ASSERT_EQ(col.tensor.shape, (Shape{2, 4}));
  EXPECT_EQ(col.tensor.ptr<float>()[0], a.ptr<float>()[2 * 4]);
  auto row = load_weight(ck, {"a.weight", {6, 4}, kLin, {ShardKind::RowParallel, 1, 2}}, {});
  ASSERT_EQ(row.tensor.shape, (Shape{6, 2}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(row.tensor.ptr<float>()[i * 2 + 1], a.ptr<float>()[i * 4 + 3]);
  ShardSpec other{ShardKind::ExpertOwned, 0, 2};
  other.owned = false;
  EXPECT_FALSE(load_weight(ck, {"a.weight", {6, 4}, kLin, other}, {}).tensor.defined());
  // Not owned, but still validated.
  EXPECT_THROW(load_weight(ck, {"a.weight", {6, 5}, kLin, other}, {}), Error);
}

TEST(WeightLoader, MtpNamesAndDeclarations) {
  MiniMaxM2Config c = MiniMaxM2Config::from_json({{"model_type", "minimax_m2"},
                                                  {"hidden_size", 64},
                                                  {"num_hidden_layers", 2},
                                                  {"num_attention_heads", 4},
                                                  {"num_key_value_heads", 2},
                                                  {"head_dim", 16},
                                                  {"intermediate_size", 32},
                                                  {"num_local_experts", 4},
                                                  {"num_experts_per_tok", 2},
                                                  {"vocab_size", 100},
                                                  {"num_mtp_modules", 2}});
  EXPECT_FALSE(is_mtp_tensor(c, "model.layers.1.input_layernorm.weight"));
  EXPECT_TRUE(is_mtp_tensor(c, "model.layers.2.eh_proj.weight"));
  EXPECT_TRUE(is_mtp_tensor(c, "model.layers.3.self_attn.q_proj.weight"));
  EXPECT_FALSE(is_mtp_tensor(c, "model.layers.4.enorm.weight"));
  EXPECT_FALSE(is_mtp_tensor(c, "model.norm.weight"));
  EXPECT_FALSE(is_mtp_tensor(c, "model.layers.99999999999999999999999.x"));
  EXPECT_FALSE(is_mtp_tensor(c, "model.layers.2"));
  auto decls = declare_minimax_m2_weights(c, ParallelConfig{});
  // embed + norm + lm_head + 2 layers x (2 norms + 4 proj + 2 qk norms + gate + bias + 4 experts x 3)
  EXPECT_EQ(decls.size(), 3u + 2u * (2 + 4 + 2 + 2 + 12));
  // EP=2: rank 1 owns experts 2 and 3 of each layer.
  auto ep = declare_minimax_m2_weights(c, ParallelConfig{1, 2, true});
  for (const auto& d : ep)
    if (d.name.find(".experts.") != std::string::npos) {
      const bool high = d.name.find(".experts.2.") != std::string::npos || d.name.find(".experts.3.") != std::string::npos;
      EXPECT_EQ(d.shard.owned, high) << d.name;
    }
  // TP=4 with 2 KV heads: each KV head is replicated on 2 ranks.
  auto sh = plan_shard(c, ParallelConfig{3, 4, false});
  EXPECT_EQ(sh.q_heads, 1);
  EXPECT_EQ(sh.kv_heads, 1);
  EXPECT_EQ(sh.kv_replicate, 2);
  EXPECT_EQ(sh.expert_inter, 8);
  EXPECT_THROW(plan_shard(c, ParallelConfig{0, 3, false}), Error);  // 4 heads over 3 ranks
}

// A whole tiny checkpoint with extra tensors: an MTP module is recognised and skipped, an
// unknown tensor is reported by inspect and ignored by the loader; misshaped tensors are
// reported by inspect and fail the load naming the tensor.
#include "backend/cpu/cpu_backend.h"
#include "tools/inspect.h"
#include "tools/tiny.h"

namespace {
void add_to_index(const fs::path& dir, const std::string& file, const std::vector<NamedTensor>& tensors) {
  write_safetensors((dir / file).string(), tensors);
  const fs::path idx = dir / "model.safetensors.index.json";
  std::ifstream in(idx);
  auto j = nlohmann::json::parse(in);
  in.close();
  for (const auto& t : tensors) j["weight_map"][t.name] = file;
  std::ofstream(idx) << j.dump(2);
}

TinyModelOptions small_tiny() {
  TinyModelOptions o;
  o.hidden_size = 64;
  o.head_dim = 16;
  o.rotary_dim = 8;
  o.intermediate_size = 32;
  o.num_experts = 4;
  o.vocab_size = 128;
  o.with_tokenizer = false;  // 128 ids: smaller than the built-in tokenizer
  o.num_mtp_modules = 1;
  o.fp8 = true;
  o.block_size = 32;
  return o;
}
}  // namespace

TEST(WeightLoader, WholeCheckpointExtraAndMisshapedTensors) {
  TempDir d;
  write_tiny_checkpoint(d.path.string(), small_tiny());
  add_to_index(d.path, "extra.safetensors",
               {{"model.layers.2.eh_proj.weight", random_f32({64, 128}, 1)},
                {"model.layers.2.enorm.weight", random_f32({64}, 2)},
                {"model.layers.3.enorm.weight", random_f32({64}, 3)},  // beyond num_mtp_modules
                {"model.vision_tower.weight", random_f32({4}, 4)}});
  auto r = inspect_checkpoint(d.path.string());
  EXPECT_TRUE(r["complete"].get<bool>());
  EXPECT_EQ(r["mtp"]["present_modules"], 1);
  EXPECT_EQ(r["mtp"]["present_tensors"], 2);
  EXPECT_EQ(r["unexpected_tensors"], (nlohmann::json{"model.layers.3.enorm.weight", "model.vision_tower.weight"}));
  auto backend = make_cpu_backend();
  const auto cfg = MiniMaxM2Config::from_file((d.path / "config.json").string());
  {
    MiniMaxM2Model m(cfg, *backend, ParallelConfig{});
    EXPECT_NO_THROW(m.load(Checkpoint::open(d.path.string())));
    EXPECT_EQ(m.weights().layers.size(), 2u);
    EXPECT_TRUE(m.weights().layers[0].q.fp8());
    EXPECT_EQ(m.weights().layers[0].q.scale_inv.shape, (Shape{2, 2}));
  }
  // config.json now disagrees with the embedding and lm_head shapes.
  auto j = cfg.to_json();
  j["vocab_size"] = 130;
  std::ofstream(d.path / "config.json") << j.dump(2);
  r = inspect_checkpoint(d.path.string());
  EXPECT_FALSE(r["complete"].get<bool>());
  ASSERT_EQ(r["mismatched_tensors"].size(), 2u);
  EXPECT_EQ(r["mismatched_tensors"][0]["name"], "lm_head.weight");
  MiniMaxM2Model m(MiniMaxM2Config::from_json(j), *backend, ParallelConfig{});
  try {
    m.load(Checkpoint::open(d.path.string()));
    FAIL() << "load should fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'model.embed_tokens.weight': shape [128, 64]"), std::string::npos)
        << e.what();
  }
}
