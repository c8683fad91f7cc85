// bench-model --explain-dispatch: the selectors' table equals the checked-in golden files
// (tests/fixtures/dispatch/<model>.<profile>.txt), the CUDA README's generated op table equals
// the markdown output, and the selectors' inputs behave (tuning validation, buckets).
// Regenerate after a deliberate dispatch change: scripts/gen_dispatch_tables.sh.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "backend/cuda/attention/select_attention.h"
#include "backend/cuda/common/tuning.h"
#include "backend/cuda/linear/select_linear.h"
#include "backend/cuda/moe/select_moe.h"
#include "runtime/decode_plan.h"
#include "tools/explain_dispatch.h"

namespace moeserve {
namespace {

std::string source_dir() {
  const char* s = std::getenv("MOESERVE_SOURCE_DIR");
  return s ? s : ".";
}

std::string read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(ExplainDispatch, GoldenTables) {
  for (const std::string& m : tools::explain_dispatch_models())
    for (const std::string& p : tools::explain_dispatch_profiles()) {
      const std::string path = source_dir() + "/tests/fixtures/dispatch/" + m + "." + p + ".txt";
      const std::string want = read(path);
      ASSERT_FALSE(want.empty()) << "missing golden file " << path << " (scripts/gen_dispatch_tables.sh)";
      EXPECT_EQ(tools::explain_dispatch(m, p), want)
          << path << " differs from `moeserve bench-model --explain-dispatch --synthetic " << m
          << " --device-profile " << p << "` (a dispatch change: regenerate with scripts/gen_dispatch_tables.sh)";
    }
}

TEST(ExplainDispatch, ReadmeSectionIsGenerated) {
  const std::string readme = read(source_dir() + "/src/backend/cuda/README.md");
  const size_t a = readme.find(tools::kExplainBegin), b = readme.find(tools::kExplainEnd);
  ASSERT_NE(a, std::string::npos) << "README: no generated explain-dispatch section";
  ASSERT_NE(b, std::string::npos);
  const std::string section = readme.substr(a, b + std::string(tools::kExplainEnd).size() + 1 - a);
  EXPECT_EQ(section, tools::explain_dispatch_markdown())
      << "src/backend/cuda/README.md's op table is stale (scripts/gen_dispatch_tables.sh rewrites it)";
}

TEST(ExplainDispatch, BucketsAreTheRuntimes) {
  // The table's decode rows are the executor's graph buckets up to 256.
  const std::string t = tools::explain_dispatch("minimax-m2.5", "h200");
  for (int b : graph_buckets(256)) {
    char row[64];
    std::snprintf(row, sizeof row, "o_proj          decode   %6d  ", b);
    EXPECT_NE(t.find(row), std::string::npos) << "no decode row for bucket " << b;
  }
}

TEST(CudaTuning, ValidateNamesTheField) {
  CudaTuning t;
  EXPECT_EQ(t.validate(), "");
  t.attn_decode_max_splits = 12;
  EXPECT_NE(t.validate().find("CudaTuning.attn_decode_max_splits = 12"), std::string::npos) << t.validate();
  t = {};
  t.moe_gemv_max_tokens = -1;
  EXPECT_NE(t.validate().find("moe_gemv_max_tokens"), std::string::npos);
  t = {};
  t.route_topk_warp = 3;
  EXPECT_NE(t.validate().find("route_topk_warp"), std::string::npos);
  t = {};
  t.fp8_act_min_tokens = 0;
  EXPECT_NE(t.validate().find("fp8_act_min_tokens"), std::string::npos);
  EXPECT_THROW(device_profile("a100"), std::exception);
}

// Spot checks of the selectors against the dispatch rules they encode.
TEST(Selectors, TuningPerInstanceChangesTheChoice) {
  const DeviceCaps h200 = device_profile("h200"), sm120 = device_profile("sm120");
  CudaTuning t;
  cuda::LinearOpDesc d;
  d.op = cuda::LinearOp::kLinear, d.T = 1, d.K = 6144, d.w[0].N = 3072;
  EXPECT_EQ(cuda::select_linear(d, h200, t).id, cuda::LinearKernel::kGemvTc);
  t.use_gemv_tc = false;
  EXPECT_EQ(cuda::select_linear(d, h200, t).id, cuda::LinearKernel::kGemv);
  t = {};
  d.T = 512;
  EXPECT_EQ(cuda::select_linear(d, h200, t).id, cuda::LinearKernel::kFp8Lt);
  EXPECT_EQ(cuda::select_linear(d, sm120, t).id, cuda::LinearKernel::kGemm);  // no e4m3 mma.sync in sm_80 code
  d.T = 333;  // cuBLASLt takes 328 rows, the wgmma-less tail the mma.sync kernel
  const cuda::LinearKernel k = cuda::select_linear(d, h200, t);
  EXPECT_EQ(k.id, cuda::LinearKernel::kFp8Lt);
  EXPECT_EQ(k.lt_rows, 328);
  EXPECT_EQ(k.tail, cuda::LinearKernel::kFp8Mma);
  // A capture whose quantisation workspace is too small falls back (counted).
  d.T = 512, d.ws.capturing = true, d.ws.quant_x = 1024;
  const cuda::LinearKernel f = cuda::select_linear(d, h200, t);
  EXPECT_TRUE(f.capture_fallback);
  EXPECT_EQ(f.id, cuda::LinearKernel::kGemm);
  // INT4 experts with a group the W4A16 kernels refuse.
  cuda::MoeExpertsOpDesc e;
  e.T = 4, e.top_k = 8, e.H = 7168, e.I = 2048, e.int4 = true, e.fp8 = false, e.bo = 1, e.bi = 48;
  EXPECT_EQ(cuda::select_moe_experts(e, h200, t).id, cuda::MoeExpertsKernel::kUnsupported);
  e.bi = 32;
  EXPECT_EQ(cuda::select_moe_experts(e, h200, t).id, cuda::MoeExpertsKernel::kInt4Gemv);
  // V head dim != K head dim.
  cuda::AttentionOpDesc a;
  a.T = 1, a.num_seqs = 1, a.max_query_len = 1, a.Hq = 8, a.Hkv = 1, a.D = 128, a.v_head_dim = 64, a.block_size = 16;
  EXPECT_EQ(cuda::select_attention(a, h200, t).id, cuda::AttentionKernel::kUnsupported);
}

}  // namespace
}  // namespace moeserve
