// Calls a generic lambda with the C++ element type of a DType:
//   dispatch_dtype(dtype, [&]<typename T>() { ... T ... });
// Float16 and BFloat16 stand for the half types, bool for kBool.
#pragma once

#include <cstdint>

#include "libcomm/dtype.h"

namespace comm::detail {

template <typename F>
decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF16: return f.template operator()<Float16>();
    case DType::kBF16: return f.template operator()<BFloat16>();
    case DType::kF32: return f.template operator()<float>();
    case DType::kF64: return f.template operator()<double>();
    case DType::kI8: return f.template operator()<std::int8_t>();
    case DType::kU8: return f.template operator()<std::uint8_t>();
    case DType::kI32: return f.template operator()<std::int32_t>();
    case DType::kI64: return f.template operator()<std::int64_t>();
    case DType::kBool: return f.template operator()<bool>();
  }
  return f.template operator()<float>();  // unreachable for valid dtypes
}

// Converts a double to T the way Tensor::full does: half types round to
// nearest, bool is "non-zero", integers truncate toward zero.
template <typename T>
T from_double(double value) {
  if constexpr (std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, bool>) {
    return value != 0.0;
  } else {
    return static_cast<T>(value);
  }
}

}  // namespace comm::detail
