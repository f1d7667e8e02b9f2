// Reduction operators of reduce, all_reduce and reduce_scatter.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "libcomm/export.h"

namespace comm {

// AVG is SUM followed by one division by the number of contributions; on
// float16 each contribution is divided before the sum instead, so that an
// average that fits does not overflow (averages_divided_first in
// reduce_kernels.h).
// BAND, BOR and BXOR are defined for integer and bool tensors only. On bool
// tensors SUM and MAX act as logical or, PRODUCT and MIN as logical and.
enum class ReduceOp : std::uint8_t {
  kSum,
  kAvg,
  kProduct,
  kMin,
  kMax,
  kBand,
  kBor,
  kBxor,
};

inline constexpr std::array<ReduceOp, 8> kAllReduceOps = {
    ReduceOp::kSum, ReduceOp::kAvg,  ReduceOp::kProduct, ReduceOp::kMin,
    ReduceOp::kMax, ReduceOp::kBand, ReduceOp::kBor,     ReduceOp::kBxor};

constexpr bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
}

// sum, avg, prod, min, max, band, bor, bxor (the names nccl-tests prints).
COMM_API const char* reduce_op_name(ReduceOp op);

// Parses the names above, case-insensitively, and "product". Throws
// InvalidArgument naming the text and the accepted names otherwise.
COMM_API ReduceOp parse_reduce_op(std::string_view text);

}  // namespace comm
