// compressed-tensors pack-quantized INT4 weights (model/int4.h): the nibble layout against
// compressed-tensors' pack_to_int32 (worked by hand below), the quantization_config parser and
// its refusals, targets / ignore matching, exact dequantisation and TP slicing of small
// checkpoints written here, malformed checkpoints refused naming the tensor, the group-cutting
// split refusal, and a backend without W4A16 kernels refusing the dsv3_tiny_int4 fixture at
// load, and Kimi-K2.5's wrapped layout picking only the routed experts. (The fixture's logits
// against HF and TP/EP = TP1 are in test_golden / test_parallel.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "model/int4.h"
#include "model/registry.h"
#include "golden_fixture.h"
#include "load_error.h"

using namespace moeserve;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("moeserve_int4_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// Kimi-K2's quantization_config (the fields moeserve reads).
json kimi_quant() {
  return json::parse(R"({
    "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
    "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null, "output_activations": null,
      "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 32,
                  "dynamic": false, "observer": "minmax", "actorder": null, "block_structure": null}}},
    "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
    "kv_cache_scheme": null})");
}

std::string parse_error(const json& q) {
  try {
    config_json::parse_quantization(q);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

const std::vector<DType> kLin{DType::BF16, DType::F16, DType::F32, DType::F8_E4M3};

Tensor host_i32(const std::vector<int32_t>& v, Shape s) {
  Tensor t = Tensor::host(DType::I32, std::move(s));
  std::memcpy(t.data, v.data(), v.size() * 4);
  return t;
}

// A bf16 value exactly representable: sign * m * 2^e with a 7-bit mantissa.
uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return uint16_t(u >> 16);  // f is chosen with a zero low half
}

// One INT4 module `m` with q[r][c] = ((r * 7 + c * 3) % 16) - 8 and scale[r][g] = (r + 1) * 2^-(g + 3):
// writes weight_packed / weight_scale / weight_shape (optionally broken) to dir/model.safetensors.
struct Int4Module {
  int64_t out, in;
  int group;
  std::vector<int8_t> q;
  std::vector<float> scale;
  Int4Module(int64_t o, int64_t i, int g) : out(o), in(i), group(g) {
    for (int64_t r = 0; r < out; ++r)
      for (int64_t c = 0; c < in; ++c) q.push_back(int8_t((r * 7 + c * 3) % 16 - 8));
    for (int64_t r = 0; r < out; ++r)
      for (int64_t k = 0; k < in / group; ++k) scale.push_back(float(r + 1) * std::ldexp(1.f, -int(k) - 3));
  }
  float w(int64_t r, int64_t c) const { return float(q[size_t(r * in + c)]) * scale[size_t(r * (in / group) + c / group)]; }
  std::vector<NamedTensor> tensors(const std::string& m) const {
    Tensor s = Tensor::host(DType::BF16, {out, in / group});
    for (size_t k = 0; k < scale.size(); ++k) s.ptr<uint16_t>()[k] = bf16_bits(scale[k]);
    return {{m + ".weight_packed", host_i32(pack_int4(q.data(), out, in), {out, (in + 7) / 8})},
            {m + ".weight_scale", s},
            {m + ".weight_shape", host_i32({int32_t(out), int32_t(in)}, {2})}};
  }
};

QuantizationConfig quant(int group) {
  json q = kimi_quant();
  q["config_groups"]["group_0"]["weights"]["group_size"] = group;
  return config_json::parse_quantization(q);
}

const char* kExpert = "model.layers.1.mlp.experts.3.down_proj";

TEST(Int4Pack, NibbleOrderMatchesCompressedTensors) {
  // pack_to_int32: value + 8 as an unsigned nibble, element i of each group of 8 in bits
  // [4i, 4i+3] (reshape to [rows, cols/8, 8], shift by 4 * arange(8), sum).
  const std::vector<int8_t> a{-8, -7, -6, -5, -4, -3, -2, -1}, b{0, 1, 2, 3, 4, 5, 6, 7};
  EXPECT_EQ(pack_int4(a.data(), 1, 8)[0], 0x76543210);
  EXPECT_EQ(uint32_t(pack_int4(b.data(), 1, 8)[0]), 0xFEDCBA98u);  // negative as int32
  // 10 columns: 2 words a row, the padding nibbles are 0 (value -8 unpacked, never read).
  std::vector<int8_t> q(20);
  for (int i = 0; i < 20; ++i) q[size_t(i)] = int8_t(i % 16 - 8);
  const std::vector<int32_t> w = pack_int4(q.data(), 2, 10);
  ASSERT_EQ(w.size(), 4u);
  EXPECT_EQ(w[1], 0x98);  // row 0, columns 8, 9: q 0, 1 -> nibbles 8, 9
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 10; ++c) EXPECT_EQ(int4_value(w.data(), 2, r, c), q[size_t(r * 10 + c)]) << r << "," << c;
  const int8_t bad = 8;
  EXPECT_THROW(pack_int4(&bad, 1, 1), Error);
}

