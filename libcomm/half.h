// The 16-bit floating types, Float16 (IEEE binary16) and BFloat16, as storage
// types with exact conversions to and from float.
//
// Arithmetic on them happens in float: widen, compute, narrow. Narrowing
// rounds to nearest, ties to even, and keeps NaN a NaN. The conversions are
// branch-free integer and float operations, so loops over arrays of them
// vectorise; they assume the default floating-point environment (no
// flush-to-zero), which is what libcomm runs in.
#pragma once

#include <bit>
#include <cstdint>

namespace comm {

namespace half_bits {

inline float half_to_float(std::uint16_t h) {
  // Move the half's exponent and mantissa to the top of a float's fields,
  // then let a float multiply rebias the exponent (2^-112 = 2^(15-127)). The
  // shifted value is a valid float for every normal and infinite/NaN half.
  const std::uint32_t word = static_cast<std::uint32_t>(h) << 16;
  const std::uint32_t sign = word & 0x80000000u;
  const std::uint32_t magnitude = word << 1;  // sign shifted out
  const float normal =
      std::bit_cast<float>((magnitude >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  // Subnormal halves: place the mantissa in a float whose exponent is that
  // of 0.5 and subtract 0.5; the difference is exact.
  const float subnormal =
      std::bit_cast<float>((magnitude >> 17) | (126u << 23)) - 0.5f;
  const std::uint32_t bits = magnitude < (1u << 27)
                                 ? std::bit_cast<std::uint32_t>(subnormal)
                                 : std::bit_cast<std::uint32_t>(normal);
  return std::bit_cast<float>(sign | bits);
}

inline std::uint16_t float_to_half(float f) {
  const std::uint32_t word = std::bit_cast<std::uint32_t>(f);
  const std::uint32_t sign = word & 0x80000000u;
  const std::uint32_t magnitude = word << 1;
  // Scaling up then down by powers of two sends values too large for a half
  // to infinity while keeping the rest unchanged.
  float base =
      (std::bit_cast<float>(word & 0x7FFFFFFFu) * 0x1.0p+112f) * 0x1.0p-110f;
  // Adding a power of two chosen from the exponent makes the float adder
  // round away exactly the mantissa bits a half cannot hold, to nearest even;
  // subnormal results use the smallest such power.
  std::uint32_t bias = magnitude & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = std::bit_cast<float>((bias >> 1) + 0x07800000u) + base;
  const std::uint32_t rounded = std::bit_cast<std::uint32_t>(base);
  const std::uint32_t exponent = (rounded >> 13) & 0x00007C00u;
  const std::uint32_t mantissa = rounded & 0x00000FFFu;
  const std::uint32_t finite = exponent + mantissa;
  const std::uint32_t is_nan = magnitude > 0xFF000000u;
  return static_cast<std::uint16_t>((sign >> 16) | (is_nan ? 0x7E00u : finite));
}

inline float bfloat16_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

inline std::uint16_t float_to_bfloat16(float f) {
  const std::uint32_t word = std::bit_cast<std::uint32_t>(f);
  const bool is_nan = (word & 0x7FFFFFFFu) > 0x7F800000u;
  // Round to nearest even: add just under half an ulp of the result, plus
  // one more when the kept part is odd. Overflow carries into the exponent,
  // which is right (it rounds up to the next binade or to infinity).
  const std::uint32_t rounded = word + 0x7FFFu + ((word >> 16) & 1u);
  return static_cast<std::uint16_t>(is_nan ? ((word >> 16) | 0x0040u)
                                           : (rounded >> 16));
}

}  // namespace half_bits

struct Float16 {
  std::uint16_t bits = 0;

  Float16() = default;
  explicit Float16(float value) : bits(half_bits::float_to_half(value)) {}
  static Float16 from_bits(std::uint16_t raw) {
    Float16 h;
    h.bits = raw;
    return h;
  }
  explicit operator float() const { return half_bits::half_to_float(bits); }
};

struct BFloat16 {
  std::uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float value) : bits(half_bits::float_to_bfloat16(value)) {}
  static BFloat16 from_bits(std::uint16_t raw) {
    BFloat16 b;
    b.bits = raw;
    return b;
  }
  explicit operator float() const { return half_bits::bfloat16_to_float(bits); }
};

static_assert(sizeof(Float16) == 2 && sizeof(BFloat16) == 2);

}  // namespace comm
