// Scalar reference semantics for the reduction tests, written independently
// of libcomm's kernels: integers in 64-bit arithmetic reduced modulo 2^bits,
// floats in double (exact for one add or multiply of two floats) rounded
// once, Float16 rounded by the compiler's _Float16, BFloat16 by comparing
// the two neighbouring candidates in double.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "libcomm/dtype.h"
#include "libcomm/reduce_op.h"

namespace comm::testing {

inline float f16_value(std::uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return static_cast<float>(h);
}

// libcomm computes half types in float, so a result is rounded to float
// first and then to the half type; the references do the same.
inline std::uint16_t f16_round(float value) {
  _Float16 h = static_cast<_Float16>(value);
  std::uint16_t bits;
  std::memcpy(&bits, &h, 2);
  return bits;
}

inline float bf16_value(std::uint16_t bits) {
  std::uint32_t word = static_cast<std::uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &word, 4);
  return f;
}

inline std::uint16_t bf16_round(float value) {
  std::uint32_t word;
  std::memcpy(&word, &value, 4);
  if (std::isnan(value)) return static_cast<std::uint16_t>((word >> 16) | 0x40);
  const std::uint16_t low = static_cast<std::uint16_t>(word >> 16);
  const std::uint16_t high = static_cast<std::uint16_t>(low + 1);
  const double exact = value;
  const double below = std::fabs(exact - bf16_value(low));
  const double above = std::fabs(bf16_value(high) - exact);
  if (below < above) return low;
  if (above < below) return high;
  return (low & 1) == 0 ? low : high;
}

// The result of op on two integers of type T, with wrap-around.
template <typename T>
T int_reference(ReduceOp op, T a, T b) {
  const std::int64_t x = a;
  const std::int64_t y = b;
  std::int64_t r = 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      r = static_cast<std::int64_t>(static_cast<std::uint64_t>(x) +
                                    static_cast<std::uint64_t>(y));
      break;
    case ReduceOp::kProduct:
      r = static_cast<std::int64_t>(static_cast<std::uint64_t>(x) *
                                    static_cast<std::uint64_t>(y));
      break;
    case ReduceOp::kMin: r = x < y ? x : y; break;
    case ReduceOp::kMax: r = x > y ? x : y; break;
    case ReduceOp::kBand: r = x & y; break;
    case ReduceOp::kBor: r = x | y; break;
    case ReduceOp::kBxor: r = x ^ y; break;
  }
  // Keep the low bits: the two's-complement wrap of the exact result.
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<std::uint64_t>(r)));
}

// The result of op on two floats, in double, before rounding to the type.
inline double float_reference(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin:
      if (std::isnan(a) || std::isnan(b)) return std::nan("");
      return a < b ? a : b;
    case ReduceOp::kMax:
      if (std::isnan(a) || std::isnan(b)) return std::nan("");
      return a > b ? a : b;
    default: return std::nan("");
  }
}

inline bool bool_reference(ReduceOp op, bool a, bool b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor: return a || b;
    case ReduceOp::kProduct:
    case ReduceOp::kMin:
    case ReduceOp::kBand: return a && b;
    case ReduceOp::kBxor: return a != b;
    default: return false;
  }
}

}  // namespace comm::testing
