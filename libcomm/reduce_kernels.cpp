// This file is compiled at -O3 (see meson.build) so that GCC vectorises the
// loops below for unknown trip counts. Each loop body is branch-free: the
// operators are written with conditional selects that become vector blends.
#include "libcomm/reduce_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "libcomm/enum_param.h"
#include "libcomm/error.h"
#include "libcomm/tensor.h"

namespace comm {
namespace {

const EnumParam kReduceKernels{
    "COMM_REDUCE_KERNELS",
    {"auto", "portable"},
    "auto",
    "portable keeps the reduction kernels on their portable loops"};

// Two's-complement arithmetic without signed overflow: compute in the
// unsigned type of the same width, whose overflow is defined.
template <typename T>
using Wide = std::make_unsigned_t<T>;

template <typename T>
T wrap_add(T a, T b) {
  return static_cast<T>(
      static_cast<Wide<T>>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b)));
}

template <typename T>
T wrap_mul(T a, T b) {
  // Promote 8-bit operands to unsigned int, not int, so the product of two
  // 255s cannot overflow a signed type either.
  using Promoted =
      std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, Wide<T>>;
  return static_cast<T>(static_cast<Wide<T>>(
      static_cast<Promoted>(static_cast<Promoted>(static_cast<Wide<T>>(a)) *
                            static_cast<Promoted>(static_cast<Wide<T>>(b)))));
}

template <typename T>
T nan_min(T a, T b) {
  const T smaller = b < a ? b : a;
  // a + b is NaN when either is; the select stays branch-free.
  return (a != a || b != b) ? a + b : smaller;
}

template <typename T>
T nan_max(T a, T b) {
  const T larger = b > a ? b : a;
  return (a != a || b != b) ? a + b : larger;
}

// The operator on values of the arithmetic type T (float for the half types).
template <ReduceOp kOp, typename T>
T combine(T a, T b) {
  if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kAvg) {
    if constexpr (std::is_integral_v<T>)
      return wrap_add(a, b);
    else
      return a + b;
  } else if constexpr (kOp == ReduceOp::kProduct) {
    if constexpr (std::is_integral_v<T>)
      return wrap_mul(a, b);
    else
      return a * b;
  } else if constexpr (kOp == ReduceOp::kMin) {
    if constexpr (std::is_integral_v<T>)
      return b < a ? b : a;
    else
      return nan_min(a, b);
  } else if constexpr (kOp == ReduceOp::kMax) {
    if constexpr (std::is_integral_v<T>)
      return b > a ? b : a;
    else
      return nan_max(a, b);
  } else if constexpr (kOp == ReduceOp::kBand) {
    return static_cast<T>(a & b);
  } else if constexpr (kOp == ReduceOp::kBor) {
    return static_cast<T>(a | b);
  } else {
    static_assert(kOp == ReduceOp::kBxor);
    return static_cast<T>(a ^ b);
  }
}

// One element of each operand, as stored, to one result.
template <ReduceOp kOp, typename T>
struct Plain {
  static T apply(T a, T b) { return combine<kOp>(a, b); }
};

// The half types travel as their 16-bit patterns and are combined in float.
template <ReduceOp kOp, float (*kWiden)(std::uint16_t),
          std::uint16_t (*kNarrow)(float)>
struct Half {
  static std::uint16_t apply(std::uint16_t a, std::uint16_t b) {
    return kNarrow(combine<kOp>(kWiden(a), kWiden(b)));
  }
};

// bool: read bytes as truth values, so that a byte other than 0 or 1 (from
// DLPack or from_blob) never reaches a C++ bool. SUM and MAX are "or",
// PRODUCT and MIN are "and".
template <ReduceOp kOp>
struct Bool {
  static std::uint8_t apply(std::uint8_t x, std::uint8_t y) {
    const std::uint8_t a = x != 0;
    const std::uint8_t b = y != 0;
    if constexpr (kOp == ReduceOp::kSum || kOp == ReduceOp::kMax ||
                  kOp == ReduceOp::kBor) {
      return a | b;
    } else if constexpr (kOp == ReduceOp::kProduct || kOp == ReduceOp::kMin ||
                         kOp == ReduceOp::kBand) {
      return a & b;
    } else {
      return a ^ b;
    }
  }
};

// dst[i] = a[i] op b[i]. The in-place loop is kept apart so that the
// compiler vectorises it without the aliasing check that dst == a fails.
// Always inlined, so that each caller compiles it for its own target.
template <typename Element, typename T>
[[gnu::always_inline]] inline void apply_loop(T* dst, const T* a, const T* b,
                                              std::size_t count) {
  if (dst == a) {
    for (std::size_t i = 0; i < count; ++i)
      dst[i] = Element::apply(dst[i], b[i]);
  } else {
    for (std::size_t i = 0; i < count; ++i) dst[i] = Element::apply(a[i], b[i]);
  }
}