TEST(Int4Config, ParsesKimiConfigAndMatchesModules) {
  const QuantizationConfig q = config_json::parse_quantization(kimi_quant());
  EXPECT_TRUE(q.int4());
  EXPECT_FALSE(q.fp8());
  ASSERT_EQ(q.int4_groups.size(), 1u);
  EXPECT_EQ(q.int4_groups[0].group_size, 32);
  EXPECT_EQ(q.ignore.size(), 4u);
  EXPECT_EQ(int4_group(q, "model.layers.3.mlp.experts.17.gate_proj", true), 32);
  EXPECT_EQ(int4_group(q, "language_model.model.layers.3.mlp.experts.17.down_proj", true), 32);
  EXPECT_EQ(int4_group(q, "model.layers.3.mlp.shared_experts.up_proj", true), 0);
  EXPECT_EQ(int4_group(q, "model.layers.0.mlp.gate_proj", true), 0);       // dense MLP
  EXPECT_EQ(int4_group(q, "model.layers.0.self_attn.kv_b_proj", true), 0);  // attention
  EXPECT_EQ(int4_group(q, "lm_head", true), 0);
  EXPECT_EQ(int4_group(q, "language_model.lm_head", true), 0);  // plain names match a dotted suffix
  EXPECT_EQ(int4_group(q, "model.layers.3.mlp.experts.17.gate_proj", false), 0);  // not nn.Linear
  // Declarations: the router (not FP8-capable, so not a Linear) never is, whatever the targets.
  json all = kimi_quant();
  all["ignore"] = json::array();
  all["config_groups"]["group_0"]["targets"] = {"re:.*mlp.*"};
  const QuantizationConfig qa = config_json::parse_quantization(all);
  EXPECT_EQ(int4_group(qa, WeightDecl{"model.layers.1.mlp.gate.weight", {8, 128}, {DType::BF16, DType::F32}, {}}), 0);
  EXPECT_EQ(int4_group(qa, WeightDecl{"model.layers.1.mlp.experts.0.up_proj.weight", {64, 128}, kLin, {}}), 32);
  EXPECT_EQ(int4_group(qa, WeightDecl{"model.layers.1.self_attn.o_proj.weight", {64, 128}, kLin, {}}), 0);
  // re: is anchored at the start (re.match), exact names and several groups.
  json two = kimi_quant();
  two["ignore"] = {"model.layers.1.mlp.experts.0.up_proj"};
  two["config_groups"]["group_0"]["targets"] = {"re:model\\.layers\\.1\\."};
  two["config_groups"]["group_1"] = two["config_groups"]["group_0"];
  two["config_groups"]["group_1"]["targets"] = {"model.layers.2.mlp.experts.0.up_proj"};
  two["config_groups"]["group_1"]["weights"]["group_size"] = 64;
  const QuantizationConfig qt = config_json::parse_quantization(two);
  EXPECT_EQ(int4_group(qt, "model.layers.1.mlp.experts.1.up_proj", true), 32);
  EXPECT_EQ(int4_group(qt, "model.layers.1.mlp.experts.0.up_proj", true), 0);  // ignored by name
  EXPECT_EQ(int4_group(qt, "xmodel.layers.1.mlp.experts.1.up_proj", true), 0);  // not at the start
  EXPECT_EQ(int4_group(qt, "model.layers.2.mlp.experts.0.up_proj", true), 64);
  EXPECT_EQ(int4_group(qt, "model.layers.2.mlp.experts.1.up_proj", true), 0);
  // to_json writes the block back as read.
  EXPECT_EQ(config_json::quantization_to_json(q), kimi_quant());
}

