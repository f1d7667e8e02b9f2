#include "libcomm/reduce_op.h"

#include <string>

#include "libcomm/detail/strings.h"
#include "libcomm/error.h"

namespace comm {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kProduct: return "prod";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  return "invalid-op";
}

ReduceOp parse_reduce_op(std::string_view text) {
  const std::string lower = detail::lowercase(text);
  if (lower == "product") return ReduceOp::kProduct;
  for (ReduceOp op : kAllReduceOps) {
    if (lower == reduce_op_name(op)) return op;
  }
  throw InvalidArgument("'" + std::string(text) +
                        "' is not a reduce op; use one of sum, avg, prod, "
                        "min, max, band, bor, bxor");
}

}  // namespace comm
