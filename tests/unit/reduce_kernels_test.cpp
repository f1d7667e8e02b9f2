// The reduction kernels against the scalar reference of support/reference.h,
// for every dtype and op, over counts that cover the empty case, the scalar
// tails around vector widths, and a large buffer.
#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "libcomm/detail/dispatch.h"
#include "libcomm/error.h"
#include "libcomm/reduce_kernels.h"
#include "libcomm/tensor.h"
#include "support/reference.h"

using comm::DType;
using comm::ReduceOp;

namespace {

// Random element bytes for `dtype`: full-range integers (so that SUM and
// PRODUCT overflow), finite floats of moderate size, and bool bytes that are
// sometimes neither 0 nor 1.
std::vector<std::uint8_t> random_bytes(DType dtype, std::size_t count,
                                       std::uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::uint8_t> bytes(count * comm::dtype_size(dtype));
  std::uniform_real_distribution<float> real(-100.0f, 100.0f);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint8_t* slot = bytes.data() + i * comm::dtype_size(dtype);
    switch (dtype) {
      case DType::kF16: {
        std::uint16_t bits = comm::testing::f16_round(real(rng));
        std::memcpy(slot, &bits, 2);
        break;
      }
      case DType::kBF16: {
        std::uint16_t bits = comm::testing::bf16_round(real(rng));
        std::memcpy(slot, &bits, 2);
        break;
      }
      case DType::kF32: {
        float v = real(rng);
        std::memcpy(slot, &v, 4);
        break;
      }
      case DType::kF64: {
        double v = static_cast<double>(real(rng)) * 1.000000001;
        std::memcpy(slot, &v, 8);
        break;
      }
      case DType::kBool:
        *slot = static_cast<std::uint8_t>(rng() % 3 == 0 ? 0 : rng() % 4);
        break;
      default: {
        std::uint64_t v = rng();
        std::memcpy(slot, &v, comm::dtype_size(dtype));
        break;
      }
    }
  }
  return bytes;
}

// Compares element i of the kernel's output with the reference; NaN equals
// NaN whatever the payload.
template <typename T>
bool same_element(ReduceOp op, const std::uint8_t* a_bytes,
                  const std::uint8_t* b_bytes, const std::uint8_t* out_bytes,
                  std::size_t i, std::string* detail) {
  T a, b, out;
  std::memcpy(&a, a_bytes + i * sizeof(T), sizeof(T));
  std::memcpy(&b, b_bytes + i * sizeof(T), sizeof(T));
  std::memcpy(&out, out_bytes + i * sizeof(T), sizeof(T));
  if constexpr (std::is_same_v<T, comm::Float16> ||
                std::is_same_v<T, comm::BFloat16>) {
    constexpr bool kHalf = std::is_same_v<T, comm::Float16>;
    auto value = [](T x) {
      return kHalf ? comm::testing::f16_value(x.bits)
                   : comm::testing::bf16_value(x.bits);
    };
    const float wide = static_cast<float>(
        comm::testing::float_reference(op, value(a), value(b)));
    const std::uint16_t expected = kHalf ? comm::testing::f16_round(wide)
                                         : comm::testing::bf16_round(wide);
    const float got = value(out);
    const float want = kHalf ? comm::testing::f16_value(expected)
                             : comm::testing::bf16_value(expected);
    if ((std::isnan(got) && std::isnan(want)) || out.bits == expected) {
      return true;
    }
    *detail = std::to_string(value(a)) + " op " + std::to_string(value(b)) +
              " gave " + std::to_string(got) + ", expected " +
              std::to_string(want);
    return false;
  } else if constexpr (std::is_floating_point_v<T>) {
    const T want = static_cast<T>(comm::testing::float_reference(op, a, b));
    if ((std::isnan(out) && std::isnan(want)) || out == want) return true;
    *detail = std::to_string(a) + " op " + std::to_string(b) + " gave " +
              std::to_string(out) + ", expected " + std::to_string(want);
    return false;
  } else if constexpr (std::is_same_v<T, bool>) {
    // Never reached: bool bytes are checked by same_bool, since they need
    // not be 0 or 1. The branch keeps dispatch_dtype's instantiation whole.
    return true;
  } else {
    const T want = comm::testing::int_reference(op, a, b);
    if (out == want) return true;
    *detail = std::to_string(+a) + " op " + std::to_string(+b) + " gave " +
              std::to_string(+out) + ", expected " + std::to_string(+want);
    return false;
  }
}