TEST(Int4Config, RefusesUnsupportedSchemesNamingTheField) {
  auto with = [](const char* key, json v) {
    json q = kimi_quant();
    q["config_groups"]["group_0"]["weights"][key] = std::move(v);
    return parse_error(q);
  };
  EXPECT_NE(with("symmetric", false).find("weights.symmetric false"), std::string::npos);
  EXPECT_NE(with("num_bits", 8).find("num_bits 8"), std::string::npos);
  EXPECT_NE(with("type", "float").find("weights.type 'float'"), std::string::npos);
  EXPECT_NE(with("strategy", "channel").find("strategy 'channel'"), std::string::npos);
  EXPECT_NE(with("actorder", "group").find("actorder"), std::string::npos);
  EXPECT_NE(with("group_size", 0).find("group_size 0"), std::string::npos);
  EXPECT_NE(with("dynamic", true).find("dynamic"), std::string::npos);
  EXPECT_EQ(with("actorder", false), "");
  json q = kimi_quant();
  q["config_groups"]["group_0"]["input_activations"] = {{"num_bits", 8}, {"type", "float"}};
  EXPECT_NE(parse_error(q).find("group_0.input_activations"), std::string::npos);
  q = kimi_quant();
  q["format"] = "float-quantized";
  EXPECT_NE(parse_error(q).find("format 'float-quantized'"), std::string::npos);
  q = kimi_quant();
  q["kv_cache_scheme"] = {{"num_bits", 8}};
  EXPECT_NE(parse_error(q).find("kv_cache_scheme"), std::string::npos);
  q = kimi_quant();
  q["ignore"] = {"re:(unclosed"};
  EXPECT_NE(parse_error(q).find("'re:(unclosed' is not a valid regex"), std::string::npos);
  q = kimi_quant();
  q["config_groups"] = json::object();
  EXPECT_NE(parse_error(q).find("config_groups"), std::string::npos);
  q = kimi_quant();
  q["quant_method"] = "awq";
  EXPECT_NE(parse_error(q).find("'awq' is not supported"), std::string::npos);
}

TEST(Int4Load, DequantisesExactlyAndSlices) {
  TempDir t;
  const Int4Module m(64, 128, 32);
  write_safetensors((t.path / "model.safetensors").string(), m.tensors(kExpert));
  const Checkpoint ck = Checkpoint::open(t.path.string());
  const QuantizationConfig q = quant(32);
  const std::string name = std::string(kExpert) + ".weight";
  const LoadedTensor full = load_weight(ck, {name, {64, 128}, kLin, {}}, q);
  ASSERT_EQ(full.tensor.dtype, DType::F32);
  ASSERT_EQ(full.tensor.shape, (Shape{64, 128}));
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t c = 0; c < 128; ++c) ASSERT_EQ(full.tensor.ptr<float>()[r * 128 + c], m.w(r, c)) << r << "," << c;
  // Column-parallel rank 1 of 2: rows 32..63; row-parallel rank 1 of 4: columns 32..63 (one group).
  const LoadedTensor col = load_weight(ck, {name, {64, 128}, kLin, {ShardKind::ColumnParallel, 1, 2}}, q);
  ASSERT_EQ(col.tensor.shape, (Shape{32, 128}));
  EXPECT_EQ(col.tensor.ptr<float>()[5 * 128 + 77], m.w(37, 77));
  const LoadedTensor row = load_weight(ck, {name, {64, 128}, kLin, {ShardKind::RowParallel, 1, 4}}, q);
  ASSERT_EQ(row.tensor.shape, (Shape{64, 32}));
  for (int64_t r = 0; r < 64; ++r)
    for (int64_t c = 0; c < 32; ++c) ASSERT_EQ(row.tensor.ptr<float>()[r * 32 + c], m.w(r, 32 + c));
  // Expert-owned elsewhere: validated, not loaded.
  ShardSpec other{ShardKind::ExpertOwned, 0, 2};
  other.owned = false;
  EXPECT_FALSE(load_weight(ck, {name, {64, 128}, kLin, other}, q).tensor.defined());
  // Row-parallel over 8 ranks: 16 inputs per rank cut the 32-input groups.
  const std::string cut = load_error(ck, {name, {64, 128}, kLin, {ShardKind::RowParallel, 0, 8}}, q);
  EXPECT_NE(cut.find(std::string(kExpert) + ".weight_packed"), std::string::npos) << cut;
  EXPECT_NE(cut.find("16 per rank, which cuts its quantisation groups of 32"), std::string::npos) << cut;
  const std::vector<WeightDecl> decls{{name, {64, 128}, kLin, {ShardKind::RowParallel, 0, 8}}};
  EXPECT_EQ(int4_split_problem(decls, q), cut);
  EXPECT_EQ(first_int4_tensor(decls, q), std::string(kExpert) + ".weight_packed");
}

