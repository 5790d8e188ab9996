// Checks that LOSSFUSE_TEST_TARGET, when set, really selected a compiled and supported Highway target.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdlib>

#include "simd_target.hpp"

namespace {

TEST(SimdTarget, RequestedTargetIsCompiledAndActive) {
  const char* name = std::getenv("LOSSFUSE_TEST_TARGET");
  if (name == nullptr || *name == '\0') GTEST_SKIP() << "LOSSFUSE_TEST_TARGET not set: the best target runs";
  const std::int64_t t = lftest::requested_target();
  ASSERT_GT(t, 0) << name << " is not a target compiled in and supported by this CPU";
  EXPECT_EQ(hwy::SupportedTargets() & ~HWY_SCALAR, t & ~HWY_SCALAR);
}

}  // namespace
