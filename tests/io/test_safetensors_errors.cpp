// Malformed files and indexes, built byte by hand: each must fail at open with a message
// naming the file (and the tensor), and never read out of bounds. Plus a truncation /
// byte-flip robustness sweep over a valid file.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "io/safetensors.h"
#include "io_test_util.h"

using namespace moeserve;
using namespace moeserve::testing_io;
namespace fs = std::filesystem;

namespace {

// Writes `bytes` to <test dir>/<name> and expects open() to fail naming the file + needles.
void expect_file_error(const std::string& name, const std::string& bytes,
                       std::vector<std::string> needles) {
  fs::path p = test_dir() / name;
  write_bytes(p, bytes);
  needles.push_back(p.string());
  expect_error([&] { SafetensorsFile::open(p.string()); }, needles);
}

// One tensor entry as JSON text.
std::string entry(const std::string& name, const std::string& body) {
  return "\"" + name + "\":{" + body + "}";
}

}  // namespace

TEST(SafetensorsErrors, TooShort) {
  expect_file_error("empty.safetensors", "", {"shorter than"});
  expect_file_error("five.safetensors", "abcde", {"shorter than"});
}

TEST(SafetensorsErrors, HeaderLengthPastEof) {
  std::string h = "{}";
  expect_file_error("past.safetensors", u64_le(1000) + h, {"1000", "past the end"});
  // The header length field alone, with N = 1.
  expect_file_error("exact.safetensors", u64_le(1), {"past the end"});
}

TEST(SafetensorsErrors, HeaderLengthAbsurd) {
  expect_file_error("huge.safetensors", u64_le(200'000'000) + "{}", {"200000000", "larger"});
  expect_file_error("max.safetensors", u64_le(~0ull) + "{}", {"larger"});
}

TEST(SafetensorsErrors, HeaderNotJsonOrNotObject) {
  expect_file_error("bad.safetensors", raw_file("{\"a\":", 0), {"not valid JSON"});
  expect_file_error("arr.safetensors", raw_file("[1, 2]  ", 0), {"not an object"});
  // Invalid UTF-8 inside a string.
  expect_file_error("utf8.safetensors", raw_file("{\"\xff\xfe\":1}", 0), {"not valid JSON"});
}

TEST(SafetensorsErrors, EntryMissingFields) {
  expect_file_error("nodtype.safetensors",
                    raw_file("{" + entry("w", R"("shape":[2],"data_offsets":[0,8])") + "}", 8),
                    {"'w'", "missing 'dtype'"});
  expect_file_error("noshape.safetensors",
                    raw_file("{" + entry("w", R"("dtype":"F32","data_offsets":[0,8])") + "}", 8),
                    {"'w'", "missing 'shape'"});
  expect_file_error("nooffs.safetensors",
                    raw_file("{" + entry("w", R"("dtype":"F32","shape":[2])") + "}", 8),
                    {"'w'", "missing 'data_offsets'"});
  expect_file_error("notobj.safetensors", raw_file(R"({"w":[1,2]})", 0), {"'w'", "not an object"});
}

TEST(SafetensorsErrors, EntryWrongTypes) {
  auto one = [](const std::string& body) { return raw_file("{" + entry("w", body) + "}", 8); };
  expect_file_error("t1.safetensors", one(R"("dtype":5,"shape":[2],"data_offsets":[0,8])"),
                    {"'w'", "'dtype' is not a string"});
  expect_file_error("t2.safetensors", one(R"("dtype":"F32","shape":"2","data_offsets":[0,8])"),
                    {"'w'", "'shape' is not an array"});
  expect_file_error("t3.safetensors", one(R"("dtype":"F32","shape":[2.5],"data_offsets":[0,8])"),
                    {"'w'", "non-integer"});
  expect_file_error("t4.safetensors", one(R"("dtype":"F32","shape":[2],"data_offsets":[8])"),
                    {"'w'", "data_offsets"});
  expect_file_error("t5.safetensors", one(R"("dtype":"F32","shape":[2],"data_offsets":["0","8"])"),
                    {"'w'", "data_offsets"});
  expect_file_error("t6.safetensors", one(R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])"),
                    {"'w'", "data_offsets"});
  expect_file_error("t7.safetensors", raw_file(R"({"__metadata__":{"a":1}})", 0),
                    {"__metadata__", "'a'"});
  expect_file_error("t8.safetensors", raw_file(R"({"__metadata__":"x"})", 0), {"__metadata__"});
}