// A backend with W4A16 expert kernels (Backend::int4_experts_packed) gets routed experts packed:
// the checkpoint's words and BF16 scales of this rank's slice, bit for bit, which dequantise to
// the F32 path's values; non-expert INT4 weights are still dequantised (and named for refusal).
TEST(Int4Load, PackedExpertSlicesKeepTheWordsAndScales) {
  TempDir t;
  const Int4Module m(64, 128, 32);
  write_safetensors((t.path / "model.safetensors").string(), m.tensors(kExpert));
  const Checkpoint ck = Checkpoint::open(t.path.string());
  const QuantizationConfig q = quant(32);
  const std::string name = std::string(kExpert) + ".weight";
  auto deq = [](const LoadedTensor& lt, int64_t r, int64_t c) {
    const int64_t wpr = lt.tensor.dim(1), spr = lt.scale_inv.dim(1);
    return float(int4_value(lt.tensor.ptr<int32_t>(), wpr, r, c)) *
           bf16_to_f32(static_cast<const uint16_t*>(lt.scale_inv.data)[r * spr + c / lt.block_in]);
  };
  struct Split {
    ShardSpec shard;
    int64_t r0, nr, c0, nc;
  };
  for (const Split& sp : {Split{{}, 0, 64, 0, 128}, Split{{ShardKind::ColumnParallel, 1, 2}, 32, 32, 0, 128},
                          Split{{ShardKind::RowParallel, 2, 4}, 0, 64, 64, 32}}) {
    const LoadedTensor f = load_weight(ck, {name, {64, 128}, kLin, sp.shard, 3}, q);  // dequantised
    const LoadedTensor pk = load_weight(ck, {name, {64, 128}, kLin, sp.shard, 3}, q, /*int4_packed_experts=*/true);
    ASSERT_EQ(pk.tensor.dtype, DType::I32);
    ASSERT_EQ(pk.tensor.shape, (Shape{sp.nr, sp.nc / 8}));
    ASSERT_EQ(pk.scale_inv.dtype, DType::BF16);
    ASSERT_EQ(pk.scale_inv.shape, (Shape{sp.nr, sp.nc / 32}));
    EXPECT_EQ(pk.block_out, 1);
    EXPECT_EQ(pk.block_in, 32);
    const LinearWeight lw = pk.linear();
    EXPECT_TRUE(lw.int4());
    EXPECT_EQ(lw.in_features(), sp.nc);
    EXPECT_EQ(lw.out_features(), sp.nr);
    for (int64_t r = 0; r < sp.nr; ++r)
      for (int64_t c = 0; c < sp.nc; ++c) {
        ASSERT_EQ(deq(pk, r, c), m.w(sp.r0 + r, sp.c0 + c)) << r << "," << c;
        ASSERT_EQ(deq(pk, r, c), f.tensor.ptr<float>()[r * sp.nc + c]) << r << "," << c;
      }
  }
  // Not a routed expert (WeightDecl::expert < 0): dequantised even when packing is asked for.
  EXPECT_EQ(load_weight(ck, {name, {64, 128}, kLin, {}}, q, true).tensor.dtype, DType::F32);
  const std::vector<WeightDecl> expert_only{{name, {64, 128}, kLin, {}, 0}};
  EXPECT_EQ(first_int4_tensor(expert_only, q, /*skip_experts=*/true), "");
  EXPECT_EQ(first_int4_tensor(expert_only, q), std::string(kExpert) + ".weight_packed");
}

