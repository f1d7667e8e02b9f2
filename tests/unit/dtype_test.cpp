#include <catch2/catch.hpp>

#include "libcomm/dtype.h"
#include "libcomm/error.h"
#include "libcomm/reduce_op.h"

TEST_CASE("dtype names parse back, with nccl-tests aliases", "[dtype]") {
  for (comm::DType dtype : comm::kAllDTypes) {
    CHECK(comm::parse_dtype(comm::dtype_name(dtype)) == dtype);
  }
  CHECK(comm::parse_dtype("float") == comm::DType::kF32);
  CHECK(comm::parse_dtype("half") == comm::DType::kF16);
  CHECK(comm::parse_dtype("DOUBLE") == comm::DType::kF64);
  CHECK(comm::parse_dtype("int") == comm::DType::kI32);
  CHECK(comm::dtype_size(comm::DType::kBF16) == 2);
  CHECK(comm::dtype_size(comm::DType::kI64) == 8);
  CHECK_THROWS_WITH(
      comm::parse_dtype("complex64"),
      Catch::Contains("complex64") && Catch::Contains("bfloat16"));
}

TEST_CASE("reduce op names parse back", "[dtype]") {
  for (comm::ReduceOp op : comm::kAllReduceOps) {
    CHECK(comm::parse_reduce_op(comm::reduce_op_name(op)) == op);
  }
  CHECK(comm::parse_reduce_op("Product") == comm::ReduceOp::kProduct);
  CHECK_THROWS_AS(comm::parse_reduce_op("mean"), comm::InvalidArgument);
}
