#include "lossfuse/error.hpp"

#include <utility>

namespace lossfuse {

Error::Error(ErrorCode code, std::string argument, std::string expected, std::string actual)
    : std::runtime_error("lossfuse: " + argument + ": expected " + expected + ", got " + actual),
      code_(code),
      argument_(std::move(argument)),
      expected_(std::move(expected)),
      actual_(std::move(actual)) {}

}  // namespace lossfuse