TEST(Int4Load, MalformedCheckpointsNameTheTensor) {
  const std::string p = kExpert, name = p + ".weight";
  const Int4Module m(64, 128, 32);
  auto error_with = [&](std::vector<NamedTensor> ts, const QuantizationConfig& q, Shape decl = {64, 128}) {
    TempDir t;
    write_safetensors((t.path / "model.safetensors").string(), ts);
    return load_error(Checkpoint::open(t.path.string()), {name, decl, kLin, {}}, q);
  };
  auto without = [&](const std::string& n) {
    std::vector<NamedTensor> ts;
    for (auto& x : m.tensors(p))
      if (x.name != n) ts.push_back(x);
    return ts;
  };
  auto replaced = [&](const std::string& n, Tensor v) {
    std::vector<NamedTensor> ts = m.tensors(p);
    for (auto& x : ts)
      if (x.name == n) x.tensor = v;
    return ts;
  };
  const QuantizationConfig q = quant(32);
  EXPECT_EQ(error_with(m.tensors(p), q), "");
  std::string e = error_with(without(p + ".weight_scale"), q);
  EXPECT_NE(e.find("has no scale tensor '" + p + ".weight_scale'"), std::string::npos) << e;
  e = error_with(without(p + ".weight_packed"), q);
  EXPECT_NE(e.find("missing tensor '" + p + ".weight_packed'"), std::string::npos) << e;
  e = error_with(without(p + ".weight_shape"), q);
  EXPECT_NE(e.find("no '" + p + ".weight_shape'"), std::string::npos) << e;
  e = error_with(replaced(p + ".weight_packed", host_i32(std::vector<int32_t>(64 * 15), {64, 15})), q);
  EXPECT_NE(e.find("tensor '" + p + ".weight_packed': shape [64, 15]"), std::string::npos) << e;
  Tensor f32 = Tensor::host(DType::F32, {64, 16});
  std::memset(f32.data, 0, f32.nbytes());
  e = error_with(replaced(p + ".weight_packed", f32), q);
  EXPECT_NE(e.find("tensor '" + p + ".weight_packed': dtype F32"), std::string::npos) << e;
  Tensor s3 = Tensor::host(DType::BF16, {64, 3});
  std::memset(s3.data, 0, s3.nbytes());
  e = error_with(replaced(p + ".weight_scale", s3), q);
  EXPECT_NE(e.find("tensor '" + p + ".weight_scale': shape [64, 3]"), std::string::npos) << e;
  e = error_with(replaced(p + ".weight_shape", host_i32({64, 120}, {2})), q);
  EXPECT_NE(e.find("'" + p + ".weight_shape': [64, 120], expected the declared shape [64, 128]"), std::string::npos)
      << e;
  // A group size that does not divide the inputs (48 into 128).
  e = error_with(m.tensors(p), quant(48));
  EXPECT_NE(e.find("'" + p + ".weight_packed': group_size 48 does not divide its 128 inputs"), std::string::npos) << e;
  // The dense weight where the config says INT4.
  Tensor dense = Tensor::host(DType::BF16, {64, 128});
  std::memset(dense.data, 0, dense.nbytes());
  e = error_with({{name, dense}}, q);
  EXPECT_NE(e.find("missing tensor '" + p + ".weight_packed': module " + p + " is INT4"), std::string::npos) << e;
}

