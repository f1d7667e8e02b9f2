// The half-type conversions against the compiler's _Float16 and an
// independent bfloat16 rounding.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "libcomm/half.h"
#include "support/reference.h"

using comm::half_bits::bfloat16_to_float;
using comm::half_bits::float_to_bfloat16;
using comm::half_bits::float_to_half;
using comm::half_bits::half_to_float;

TEST_CASE("every float16 widens exactly", "[half]") {
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float ours = half_to_float(static_cast<std::uint16_t>(bits));
    const float want =
        comm::testing::f16_value(static_cast<std::uint16_t>(bits));
    if (std::isnan(want)) {
      REQUIRE(std::isnan(ours));
    } else {
      INFO("bits " << bits);
      REQUIRE(std::bit_cast<std::uint32_t>(ours) ==
              std::bit_cast<std::uint32_t>(want));
    }
  }
}

TEST_CASE("float16 narrowing rounds to nearest even", "[half]") {
  // Every float16 value and the midpoints between neighbours (the ties),
  // then random floats of every magnitude.
  for (std::uint32_t bits = 0; bits < 0x7C00; ++bits) {
    const float value = half_to_float(static_cast<std::uint16_t>(bits));
    const float next = half_to_float(static_cast<std::uint16_t>(bits + 1));
    for (float f : {value, -value, (value + next) / 2}) {
      INFO("float " << f);
      REQUIRE(float_to_half(f) == comm::testing::f16_round(f));
    }
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 1000000; ++i) {
    const float f = std::bit_cast<float>(static_cast<std::uint32_t>(rng()));
    INFO("float bits " << std::bit_cast<std::uint32_t>(f));
    if (std::isnan(f)) {
      REQUIRE(std::isnan(half_to_float(float_to_half(f))));
    } else {
      REQUIRE(float_to_half(f) == comm::testing::f16_round(f));
    }
  }
  CHECK(float_to_half(1e6f) == 0x7C00);  // overflow to infinity
  CHECK(float_to_half(-INFINITY) == 0xFC00);
  CHECK(float_to_half(1e-9f) == 0);  // underflow to zero
}

TEST_CASE("bfloat16 conversions round to nearest even", "[half]") {
  for (std::uint32_t bits = 0; bits <= 0xFFFF; ++bits) {
    const float f = bfloat16_to_float(static_cast<std::uint16_t>(bits));
    REQUIRE(std::bit_cast<std::uint32_t>(f) ==
            std::bit_cast<std::uint32_t>(
                comm::testing::bf16_value(static_cast<std::uint16_t>(bits))));
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 1000000; ++i) {
    // Magnitudes below the largest finite bfloat16, where the reference is
    // defined; overflow is checked separately.
    const float f =
        std::bit_cast<float>(static_cast<std::uint32_t>(rng()) & 0xBF7FFFFFu);
    INFO("float bits " << std::bit_cast<std::uint32_t>(f));
    REQUIRE(float_to_bfloat16(f) == comm::testing::bf16_round(f));
  }
  CHECK(float_to_bfloat16(1.00390625f) == 0x3F80);  // tie, stays even
  CHECK(float_to_bfloat16(1.01171875f) == 0x3F82);  // tie, rounds up to even
  CHECK(float_to_bfloat16(3.4e38f) == 0x7F80);      // rounds to infinity
  CHECK(std::isnan(bfloat16_to_float(float_to_bfloat16(NAN))));
}