TEST(SafetensorsErrors, NegativeDim) {
  expect_file_error(
      "neg.safetensors",
      raw_file("{" + entry("model.w", R"("dtype":"F32","shape":[-1,2],"data_offsets":[0,8])") + "}",
               8),
      {"'model.w'", "negative"});
}

TEST(SafetensorsErrors, UnknownDtype) {
  expect_file_error(
      "f64.safetensors",
      raw_file("{" + entry("lm_head", R"("dtype":"F64","shape":[1],"data_offsets":[0,8])") + "}",
               8),
      {"'lm_head'", "F64", "unsupported dtype"});
}

TEST(SafetensorsErrors, SizeInconsistentWithShape) {
  expect_file_error(
      "size.safetensors",
      raw_file("{" + entry("w", R"("dtype":"F32","shape":[2,2],"data_offsets":[0,8])") + "}", 8),
      {"'w'", "16 bytes", "8 bytes"});
}

TEST(SafetensorsErrors, NumelOverflow) {
  expect_file_error("ovf.safetensors",
                    raw_file("{" +
                                 entry("w", R"("dtype":"F32","shape":[4294967296,4294967296],)"
                                            R"("data_offsets":[0,8])") +
                                 "}",
                             8),
                    {"'w'", "overflow"});
  // numel fits but numel * 8 bytes does not.
  expect_file_error("ovf2.safetensors",
                    raw_file("{" +
                                 entry("w", R"("dtype":"I64","shape":[4611686018427387904],)"
                                            R"("data_offsets":[0,8])") +
                                 "}",
                             8),
                    {"'w'", "overflow"});
}

TEST(SafetensorsErrors, OffsetsOutOfRange) {
  expect_file_error(
      "end.safetensors",
      raw_file("{" + entry("w", R"("dtype":"F32","shape":[4],"data_offsets":[0,16])") + "}", 8),
      {"'w'", "past the data section"});
  // Offsets near 2^64 must not wrap around.
  expect_file_error(
      "wrap.safetensors",
      raw_file("{" +
                   entry("w", R"("dtype":"U8","shape":[7],)"
                              R"("data_offsets":[18446744073709551608,18446744073709551615])") +
                   "}",
               8),
      {"'w'", "past the data section"});
  expect_file_error(
      "order.safetensors",
      raw_file("{" + entry("w", R"("dtype":"F32","shape":[0],"data_offsets":[8,0])") + "}", 8),
      {"'w'", "begin > end"});
}

TEST(SafetensorsErrors, OverlapGapAndTrailingBytes) {
  const std::string a = entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])");
  expect_file_error(
      "overlap.safetensors",
      raw_file(
          "{" + a + "," + entry("b", R"("dtype":"F32","shape":[2],"data_offsets":[4,12])") + "}",
          12),
      {"'b'", "overlap", "'a'"});
  expect_file_error(
      "gap.safetensors",
      raw_file(
          "{" + a + "," + entry("b", R"("dtype":"F32","shape":[2],"data_offsets":[12,20])") + "}",
          20),
      {"'b'", "gap"});
  expect_file_error("trail.safetensors", raw_file("{" + a + "}", 12), {"'a'", "trailing"});
  // A hole at the start of the data section.
  expect_file_error(
      "hole0.safetensors",
      raw_file("{" + entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[4,12])") + "}", 12),
      {"'a'", "gap"});
}

