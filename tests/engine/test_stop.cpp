#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "engine/stop.h"

namespace moeserve {
namespace {

Sequence seq_with(SamplingParams p, std::vector<int32_t> prompt, std::vector<int32_t> out) {
  auto req = std::make_shared<Request>();
  req->params = p;
  Sequence s;
  s.request = req;
  s.tokens = prompt;
  s.num_prompt_tokens = static_cast<int>(prompt.size());
  s.tokens.insert(s.tokens.end(), out.begin(), out.end());
  return s;
}

TEST(Stop, EosStopTokensLengthAndMinTokens) {
  const std::vector<int32_t> eos = {9};
  SamplingParams p;
  p.max_tokens = 4;
  EXPECT_EQ(check_stop(seq_with(p, {1}, {2}), eos, 100).reason, FinishReason::None);
  auto d = check_stop(seq_with(p, {1}, {2, 9}), eos, 100);
  EXPECT_EQ(d.reason, FinishReason::Stop);
  EXPECT_EQ(d.stop_token_id, 9);
  EXPECT_EQ(check_stop(seq_with(p, {1}, {2, 3, 4, 5}), eos, 100).reason, FinishReason::Length);
  EXPECT_EQ(check_stop(seq_with(p, {1}, {2, 3, 4, 9}), eos, 100).reason, FinishReason::Stop);
  EXPECT_EQ(check_stop(seq_with(p, {1, 1, 1}, {2}), eos, 4).reason, FinishReason::Length) << "model length";
  p.ignore_eos = true;
  EXPECT_EQ(check_stop(seq_with(p, {1}, {9}), eos, 100).reason, FinishReason::None);
  p.stop_token_ids = {7};
  d = check_stop(seq_with(p, {1}, {7}), eos, 100);
  EXPECT_EQ(d.reason, FinishReason::Stop);
  EXPECT_EQ(d.stop_token_id, 7);
  p.ignore_eos = false;
  p.min_tokens = 2;
  EXPECT_EQ(check_stop(seq_with(p, {1}, {9}), eos, 100).reason, FinishReason::None);
  EXPECT_EQ(check_stop(seq_with(p, {1}, {9, 9}), eos, 100).reason, FinishReason::Stop);
}

TEST(Stop, ReadsEosIdsFromModelDir) {
  auto dir = std::filesystem::temp_directory_path() / "moeserve_test_eos";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "generation_config.json") << R"({"eos_token_id": [200020, 200021], "top_p": 0.95})";
  std::ofstream(dir / "config.json") << R"({"eos_token_id": 200021, "bos_token_id": 1})";
  EXPECT_EQ(read_eos_token_ids(dir.string()), (std::vector<int32_t>{200020, 200021}));
  std::filesystem::remove(dir / "generation_config.json");
  EXPECT_EQ(read_eos_token_ids(dir.string()), (std::vector<int32_t>{200021}));
  std::ofstream(dir / "config.json") << R"({"eos_token_id": "x"})";
  EXPECT_THROW(read_eos_token_ids(dir.string()), Error);
  std::ofstream(dir / "config.json") << "{not json";
  EXPECT_THROW(read_eos_token_ids(dir.string()), Error);
  std::filesystem::remove_all(dir);
  EXPECT_TRUE(read_eos_token_ids(dir.string()).empty());
}

}  // namespace
}  // namespace moeserve
