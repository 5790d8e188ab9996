// lossfuse: element types of tensor views.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace lossfuse {

// Floating types carry logits, probabilities and losses; integer types carry class targets.
enum class DType : std::uint8_t { f32, f64, f16, bf16, u8, i8, i16, i32, i64 };

inline constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16, DType::u8,
                                       DType::i8,  DType::i16, DType::i32, DType::i64};
inline constexpr DType kFloatDTypes[] = {DType::f32, DType::f64, DType::f16, DType::bf16};
inline constexpr DType kIntDTypes[] = {DType::u8, DType::i8, DType::i16, DType::i32, DType::i64};

constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16:
    case DType::i16: return 2;
    case DType::u8:
    case DType::i8: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType t) noexcept {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}
constexpr bool is_integer(DType t) noexcept { return !is_floating(t); }

// The type losses, log-sum-exps and upstream gradients are kept in for a given input type:
// float64 for float64 inputs, float32 for everything else.
constexpr DType accumulate_dtype(DType t) noexcept { return t == DType::f64 ? DType::f64 : DType::f32; }

constexpr std::string_view dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::u8: return "uint8";
    case DType::i8: return "int8";
    case DType::i16: return "int16";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
  }
  return "?";
}

enum class Device : std::uint8_t { cpu, cuda };

constexpr std::string_view device_name(Device d) noexcept { return d == Device::cpu ? "cpu" : "cuda"; }

}  // namespace lossfuse