TEST(SafetensorsErrors, HandBuiltValidFileOpens) {
  // The same hand-built path accepts a well-formed file (so the cases above fail for the
  // reason they claim), including zero-size tensors sharing an offset and unpadded headers.
  std::string h = "{" + entry("a", R"("dtype":"F32","shape":[2],"data_offsets":[0,8])") + "," +
                  entry("z", R"("dtype":"BF16","shape":[0,3],"data_offsets":[8,8])") + "," +
                  entry("b", R"("dtype":"BOOL","shape":[3],"data_offsets":[8,11],"extra":1)") + "}";
  fs::path p = test_dir() / "ok.safetensors";
  write_bytes(p, raw_file(h, 11));
  auto f = SafetensorsFile::open(p.string());
  EXPECT_EQ(f->tensors().size(), 3u);
  EXPECT_EQ(f->get("b").shape, (Shape{3}));
  EXPECT_EQ(f->get("z").numel(), 0);
}

// ---- index / checkpoint ----

namespace {
// Writes a shard holding F32 tensors of 2 elements named `names`.
void shard(const fs::path& p, const std::vector<std::string>& names) {
  std::vector<NamedTensor> ts;
  for (const auto& n : names) ts.push_back({n, Tensor::host(DType::F32, {2})});
  write_safetensors(p.string(), ts);
}
void index(const fs::path& d, const std::string& text) {
  write_bytes(d / "model.safetensors.index.json", text);
}
}  // namespace

TEST(CheckpointErrors, IndexInvalid) {
  fs::path d = test_dir();
  shard(d / "s1.safetensors", {"a"});
  std::string ip = (d / "model.safetensors.index.json").string();
  index(d, "{\"weight_map\": ");
  expect_error([&] { Checkpoint::open(d.string()); }, {ip, "not valid JSON"});
  index(d, R"({"metadata": {}})");
  expect_error([&] { Checkpoint::open(d.string()); }, {ip, "missing 'weight_map'"});
  index(d, R"({"weight_map": []})");
  expect_error([&] { Checkpoint::open(d.string()); }, {ip, "weight_map"});
  index(d, R"({"weight_map": {"a": 3}})");
  expect_error([&] { Checkpoint::open(d.string()); }, {ip, "'a'", "not a string"});
  index(d, R"({"weight_map": {"a": "../s1.safetensors"}})");
  expect_error([&] { Checkpoint::open(d.string()); }, {ip, "'a'", "../s1.safetensors"});
}

TEST(CheckpointErrors, MissingShard) {
  fs::path d = test_dir();
  shard(d / "s1.safetensors", {"a"});
  index(d, R"({"weight_map": {"a": "s1.safetensors", "b.weight": "s2.safetensors"}})");
  expect_error([&] { Checkpoint::open(d.string()); },
               {"s2.safetensors", "'b.weight'", "does not exist"});
}

TEST(CheckpointErrors, TensorAbsentFromItsShard) {
  fs::path d = test_dir();
  shard(d / "s1.safetensors", {"a"});
  shard(d / "s2.safetensors", {"b"});
  index(d,
        R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"}})");
  expect_error([&] { Checkpoint::open(d.string()); },
               {"'c'", "s2.safetensors", "does not contain"});
}

TEST(CheckpointErrors, TensorListedUnderAnotherShard) {
  fs::path d = test_dir();
  shard(d / "s1.safetensors", {"a", "b"});
  shard(d / "s2.safetensors", {"c"});
  // b is stored in s1 but listed under s2: the message names both shards.
  index(d,
        R"({"weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s2.safetensors"}})");
  expect_error([&] { Checkpoint::open(d.string()); },
               {"'b'", "s2.safetensors", "does not contain", "s1.safetensors"});
  // b in both shards: ambiguous.
  shard(d / "s2.safetensors", {"b", "c"});
  expect_error([&] { Checkpoint::open(d.string()); },
               {"'b'", "s2.safetensors", "also stored", "s1.safetensors"});
}

