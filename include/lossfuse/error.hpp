// lossfuse: the one error type. Every message names the argument, what was expected and what was given.
#pragma once

#include <stdexcept>
#include <string>

namespace lossfuse {

enum class ErrorCode {
  invalid_value,    // an option or size outside its domain (Python: ValueError)
  shape_mismatch,   // shapes that do not agree (Python: ValueError / RuntimeError)
  dtype_mismatch,   // unsupported or inconsistent element types (Python: RuntimeError)
  index_error,      // a class target out of range (Python: IndexError)
  bad_pointer,      // null, misaligned or aliasing buffers
  not_implemented,  // a (kind, dtype, device, direction) the catalog does not provide
  device_error,     // a device runtime call failed, e.g. out of device memory (Python: RuntimeError)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, std::string argument, std::string expected, std::string actual);

  [[nodiscard]] ErrorCode code() const noexcept { return code_; }
  [[nodiscard]] const std::string& argument() const noexcept { return argument_; }
  [[nodiscard]] const std::string& expected() const noexcept { return expected_; }
  [[nodiscard]] const std::string& actual() const noexcept { return actual_; }

 private:
  ErrorCode code_;
  std::string argument_, expected_, actual_;
};

}  // namespace lossfuse
