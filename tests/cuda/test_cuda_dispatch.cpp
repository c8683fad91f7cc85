// The kernel selectors on a live device: the backend's DeviceCaps (what dispatch reads) equal the
// named profile of that device (what --explain-dispatch and its golden files assume), the
// tuning is per instance and validated, and an op runs the kernel its selector names.
#include <gtest/gtest.h>

#include <cstdio>

#include "backend/cuda/cuda_backend.h"
#include "test_util.h"

namespace moeserve::test {
namespace {

TEST(CudaDispatch, ProfileMatchesDevice) {
  SKIP_WITHOUT_GPU();
  const DeviceCaps& c = gpu().caps();
  std::printf("[caps] %s: code arch %d%s, cc %d, %d SMs, attention wgmma %d, fp8 wgmma %d, sampling %d resident\n",
              c.name.c_str(), c.code_arch, c.sm90a ? " (sm_90a)" : "", c.cc, c.num_sms, int(c.attn_wgmma),
              int(c.fp8_wgmma), c.sample_resident);
  if (!(c.cc == 90 && c.num_sms == 132 && c.sm90a)) GTEST_SKIP() << "not an H200 running sm_90a code";
  const DeviceCaps p = device_profile("h200");
  EXPECT_EQ(c.code_arch, p.code_arch);
  EXPECT_EQ(c.sm90a, p.sm90a);
  EXPECT_EQ(c.cc, p.cc);
  EXPECT_EQ(c.num_sms, p.num_sms);
  EXPECT_EQ(c.attn_wgmma, p.attn_wgmma);
  EXPECT_EQ(c.fp8_wgmma, p.fp8_wgmma);
  EXPECT_EQ(c.sample_resident, p.sample_resident);
}

TEST(CudaDispatch, TuningIsPerInstanceAndValidated) {
  SKIP_WITHOUT_GPU();
  CudaBackend& b = gpu();
  const CudaTuning saved = b.tuning;
  CudaTuning t = saved;
  t.attn_decode_max_splits = 6;
  try {
    b.set_tuning(t);
    ADD_FAILURE() << "set_tuning took attn_decode_max_splits = 6";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("attn_decode_max_splits"), std::string::npos) << e.what();
  }
  EXPECT_EQ(b.tuning.attn_decode_max_splits, saved.attn_decode_max_splits);
  // A field set on this instance changes only this instance's choice.
  cuda::LinearOpDesc d;
  d.op = cuda::LinearOp::kLinear, d.T = 1, d.K = 3072, d.w[0].N = 3072;
  EXPECT_EQ(b.select(d).id, cuda::LinearKernel::kGemvTc);
  b.tuning.use_gemv_tc = false;
  EXPECT_EQ(b.select(d).id, cuda::LinearKernel::kGemv);
  b.tuning = saved;
}

}  // namespace
}  // namespace moeserve::test