template <typename Element, typename T>
void apply_all(void* dst, const void* a, const void* b, std::size_t count) {
  apply_loop<Element>(static_cast<T*>(dst), static_cast<const T*>(a),
                      static_cast<const T*>(b), count);
}

#if defined(__x86_64__)
// Every loop, compiled a second time for CPUs with AVX2 and F16C
// (x86-64-v3) and chosen at run time: 32-byte vectors instead of 16, and
// float16 widened by F16C's instruction. Each element is one IEEE operation
// either way, and narrowing stays the portable half_bits code, which gives
// every NaN the one pattern, so both versions produce the same bits.
// COMM_REDUCE_KERNELS=portable keeps the portable loops (the unit tests
// run both ways).
#define COMM_X86_64_V3 __attribute__((target("avx2,f16c,fma")))

bool use_x86_64_v3_kernels() {
  static const bool supported = __builtin_cpu_supports("avx2") &&
                                __builtin_cpu_supports("f16c") &&
                                __builtin_cpu_supports("fma");
  // As a string_view, the words' lengths differ before any byte is compared.
  return supported && std::string_view(kReduceKernels.get()) != "portable";
}

template <typename Element, typename T>
COMM_X86_64_V3 void apply_all_v3(void* dst, const void* a, const void* b,
                                 std::size_t count) {
  apply_loop<Element>(static_cast<T*>(dst), static_cast<const T*>(a),
                      static_cast<const T*>(b), count);
}

COMM_X86_64_V3 void widen_float16_v3(float* out, const std::uint16_t* in,
                                     std::size_t count) {
  std::size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i halves =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(halves));
  }
  for (; i < count; ++i) out[i] = half_bits::half_to_float(in[i]);
}

// float16 in blocks: both operands are widened into float before any of
// the block is written, so dst may be a or b.
template <ReduceOp kOp>
COMM_X86_64_V3 void reduce_float16_v3(void* dst_bytes, const void* a_bytes,
                                      const void* b_bytes, std::size_t count) {
  auto* dst = static_cast<std::uint16_t*>(dst_bytes);
  const auto* a = static_cast<const std::uint16_t*>(a_bytes);
  const auto* b = static_cast<const std::uint16_t*>(b_bytes);
  constexpr std::size_t kBlock = 512;
  alignas(32) float x[kBlock];
  alignas(32) float y[kBlock];
  for (std::size_t start = 0; start < count; start += kBlock) {
    const std::size_t n = std::min(kBlock, count - start);
    widen_float16_v3(x, a + start, n);
    widen_float16_v3(y, b + start, n);
    for (std::size_t i = 0; i < n; ++i) {
      dst[start + i] = half_bits::float_to_half(combine<kOp>(x[i], y[i]));
    }
  }
}
#endif

// dst = a op b over `count` elements of T, with the x86-64-v3 loop where
// the CPU has it.
template <typename Element, typename T>
void apply_best(void* dst, const void* a, const void* b, std::size_t count) {
#if defined(__x86_64__)
  if (use_x86_64_v3_kernels())
    return apply_all_v3<Element, T>(dst, a, b, count);
#endif
  apply_all<Element, T>(dst, a, b, count);
}

template <ReduceOp kOp>
void reduce_dtype(DType dtype, void* dst, const void* a, const void* b,
                  std::size_t count) {
  switch (dtype) {
    case DType::kBool:
      return apply_best<Bool<kOp>, std::uint8_t>(dst, a, b, count);
    case DType::kI8:
      return apply_best<Plain<kOp, std::int8_t>, std::int8_t>(dst, a, b, count);
    case DType::kU8:
      return apply_best<Plain<kOp, std::uint8_t>, std::uint8_t>(dst, a, b,
                                                                count);
    case DType::kI32:
      return apply_best<Plain<kOp, std::int32_t>, std::int32_t>(dst, a, b,
                                                                count);
    case DType::kI64:
      return apply_best<Plain<kOp, std::int64_t>, std::int64_t>(dst, a, b,
                                                                count);
    default: break;
  }
  // Bitwise operators on floating types were rejected by check_reduce_op;
  // this keeps them from being instantiated at all.
  if constexpr (!is_bitwise(kOp)) {
    switch (dtype) {
      case DType::kF32:
        return apply_best<Plain<kOp, float>, float>(dst, a, b, count);
      case DType::kF64:
        return apply_best<Plain<kOp, double>, double>(dst, a, b, count);
      case DType::kF16:
#if defined(__x86_64__)
        if (use_x86_64_v3_kernels())
          return reduce_float16_v3<kOp>(dst, a, b, count);
#endif
        return apply_all<
            Half<kOp, half_bits::half_to_float, half_bits::float_to_half>,
            std::uint16_t>(dst, a, b, count);
      case DType::kBF16:
        return apply_best<Half<kOp, half_bits::bfloat16_to_float,
                               half_bits::float_to_bfloat16>,
                          std::uint16_t>(dst, a, b, count);
      default: break;
    }
  }
}

