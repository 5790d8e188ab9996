// Linked into every test executable: when LOSSFUSE_TEST_TARGET names a Highway target (AVX3, AVX2, SSE4,
// SCALAR, ...), the executable runs on that target only, so ctest checks every dispatch path against
// the reference, not only the best one this CPU has.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cstdlib>
#include <string>

#include "simd_target.hpp"

namespace lftest {

std::int64_t requested_target() {
  const char* name = std::getenv("LOSSFUSE_TEST_TARGET");
  if (name == nullptr || *name == '\0') return 0;
  for (std::int64_t t : hwy::SupportedAndGeneratedTargets()) {
    if (std::string(hwy::TargetName(t)) == name) return t;
  }
  return -1;
}

namespace {

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

}  // namespace
}  // namespace lftest