bool same_bool(ReduceOp op, std::uint8_t a, std::uint8_t b, std::uint8_t out,
               std::string* detail) {
  const std::uint8_t want = comm::testing::bool_reference(op, a != 0, b != 0);
  if (out == want) return true;
  *detail = std::to_string(a) + " op " + std::to_string(b) + " gave byte " +
            std::to_string(out) + ", expected " + std::to_string(want);
  return false;
}

bool op_valid(ReduceOp op, DType dtype) {
  if (comm::is_bitwise(op) && comm::is_floating(dtype)) return false;
  return !(op == ReduceOp::kAvg && dtype == DType::kBool);
}

}  // namespace

TEST_CASE("every dtype and op matches the scalar reference", "[reduce]") {
  const std::size_t count = GENERATE(0u, 1u, 7u, 1023u, 1u << 20);
  // reduce_into (the result replaces a), and reduce() into a third buffer
  // or into b.
  enum class Form { kIntoA, kApart, kIntoB };
  const Form form = GENERATE(Form::kIntoA, Form::kApart, Form::kIntoB);
  for (DType dtype : comm::kAllDTypes) {
    for (ReduceOp op : comm::kAllReduceOps) {
      if (!op_valid(op, dtype)) continue;
      const auto a = random_bytes(dtype, count, 17 + count);
      const auto b = random_bytes(dtype, count, 91 + count);
      std::vector<std::uint8_t> out;
      if (form == Form::kIntoA) {
        out = a;
        comm::reduce_into(op, dtype, out.data(), b.data(), count);
      } else if (form == Form::kApart) {
        out = random_bytes(dtype, count, 5);
        comm::reduce_pair_into(op, dtype, out.data(), a.data(), b.data(),
                               count);
      } else {
        out = b;
        comm::reduce_pair_into(op, dtype, out.data(), a.data(), out.data(),
                               count);
      }

      std::size_t wrong = 0;
      std::string first;
      for (std::size_t i = 0; i < count; ++i) {
        std::string detail;
        bool ok = dtype == DType::kBool
                      ? same_bool(op, a[i], b[i], out[i], &detail)
                      : comm::detail::dispatch_dtype(dtype, [&]<typename T>() {
                          return same_element<T>(op, a.data(), b.data(),
                                                 out.data(), i, &detail);
                        });
        if (!ok && wrong++ == 0) {
          first = "element " + std::to_string(i) + ": " + detail;
        }
      }
      INFO(comm::dtype_name(dtype)
           << " " << comm::reduce_op_name(op) << " count " << count << " form "
           << static_cast<int>(form) << ": " << first);
      CHECK(wrong == 0);
    }
  }
}

