// The Highway target LOSSFUSE_TEST_TARGET asks for: 0 when unset, -1 when not compiled in or not supported.
#pragma once

#include <cstdint>

namespace lftest {
std::int64_t requested_target();
}  // namespace lftest
