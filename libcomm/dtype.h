// Element types of tensors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "libcomm/export.h"
#include "libcomm/half.h"

namespace comm {

enum class DType : std::uint8_t {
  kF16,
  kBF16,
  kF32,
  kF64,
  kI8,
  kU8,
  kI32,
  kI64,
  kBool,
};

inline constexpr std::array<DType, 9> kAllDTypes = {
    DType::kF16, DType::kBF16, DType::kF32, DType::kF64, DType::kI8,
    DType::kU8,  DType::kI32,  DType::kI64, DType::kBool};

// Bytes per element.
constexpr std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool: return 1;
  }
  return 0;
}

constexpr bool is_floating(DType dtype) {
  return dtype == DType::kF16 || dtype == DType::kBF16 ||
         dtype == DType::kF32 || dtype == DType::kF64;
}

// The canonical name: float16, bfloat16, float32, float64, int8, uint8, int32,
// int64, bool.
COMM_API const char* dtype_name(DType dtype);

// Parses a canonical name or one of the aliases that nccl-tests and PyTorch
// use (half, float, double, int, long, char, ...). Throws InvalidArgument
// naming the text and the accepted names otherwise.
COMM_API DType parse_dtype(std::string_view text);

// The DType of a C++ element type; Float16 and BFloat16 stand for the half
// types and bool for kBool (stored as one byte holding 0 or 1).
template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<Float16>() {
  return DType::kF16;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::kBF16;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::kF64;
}
template <>
constexpr DType dtype_of<std::int8_t>() {
  return DType::kI8;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::kU8;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::kI64;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::kBool;
}

}  // namespace comm