// A CPU backend that reports what a backend without W4A16 kernels would (`problem`), or
// nothing; every op forwards to the CPU reference.
class NoInt4Backend final : public Backend {
 public:
  std::string problem;
  std::string int4_weights_problem(const std::string& t) const override {
    return problem.empty() ? "" : problem + " '" + t + "'";
  }
  Device device() const override { return c_->device(); }
  std::string name() const override { return "no-int4"; }
  DType activation_dtype() const override { return c_->activation_dtype(); }
  Tensor alloc(DType t, const Shape& s) override { return c_->alloc(t, s); }
  Tensor upload(const Tensor& h) override { return c_->upload(h); }
  std::vector<float> download_f32(const Tensor& t) override { return c_->download_f32(t); }
  void copy_from_host(Tensor& d, const void* s, size_t b) override { c_->copy_from_host(d, s, b); }
  void copy_from_host_2d(Tensor& d, size_t dp, const void* s, size_t sp, size_t rb, size_t r) override {
    c_->copy_from_host_2d(d, dp, s, sp, rb, r);
  }
  void embedding(const Tensor& t, const Tensor& i, Tensor& o) override { c_->embedding(t, i, o); }
  void rms_norm(const Tensor& x, const Tensor& w, float e, Tensor& o) override { c_->rms_norm(x, w, e, o); }
  void add_rms_norm(Tensor& r, const Tensor& x, const Tensor& w, float e, Tensor& o) override {
    c_->add_rms_norm(r, x, w, e, o);
  }
  void linear(const Tensor& x, const LinearWeight& w, Tensor& o) override { c_->linear(x, w, o); }
  void row_sum_squares(const Tensor& x, Tensor& o) override { c_->row_sum_squares(x, o); }
  void qk_norm_rope(const QkNormRopeArgs& a) override { c_->qk_norm_rope(a); }
  void write_kv(const Tensor& k, const Tensor& v, KVCacheLayer& kv, const AttentionMeta& m) override {
    c_->write_kv(k, v, kv, m);
  }
  void attention(const AttentionArgs& a) override { c_->attention(a); }
  void moe_route(const Tensor& x, const MoeWeights& m, MoeRouting& o) override { c_->moe_route(x, m, o); }
  void moe_experts(const Tensor& x, const MoeWeights& m, const MoeRouting& r, Tensor& o) override {
    c_->moe_experts(x, m, r, o);
  }
  void add(const Tensor& a, const Tensor& b, Tensor& o) override { c_->add(a, b, o); }
  void silu_mul(const Tensor& g, const Tensor& u, Tensor& o) override { c_->silu_mul(g, u, o); }
  void mla_rope_write_kv(const MlaArgs& a) override { c_->mla_rope_write_kv(a); }
  void mla_attention(const MlaArgs& a) override { c_->mla_attention(a); }

 private:
  std::unique_ptr<Backend> c_ = make_cpu_backend();
};

TEST(Int4Backend, BackendWithoutW4A16RefusesAtLoadNamingTheTensor) {
  const fs::path dir = test::golden_fixture("dsv3_tiny_int4");
  const LoadedConfig lc = load_model_config(dir.string());
  ASSERT_TRUE(lc.config->desc().quantization.int4());
  const Checkpoint ck = Checkpoint::open(dir.string());
  NoInt4Backend be;
  be.problem = "no W4A16 kernels for";
  auto m = lc.entry->create(*lc.config, be, ParallelConfig{}, {});
  try {
    m->load(ck);
    FAIL() << "an INT4 checkpoint must be refused by a backend without W4A16 kernels";
  } catch (const Error& e) {
    // Layer 0 is dense (bf16): the first INT4 weight is layer 1's expert 0 gate_proj.
    EXPECT_NE(std::string(e.what()).find("no W4A16 kernels for 'model.layers.1.mlp.experts.0.gate_proj.weight_packed'"),
              std::string::npos)
        << e.what();
  }
  be.problem.clear();  // the same backend without the refusal loads it
  auto m2 = lc.entry->create(*lc.config, be, ParallelConfig{}, {});
  EXPECT_NO_THROW(m2->load(ck));
  // The CPU reference serves it.
  auto cpu = make_cpu_backend();
  EXPECT_EQ(cpu->int4_weights_problem("x"), "");
}

