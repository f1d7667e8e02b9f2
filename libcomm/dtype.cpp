#include "libcomm/dtype.h"

#include <string>
#include <utility>

#include "libcomm/detail/strings.h"
#include "libcomm/error.h"

namespace comm {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF32: return "float32";
    case DType::kF64: return "float64";
    case DType::kI8: return "int8";
    case DType::kU8: return "uint8";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kBool: return "bool";
  }
  return "invalid-dtype";
}

DType parse_dtype(std::string_view text) {
  static const std::pair<const char*, DType> kAliases[] = {
      {"half", DType::kF16},  {"fp16", DType::kF16},   {"f16", DType::kF16},
      {"bf16", DType::kBF16}, {"float", DType::kF32},  {"fp32", DType::kF32},
      {"f32", DType::kF32},   {"double", DType::kF64}, {"fp64", DType::kF64},
      {"f64", DType::kF64},   {"char", DType::kI8},    {"i8", DType::kI8},
      {"u8", DType::kU8},     {"int", DType::kI32},    {"i32", DType::kI32},
      {"long", DType::kI64},  {"i64", DType::kI64},
  };
  const std::string lower = detail::lowercase(text);
  for (DType dtype : kAllDTypes) {
    if (lower == dtype_name(dtype)) return dtype;
  }
  for (const auto& [alias, dtype] : kAliases) {
    if (lower == alias) return dtype;
  }
  throw InvalidArgument("'" + std::string(text) +
                        "' is not a dtype; use one of float16 (half), "
                        "bfloat16, float32 (float), float64 (double), int8, "
                        "uint8, int32 (int), int64 (long), bool");
}

}  // namespace comm
