// Round trips through write_safetensors / write_sharded_checkpoint and the readers.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "io_test_util.h"

using namespace moeserve;
using namespace moeserve::testing_io;
namespace fs = std::filesystem;

namespace {

// Host tensor filled with random bytes (fixed seed); BOOL gets 0/1 only.
Tensor random_tensor(DType t, Shape s, std::mt19937& rng) {
  Tensor x = Tensor::host(t, std::move(s));
  auto* p = x.ptr<uint8_t>();
  for (size_t i = 0; i < x.nbytes(); ++i) {
    p[i] = t == DType::BOOL ? uint8_t(rng() & 1) : uint8_t(rng());
  }
  return x;
}

std::vector<NamedTensor> all_dtype_tensors(std::mt19937& rng) {
  const DType all[] = {DType::F32, DType::F16, DType::BF16, DType::F8_E4M3,
                       DType::I32, DType::I64, DType::U8,   DType::BOOL};
  std::vector<NamedTensor> out;
  int i = 0;
  for (DType t : all) {
    std::string n(dtype_name(t));
    out.push_back(
        {"layers." + std::to_string(i) + "." + n + ".weight", random_tensor(t, {3, 5}, rng)});
    out.push_back({"vec." + n, random_tensor(t, {7}, rng)});
    ++i;
  }
  // Scalar (rank 0) and zero-element tensors are legal in the format.
  out.push_back({"scalar", random_tensor(DType::F32, {}, rng)});
  out.push_back({"empty", random_tensor(DType::BF16, {0, 4}, rng)});
  return out;
}

void expect_same(const Tensor& want, const Tensor& got, const std::string& name) {
  EXPECT_EQ(got.dtype, want.dtype) << name;
  EXPECT_EQ(got.shape, want.shape) << name;
  EXPECT_EQ(got.device, Device::CPU) << name;
  ASSERT_EQ(got.nbytes(), want.nbytes()) << name;
  if (want.nbytes()) {
    EXPECT_EQ(std::memcmp(got.data, want.data, want.nbytes()), 0) << name;
  }
  EXPECT_TRUE(got.owner) << name;
}

}  // namespace

TEST(Safetensors, RoundTripEveryDtypeSingleFile) {
  std::mt19937 rng(1234);
  auto tensors = all_dtype_tensors(rng);
  fs::path p = test_dir() / "one.safetensors";
  write_safetensors(p.string(), tensors, {{"format", "pt"}, {"note", "hello"}});

  auto f = SafetensorsFile::open(p.string());
  EXPECT_EQ(f->path(), p.string());
  ASSERT_EQ(f->tensors().size(), tensors.size());
  EXPECT_EQ(f->metadata().size(), 2u);
  EXPECT_EQ(f->metadata().at("note"), "hello");
  uint64_t expect_offset = 0;
  for (const auto& nt : tensors) {
    ASSERT_TRUE(f->contains(nt.name)) << nt.name;
    const TensorInfo& info = f->tensors().at(nt.name);
    EXPECT_EQ(info.name, nt.name);
    EXPECT_EQ(info.file, p.string());
    // Written in the order given, back to back.
    EXPECT_EQ(info.offset_begin, expect_offset) << nt.name;
    expect_offset += nt.tensor.nbytes();
    EXPECT_EQ(info.offset_end, expect_offset) << nt.name;
    expect_same(nt.tensor, f->get(nt.name), nt.name);
  }
  EXPECT_FALSE(f->contains("nope"));
  expect_error([&] { f->get("nope"); }, {p.string(), "nope"});
}