TEST_CASE("MIN and MAX propagate NaN from either side", "[reduce]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    // 37 elements: NaN at positions that land in vector bodies and tails.
    std::vector<float> dst(37, 1.0f), src(37, 2.0f);
    dst[0] = nan;
    src[5] = nan;
    dst[33] = nan;
    src[33] = nan;
    src[36] = nan;
    comm::reduce_into(op, DType::kF32, dst.data(), src.data(), dst.size());
    for (std::size_t i = 0; i < dst.size(); ++i) {
      const bool expect_nan = i == 0 || i == 5 || i == 33 || i == 36;
      INFO(comm::reduce_op_name(op) << " element " << i);
      CHECK(std::isnan(dst[i]) == expect_nan);
      if (!expect_nan) CHECK(dst[i] == (op == ReduceOp::kMin ? 1.0f : 2.0f));
    }
  }
  SECTION("half types too") {
    std::vector<comm::Float16> h = {comm::Float16(nan), comm::Float16(3.0f)};
    std::vector<comm::Float16> g = {comm::Float16(1.0f), comm::Float16(nan)};
    comm::reduce_into(ReduceOp::kMax, DType::kF16, h.data(), g.data(), 2);
    CHECK(std::isnan(static_cast<float>(h[0])));
    CHECK(std::isnan(static_cast<float>(h[1])));
    std::vector<comm::BFloat16> x = {comm::BFloat16(nan), comm::BFloat16(3.0f)};
    std::vector<comm::BFloat16> y = {comm::BFloat16(1.0f), comm::BFloat16(nan)};
    comm::reduce_into(ReduceOp::kMin, DType::kBF16, x.data(), y.data(), 2);
    CHECK(std::isnan(static_cast<float>(x[0])));
    CHECK(std::isnan(static_cast<float>(x[1])));
  }
  SECTION("and double") {
    std::vector<double> d = {std::nan(""), 4.0}, e = {1.0, std::nan("")};
    comm::reduce_into(ReduceOp::kMin, DType::kF64, d.data(), e.data(), 2);
    CHECK(std::isnan(d[0]));
    CHECK(std::isnan(d[1]));
  }
}

TEST_CASE("a float16 NaN result has one bit pattern, whichever kernel runs",
          "[reduce]") {
  // Quiet and signalling NaNs with payloads, of both signs, against numbers
  // and each other; 40 elements, so that vector bodies and tails both see
  // them. The portable kernel (COMM_REDUCE_KERNELS=portable) and the F16C
  // one must write the same bits, or ranks on different CPUs would disagree.
  const std::uint16_t nans[] = {0x7E00, 0x7C01, 0x7D55, 0xFE01, 0xFC3F};
  std::vector<std::uint16_t> a(40), b(40);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = nans[i % 5];
    b[i] = i % 3 == 0 ? nans[(i + 2) % 5] : std::uint16_t{0x3C00};  // 1.0
  }
  for (ReduceOp op :
       {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
    std::vector<std::uint16_t> out(a.size());
    comm::reduce_pair_into(op, DType::kF16, out.data(), a.data(), b.data(),
                           out.size());
    for (std::size_t i = 0; i < out.size(); ++i) {
      INFO(comm::reduce_op_name(op) << " element " << i);
      CHECK((out[i] & 0x7FFFu) == 0x7E00u);
    }
  }
}

TEST_CASE("integer SUM and PRODUCT wrap around", "[reduce]") {
  std::vector<std::int32_t> a = {INT32_MAX, INT32_MIN, 65536, -7};
  std::vector<std::int32_t> b = {1, -1, 65536, 3};
  auto sum = a;
  comm::reduce_into(ReduceOp::kSum, DType::kI32, sum.data(), b.data(), 4);
  CHECK(sum == std::vector<std::int32_t>{INT32_MIN, INT32_MAX, 131072, -4});
  auto product = a;
  comm::reduce_into(ReduceOp::kProduct, DType::kI32, product.data(), b.data(),
                    4);
  CHECK(product == std::vector<std::int32_t>{INT32_MAX, INT32_MIN, 0, -21});

  std::vector<std::int8_t> c = {127, -128, -128}, d = {1, -1, -128};
  auto c_sum = c;
  comm::reduce_into(ReduceOp::kSum, DType::kI8, c_sum.data(), d.data(), 3);
  CHECK(c_sum == std::vector<std::int8_t>{-128, 127, 0});
  auto c_product = c;
  comm::reduce_into(ReduceOp::kProduct, DType::kI8, c_product.data(), d.data(),
                    3);
  CHECK(c_product == std::vector<std::int8_t>{127, -128, 0});

  std::vector<std::uint8_t> u = {255, 16}, v = {1, 16};
  comm::reduce_into(ReduceOp::kSum, DType::kU8, u.data(), v.data(), 2);
  CHECK(u == std::vector<std::uint8_t>{0, 32});

  std::vector<std::int64_t> l = {INT64_MAX, INT64_MIN}, m = {1, INT64_MIN};
  comm::reduce_into(ReduceOp::kProduct, DType::kI64, l.data(), m.data(), 2);
  CHECK(l == std::vector<std::int64_t>{INT64_MAX, 0});
}

