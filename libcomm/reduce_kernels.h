// The element-wise reduction kernels behind reduce, all_reduce and
// reduce_scatter: dst[i] = op(dst[i], src[i]), or out of place
// dst[i] = op(a[i], b[i]).
//
// Semantics, the same for every backend that uses these kernels:
// - Float16 and BFloat16 are widened to float, combined, and rounded back to
//   nearest even.
// - Integer SUM and PRODUCT wrap around on overflow (two's complement).
// - MIN and MAX propagate NaN: if either input is NaN, so is the result.
// - AVG accumulates like SUM; the caller divides once by the number of
//   contributions at the end with divide_by(), or, for float16
//   (averages_divided_first), divides each contribution before the sum.
// - BAND, BOR, BXOR are for integer and bool tensors only.
// - On bool tensors any non-zero byte is true and results are 0 or 1.
#pragma once

#include <cstddef>
#include <cstdint>

#include "libcomm/dtype.h"
#include "libcomm/export.h"
#include "libcomm/reduce_op.h"

namespace comm {

class Tensor;

// Throws InvalidArgument naming both when `op` is not defined on `dtype`:
// a bitwise op on a floating type, or AVG on bool.
COMM_API void check_reduce_op(ReduceOp op, DType dtype);

// dst[i] = op(dst[i], src[i]) for i in [0, count). dst and src are host
// memory and must not partly overlap (they may be equal).
COMM_API void reduce_into(ReduceOp op, DType dtype, void* dst, const void* src,
                          std::size_t count);

// dst[i] = op(a[i], b[i]) for i in [0, count): an out-of-place reduction
// that reads each operand once. dst may be a or b; no two of the three may
// partly overlap.
COMM_API void reduce_pair_into(ReduceOp op, DType dtype, void* dst,
                               const void* a, const void* b, std::size_t count);

// The same on tensors: both contiguous, on the CPU, of one dtype and numel.
COMM_API void reduce_into(ReduceOp op, Tensor& dst, const Tensor& src);

// Whether AVG on `dtype` divides each contribution by their number before
// the sum rather than the sum after it: float16 only, whose range (65504)
// a sum of n contributions would overflow where their average fits. NCCL's
// average divides first too (it premultiplies every floating type); the
// other types sum first, which their range holds, and round once more, in
// the division.
constexpr bool averages_divided_first(DType dtype) {
  return dtype == DType::kF16;
}

// data[i] /= divisor, the last step of AVG; divisor > 0. Floating types divide
// exactly (the half types in float); integers truncate toward zero.
COMM_API void divide_by(DType dtype, void* data, std::size_t count,
                        std::int64_t divisor);

}  // namespace comm