TEST(Safetensors, FileLayoutMatchesFormat) {
  std::mt19937 rng(7);
  fs::path p = test_dir() / "layout.safetensors";
  Tensor a = random_tensor(DType::F32, {2, 3}, rng);
  Tensor b = random_tensor(DType::U8, {5}, rng);
  write_safetensors(p.string(), {{"a", a}, {"b", b}}, {{"format", "pt"}});
  std::string bytes = read_bytes(p);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[i]);
  EXPECT_EQ(n % 8, 0u) << "data section must start 8-byte aligned";
  ASSERT_EQ(bytes.size(), 8 + n + a.nbytes() + b.nbytes());
  std::string header = bytes.substr(8, n);
  // JSON followed only by space padding (fewer than 8).
  size_t last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u);
  auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j["__metadata__"]["format"], "pt");
  EXPECT_EQ(j["a"]["dtype"], "F32");
  EXPECT_EQ(j["a"]["shape"], nlohmann::json({2, 3}));
  EXPECT_EQ(j["a"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(j["b"]["data_offsets"], nlohmann::json({24, 29}));
  EXPECT_EQ(std::memcmp(bytes.data() + 8 + n, a.data, 24), 0);
}

TEST(Safetensors, NoMetadataAndNoTensors) {
  fs::path p = test_dir() / "empty.safetensors";
  write_safetensors(p.string(), {});
  auto f = SafetensorsFile::open(p.string());
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_TRUE(f->metadata().empty());
  EXPECT_EQ(read_bytes(p).size(), 16u);  // 8 + "{}" padded to 8
}

TEST(Safetensors, ViewKeepsMappingAlive) {
  std::mt19937 rng(99);
  Tensor a = random_tensor(DType::I64, {64}, rng);
  fs::path p = test_dir() / "alive.safetensors";
  write_safetensors(p.string(), {{"a", a}});
  Tensor view;
  {
    auto ck = Checkpoint::open(p.string());
    view = ck.get("a");
  }  // checkpoint and file handles gone; the view's owner still holds the mapping
  fs::remove(p);
  expect_same(a, view, "a");
}

TEST(Safetensors, WriterRejectsBadInput) {
  fs::path d = test_dir();
  Tensor a = Tensor::host(DType::F32, {2});
  expect_error(
      [&] {
        write_safetensors((d / "x.safetensors").string(), {{"a", a}, {"a", a}});
      },
      {"x.safetensors", "'a'", "twice"});
  expect_error(
      [&] {
        write_safetensors((d / "y.safetensors").string(), {{"__metadata__", a}});
      },
      {"y.safetensors", "__metadata__"});
  expect_error(
      [&] {
        write_sharded_checkpoint((d / "z").string(), {{"a", a}, {"a", a}}, 100);
      },
      {"'a'", "twice"});
}

TEST(Checkpoint, ShardedRoundTripEveryDtype) {
  std::mt19937 rng(42);
  auto tensors = all_dtype_tensors(rng);
  fs::path d = test_dir() / "sharded";
  write_sharded_checkpoint(d.string(), tensors, /*max_shard_bytes=*/100);

  auto index = nlohmann::json::parse(read_bytes(d / "model.safetensors.index.json"));
  uint64_t total = 0;
  for (const auto& nt : tensors) total += nt.tensor.nbytes();
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);
  ASSERT_EQ(index["weight_map"].size(), tensors.size());

  // Recompute the expected greedy packing independently and compare shard by shard.
  std::vector<std::vector<std::string>> shards(1);
  size_t cur = 0;
  for (const auto& nt : tensors) {
    if (!shards.back().empty() && cur + nt.tensor.nbytes() > 100) {
      shards.emplace_back();
      cur = 0;
    }
    shards.back().push_back(nt.name);
    cur += nt.tensor.nbytes();
  }
  ASSERT_GT(shards.size(), 3u);
  for (size_t k = 0; k < shards.size(); ++k) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
    ASSERT_TRUE(fs::exists(d / name)) << name;
    auto f = SafetensorsFile::open((d / name).string());
    EXPECT_EQ(f->tensors().size(), shards[k].size());
    EXPECT_EQ(f->metadata().at("format"), "pt");
    for (const auto& t : shards[k]) EXPECT_EQ(index["weight_map"][t], name) << t;
  }

  auto ck = Checkpoint::open(d.string());
  EXPECT_EQ(ck.dir(), d.string());
  std::vector<std::string> want;
  for (const auto& nt : tensors) want.push_back(nt.name);
  std::sort(want.begin(), want.end());
  EXPECT_EQ(ck.names(), want);
  for (const auto& nt : tensors) {
    ASSERT_TRUE(ck.contains(nt.name));
    EXPECT_EQ(fs::path(ck.info(nt.name).file).filename().string(),
              index["weight_map"][nt.name].get<std::string>());
    expect_same(nt.tensor, ck.get(nt.name), nt.name);
  }
  expect_error([&] { ck.get("missing.weight"); }, {d.string(), "missing.weight"});
  expect_error([&] { ck.info("missing.weight"); }, {d.string(), "missing.weight"});
}

TEST(Checkpoint, OneShardWhenEverythingFits) {
  std::mt19937 rng(5);
  fs::path d = test_dir();
  write_sharded_checkpoint(d.string(), {{"a", random_tensor(DType::F32, {4}, rng)}}, 1 << 20);
  EXPECT_TRUE(fs::exists(d / "model-00001-of-00001.safetensors"));
  EXPECT_EQ(Checkpoint::open(d.string()).names(), std::vector<std::string>{"a"});
}

TEST(Checkpoint, DirectoryWithoutIndexAndSingleFile) {
  std::mt19937 rng(3);
  fs::path d = test_dir();
  Tensor a = random_tensor(DType::BF16, {4, 4}, rng);
  Tensor b = random_tensor(DType::F8_E4M3, {16}, rng);
  Tensor c = random_tensor(DType::I32, {2}, rng);
  write_safetensors((d / "part1.safetensors").string(), {{"a", a}, {"b", b}});
  write_safetensors((d / "part2.safetensors").string(), {{"c", c}});
  write_bytes(d / "config.json", "{}");  // non-safetensors files are ignored

  auto ck = Checkpoint::open(d.string());
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
  expect_same(a, ck.get("a"), "a");
  expect_same(b, ck.get("b"), "b");
  expect_same(c, ck.get("c"), "c");
  EXPECT_EQ(ck.info("c").file, (d / "part2.safetensors").string());

  auto one = Checkpoint::open((d / "part1.safetensors").string());
  EXPECT_EQ(one.names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(one.dir(), d.string());
  EXPECT_FALSE(one.contains("c"));
}