TEST(Int4Fixture, SplitsThatCutAGroupAreRefused) {
  // dsv3_tiny_int4 with 8 heads: TP=8 gives each rank 16 of the experts' 128 down_proj inputs.
  std::ifstream f(test::golden_fixture("dsv3_tiny_int4") / "config.json");
  json j = json::parse(f);
  j["num_attention_heads"] = j["num_key_value_heads"] = 8;
  const LoadedConfig lc = parse_config(j);
  const std::string p = lc.config->shard_problem(ParallelConfig{0, 8, false});
  EXPECT_NE(p.find("INT4 tensor 'model.layers.1.mlp.experts.0.down_proj.weight_packed'"), std::string::npos) << p;
  EXPECT_NE(p.find("cuts its quantisation groups of 32"), std::string::npos) << p;
  EXPECT_EQ(lc.config->shard_problem(ParallelConfig{0, 8, true}), "");  // EP: whole experts
  EXPECT_EQ(lc.config->shard_problem(ParallelConfig{0, 4, false}), "");
  EXPECT_EQ(lc.config->fp8_split_problem(ParallelConfig{0, 8, false}), "");  // no FP8 blocks here
}

TEST(Int4Fixture, KimiK25WrapperPicksTheRoutedExpertsOnly) {
  // Kimi-K2.5's layout: the decoder under text_config, names under language_model., the
  // quantization_config at the top level (and, in the published file, inside text_config too).
  std::ifstream f(test::golden_fixture("dsv3_tiny_int4") / "config.json");
  json text = json::parse(f);
  for (bool inner : {false, true}) {
    json t = text;
    if (!inner) t.erase("quantization_config");
    const json top{{"architectures", {"KimiK25ForConditionalGeneration"}}, {"model_type", "kimi_k25"},
                   {"text_config", t}, {"quantization_config", kimi_quant()},
                   {"vision_config", {{"vt_hidden_size", 32}}}};
    const LoadedConfig lc = parse_config(top);
    const QuantizationConfig& q = lc.config->desc().quantization;
    ASSERT_TRUE(q.int4()) << inner;
    const std::vector<WeightDecl> w = lc.config->weights(ParallelConfig{});
    EXPECT_EQ(first_int4_tensor(w, q), "language_model.model.layers.1.mlp.experts.0.gate_proj.weight_packed");
    int n = 0;
    for (const auto& d : w)
      if (int4_group(q, d) > 0) {
        ++n;
        EXPECT_NE(d.name.find(".mlp.experts."), std::string::npos) << d.name;
      }
    EXPECT_EQ(n, 2 * 8 * 3);  // 2 MoE layers x 8 experts x gate/up/down; lm_head, attention, shared: bf16
  }
}

TEST(Int4Fixture, MissingScaleInTheFixtureIsNamed) {
  // The fixture rewritten as one file without one expert's weight_scale.
  const Checkpoint src = Checkpoint::open(test::golden_fixture("dsv3_tiny_int4").string());
  TempDir t;
  const std::string gone = "model.layers.2.mlp.experts.5.up_proj.weight_scale";
  std::vector<NamedTensor> ts;
  for (const auto& n : src.names())
    if (n != gone) ts.push_back({n, src.get(n)});
  write_safetensors((t.path / "model.safetensors").string(), ts);
  fs::copy_file(test::golden_fixture("dsv3_tiny_int4") / "config.json", t.path / "config.json");
  const LoadedConfig lc = load_model_config(t.path.string());
  auto be = make_cpu_backend();
  auto m = lc.entry->create(*lc.config, *be, ParallelConfig{}, {});
  try {
    m->load(Checkpoint::open(t.path.string()));
    FAIL() << "missing weight_scale must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no scale tensor '" + gone + "'"), std::string::npos) << e.what();
  }
}

}  // namespace