TEST(CheckpointErrors, UnlistedTensorsAreNotExposed) {
  fs::path d = test_dir();
  shard(d / "s1.safetensors", {"a", "extra"});
  index(d, R"({"weight_map": {"a": "s1.safetensors"}})");
  auto ck = Checkpoint::open(d.string());
  EXPECT_EQ(ck.names(), std::vector<std::string>{"a"});
}

TEST(CheckpointErrors, BrokenShardNamesTheShard) {
  fs::path d = test_dir();
  write_bytes(d / "s1.safetensors", "xyz");
  index(d, R"({"weight_map": {"a": "s1.safetensors"}})");
  expect_error([&] { Checkpoint::open(d.string()); }, {(d / "s1.safetensors").string(), "shorter"});
}

TEST(CheckpointErrors, DirectoryWithoutIndex) {
  fs::path d = test_dir();
  expect_error([&] { Checkpoint::open(d.string()); }, {d.string(), "no "});
  expect_error([&] { Checkpoint::open((d / "nope").string()); }, {"nope", "does not exist"});
  shard(d / "x1.safetensors", {"a", "dup"});
  shard(d / "x2.safetensors", {"dup"});
  expect_error([&] { Checkpoint::open(d.string()); },
               {"'dup'", "x1.safetensors", "x2.safetensors"});
}

// ---- robustness ----

TEST(SafetensorsRobustness, TruncationsAndHeaderByteFlips) {
  fs::path d = test_dir();
  std::mt19937 rng(20240601);
  std::vector<NamedTensor> ts;
  ts.push_back({"model.embed.weight", Tensor::host(DType::BF16, {4, 6})});
  ts.push_back({"model.layers.0.w", Tensor::host(DType::F8_E4M3, {3, 5})});
  ts.push_back({"scale", Tensor::host(DType::F32, {2})});
  ts.push_back({"ids", Tensor::host(DType::I64, {3})});
  for (auto& nt : ts) {
    for (size_t i = 0; i < nt.tensor.nbytes(); ++i) nt.tensor.ptr<uint8_t>()[i] = uint8_t(rng());
  }
  fs::path good = d / "good.safetensors";
  write_safetensors(good.string(), ts, {{"format", "pt"}});
  const std::string bytes = read_bytes(good);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[i]);
  fs::path p = d / "mut.safetensors";

  // Every strict prefix must be rejected with moeserve::Error (tensors tile the file exactly).
  for (size_t len = 0; len < bytes.size(); ++len) {
    write_bytes(p, bytes.substr(0, len));
    EXPECT_THROW(SafetensorsFile::open(p.string()), Error) << "length " << len;
  }

  // Random flips in the length field and the header: succeed with in-bounds views or throw Error.
  int opened = 0, rejected = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string m = bytes;
    int flips = 1 + int(rng() % 3);
    for (int k = 0; k < flips; ++k) {
      size_t pos = rng() % (8 + n);
      // Half the time a printable character (keeps JSON plausible), else any byte.
      m[pos] = (rng() & 1) ? char(0x20 + rng() % 95) : char(rng());
    }
    write_bytes(p, m);
    try {
      auto f = SafetensorsFile::open(p.string());
      ++opened;
      for (const auto& [name, info] : f->tensors()) {
        ASSERT_LE(8 + n + info.offset_end, m.size()) << name;
        Tensor t = f->get(name);
        ASSERT_EQ(t.nbytes(), info.offset_end - info.offset_begin) << name;
        // Touch every byte of the view and compare with the file contents.
        const auto* q = t.ptr<uint8_t>();
        for (size_t i = 0; i < t.nbytes(); ++i) {
          ASSERT_EQ(char(q[i]), m[8 + n + info.offset_begin + i]) << name;
        }
      }
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(opened, 0);  // some flips (e.g. in metadata text, key renames) are harmless
}