template <typename T>
void divide_plain(T* data, std::size_t count, std::int64_t divisor) {
  if constexpr (std::is_floating_point_v<T>) {
    const T d = static_cast<T>(divisor);
    for (std::size_t i = 0; i < count; ++i) data[i] /= d;
  } else {
    // Divide in 64 bits: the divisor need not fit in T.
    for (std::size_t i = 0; i < count; ++i) {
      data[i] = static_cast<T>(static_cast<std::int64_t>(data[i]) / divisor);
    }
  }
}

template <float (*kWiden)(std::uint16_t), std::uint16_t (*kNarrow)(float)>
void divide_half(std::uint16_t* data, std::size_t count, std::int64_t divisor) {
  const float d = static_cast<float>(divisor);
  for (std::size_t i = 0; i < count; ++i)
    data[i] = kNarrow(kWiden(data[i]) / d);
}

}  // namespace

void check_reduce_op(ReduceOp op, DType dtype) {
  if (is_bitwise(op) && is_floating(dtype)) {
    throw InvalidArgument(std::string("reduce op ") + reduce_op_name(op) +
                          " is bitwise and not defined on " +
                          dtype_name(dtype) +
                          " tensors; use an integer or bool dtype, or one of "
                          "sum, avg, prod, min, max");
  }
  if (op == ReduceOp::kAvg && dtype == DType::kBool) {
    throw InvalidArgument(
        "reduce op avg is not defined on bool tensors; use sum (logical or) "
        "or prod (logical and)");
  }
}

void reduce_pair_into(ReduceOp op, DType dtype, void* dst, const void* a,
                      const void* b, std::size_t count) {
  check_reduce_op(op, dtype);
  if (count == 0) return;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return reduce_dtype<ReduceOp::kSum>(dtype, dst, a, b, count);
    case ReduceOp::kProduct:
      return reduce_dtype<ReduceOp::kProduct>(dtype, dst, a, b, count);
    case ReduceOp::kMin:
      return reduce_dtype<ReduceOp::kMin>(dtype, dst, a, b, count);
    case ReduceOp::kMax:
      return reduce_dtype<ReduceOp::kMax>(dtype, dst, a, b, count);
    case ReduceOp::kBand:
      return reduce_dtype<ReduceOp::kBand>(dtype, dst, a, b, count);
    case ReduceOp::kBor:
      return reduce_dtype<ReduceOp::kBor>(dtype, dst, a, b, count);
    case ReduceOp::kBxor:
      return reduce_dtype<ReduceOp::kBxor>(dtype, dst, a, b, count);
  }
}

void reduce_into(ReduceOp op, DType dtype, void* dst, const void* src,
                 std::size_t count) {
  reduce_pair_into(op, dtype, dst, dst, src, count);
}

void reduce_into(ReduceOp op, Tensor& dst, const Tensor& src) {
  if (dst.dtype() != src.dtype() || dst.numel() != src.numel()) {
    throw InvalidArgument("reduce_into: destination " + dst.describe() +
                          " and source " + src.describe() +
                          " must have the same dtype and number of elements");
  }
  if (!dst.device().is_cpu() || !src.device().is_cpu()) {
    throw InvalidArgument("reduce_into: the CPU kernels got " + dst.describe() +
                          " and " + src.describe() +
                          "; stage CUDA tensors through host memory first");
  }
  dst.check_contiguous("reduce_into");
  src.check_contiguous("reduce_into");
  reduce_into(op, dst.dtype(), dst.data_ptr(), src.data_ptr(),
              static_cast<std::size_t>(dst.numel()));
}

void divide_by(DType dtype, void* data, std::size_t count,
               std::int64_t divisor) {
  if (divisor <= 0) {
    throw InvalidArgument("divide_by: the divisor must be positive, got " +
                          std::to_string(divisor));
  }
  switch (dtype) {
    case DType::kF16:
      return divide_half<half_bits::half_to_float, half_bits::float_to_half>(
          static_cast<std::uint16_t*>(data), count, divisor);
    case DType::kBF16:
      return divide_half<half_bits::bfloat16_to_float,
                         half_bits::float_to_bfloat16>(
          static_cast<std::uint16_t*>(data), count, divisor);
    case DType::kF32:
      return divide_plain(static_cast<float*>(data), count, divisor);
    case DType::kF64:
      return divide_plain(static_cast<double*>(data), count, divisor);
    case DType::kI8:
      return divide_plain(static_cast<std::int8_t*>(data), count, divisor);
    case DType::kU8:
      return divide_plain(static_cast<std::uint8_t*>(data), count, divisor);
    case DType::kI32:
      return divide_plain(static_cast<std::int32_t*>(data), count, divisor);
    case DType::kI64:
      return divide_plain(static_cast<std::int64_t*>(data), count, divisor);
    case DType::kBool:
      throw InvalidArgument("divide_by: bool tensors cannot be averaged");
  }
}

}  // namespace comm