TEST_CASE("bitwise ops on floating types are InvalidArgument", "[reduce]") {
  float x = 1.0f, y = 2.0f;
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32, DType::kF64}) {
    for (ReduceOp op : {ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor}) {
      CHECK_THROWS_AS(comm::reduce_into(op, dtype, &x, &y, 1),
                      comm::InvalidArgument);
    }
  }
  CHECK_THROWS_WITH(comm::reduce_into(ReduceOp::kBxor, DType::kF32, &x, &y, 1),
                    Catch::Contains("bxor") && Catch::Contains("float32"));
  CHECK(x == 1.0f);  // nothing was written
}

TEST_CASE("AVG on bool is InvalidArgument", "[reduce]") {
  std::uint8_t a = 1, b = 0;
  CHECK_THROWS_AS(comm::reduce_into(ReduceOp::kAvg, DType::kBool, &a, &b, 1),
                  comm::InvalidArgument);
}

TEST_CASE("AVG is SUM then divide_by", "[reduce]") {
  std::vector<float> f = {1.0f, 2.0f, -3.0f}, g = {2.0f, 2.0f, 0.0f};
  comm::reduce_into(ReduceOp::kAvg, DType::kF32, f.data(), g.data(), 3);
  comm::divide_by(DType::kF32, f.data(), 3, 2);
  CHECK(f == std::vector<float>{1.5f, 2.0f, -1.5f});

  std::vector<std::int32_t> i = {7, -7, 100};
  comm::divide_by(DType::kI32, i.data(), 3, 2);
  CHECK(i == std::vector<std::int32_t>{3, -3, 50});  // toward zero

  std::vector<std::int8_t> small = {100, -100};
  comm::divide_by(DType::kI8, small.data(), 2, 300);  // divisor beyond int8
  CHECK(small == std::vector<std::int8_t>{0, 0});

  std::vector<comm::Float16> h = {comm::Float16(3.0f)};
  comm::divide_by(DType::kF16, h.data(), 1, 4);
  CHECK(static_cast<float>(h[0]) == 0.75f);

  CHECK_THROWS_AS(comm::divide_by(DType::kF32, f.data(), 3, 0),
                  comm::InvalidArgument);
}

TEST_CASE("the tensor overload checks its arguments", "[reduce]") {
  auto a = comm::Tensor::full({4, 3}, 1.0, DType::kF32);
  auto b = comm::Tensor::full({4, 3}, 2.0, DType::kF32);
  comm::reduce_into(ReduceOp::kSum, a, b);
  CHECK(a.data<float>()[11] == 3.0f);

  auto wrong_dtype = comm::Tensor::zeros({4, 3}, DType::kF64);
  CHECK_THROWS_AS(comm::reduce_into(ReduceOp::kSum, a, wrong_dtype),
                  comm::InvalidArgument);
  auto wrong_count = comm::Tensor::zeros({5}, DType::kF32);
  CHECK_THROWS_AS(comm::reduce_into(ReduceOp::kSum, a, wrong_count),
                  comm::InvalidArgument);

  // Every other row of an 8x3 tensor: 4x3, but not contiguous.
  auto tall = comm::Tensor::zeros({8, 3}, DType::kF32);
  auto strided =
      comm::Tensor::from_blob(tall.data_ptr(), {4, 3}, {6, 1}, DType::kF32);
  CHECK_THROWS_WITH(comm::reduce_into(ReduceOp::kSum, a, strided),
                    Catch::Contains("[4, 3]") && Catch::Contains("[6, 1]"));
}
