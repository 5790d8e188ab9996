// Runs the whole suite on one Highway target when LOSSFUSE_TEST_TARGET names it (AVX3, AVX2, SSE4, SSSE3,
// SCALAR, ...): ctest runs the suite once per compiled target, so every dispatch path is checked against the
// reference, not only the best one this CPU has.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdlib>
#include <string>

namespace {

std::int64_t requested_target() {
  const char* name = std::getenv("LOSSFUSE_TEST_TARGET");
  if (name == nullptr || *name == '\0') return 0;
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (std::string(hwy::TargetName(t)) == name) return t;
  }
  return -1;
}

class TargetEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const std::int64_t t = requested_target();
    if (t > 0) {
      hwy::SetSupportedTargetsForTest(t);
      hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    }
  }
  void TearDown() override { hwy::SetSupportedTargetsForTest(0); }
};

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new TargetEnvironment);

TEST(SimdTarget, RequestedTargetIsCompiledAndActive) {
  const char* name = std::getenv("LOSSFUSE_TEST_TARGET");
  if (name == nullptr || *name == '\0') GTEST_SKIP() << "LOSSFUSE_TEST_TARGET not set: the best target runs";
  const std::int64_t t = requested_target();
  ASSERT_GT(t, 0) << name << " is not a target compiled in and supported by this CPU";
  EXPECT_EQ(hwy::SupportedTargets() & ~HWY_SCALAR, t & ~HWY_SCALAR);
}

}  // namespace
