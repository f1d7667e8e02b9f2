// comm::nccl::flat_blocks on host tensors: when the NCCL backend may hand
// a list of tensors to NCCL as one flat buffer, and when it must stage.
#include <catch2/catch.hpp>

#include "backends/nccl/flat_blocks.h"

using comm::DType;
using comm::Tensor;
using comm::nccl::flat_blocks;

namespace {

// The four blocks of 8 floats of `buffer`, as views.
std::vector<Tensor> blocks_of(const Tensor& buffer) {
  std::vector<Tensor> blocks;
  for (int r = 0; r < 4; ++r) blocks.push_back(buffer.slice(r * 8, r * 8 + 8));
  return blocks;
}

}  // namespace

TEST_CASE("consecutive blocks of one buffer are used where they lie",
          "[nccl]") {
  Tensor buffer = Tensor::zeros({32}, DType::kF32);
  Tensor elsewhere = Tensor::zeros({8}, DType::kF32);
  const auto blocks = blocks_of(buffer);
  for (int rank = 0; rank < 4; ++rank) {
    CHECK(flat_blocks(blocks, elsewhere.data_ptr(), rank) == buffer.data_ptr());
    // In place: the other buffer is exactly this rank's block.
    CHECK(flat_blocks(blocks, blocks[rank].data_ptr(), rank) ==
          buffer.data_ptr());
  }
}

TEST_CASE("an other buffer inside the blocks but not this rank's is staged",
          "[nccl]") {
  Tensor buffer = Tensor::zeros({40}, DType::kF32);
  const auto blocks = blocks_of(buffer);
  // Another rank's block.
  CHECK(flat_blocks(blocks, blocks[2].data_ptr(), 1) == nullptr);
  // Straddling two blocks, and overlapping the start or the end.
  CHECK(flat_blocks(blocks, buffer.slice(4, 12).data_ptr(), 0) == nullptr);
  Tensor before = Tensor::zeros({40}, DType::kF32);
  const auto late_blocks =
      std::vector<Tensor>{before.slice(4, 12), before.slice(12, 20),
                          before.slice(20, 28), before.slice(28, 36)};
  CHECK(flat_blocks(late_blocks, before.data_ptr(), 0) == nullptr);
  CHECK(flat_blocks(blocks, buffer.slice(28, 36).data_ptr(), 3) == nullptr);
  // Just past the end is outside.
  CHECK(flat_blocks(blocks, buffer.slice(32, 40).data_ptr(), 0) ==
        buffer.data_ptr());
}

TEST_CASE("blocks that are not one flat buffer are staged", "[nccl]") {
  Tensor buffer = Tensor::zeros({64}, DType::kF32);
  Tensor elsewhere = Tensor::zeros({8}, DType::kF32);
  // A gap between blocks.
  CHECK(flat_blocks({buffer.slice(0, 8), buffer.slice(16, 24)},
                    elsewhere.data_ptr(), 0) == nullptr);
  // Out of order.
  CHECK(flat_blocks({buffer.slice(8, 16), buffer.slice(0, 8)},
                    elsewhere.data_ptr(), 0) == nullptr);
  // Separate tensors.
  Tensor a = Tensor::zeros({8}, DType::kF32);
  Tensor b = Tensor::zeros({8}, DType::kF32);
  CHECK(flat_blocks({a, b}, elsewhere.data_ptr(), 0) == nullptr);
  // A block that is not contiguous.
  Tensor matrix = Tensor::zeros({4, 4}, DType::kF32);
  Tensor column = Tensor::from_blob(matrix.data_ptr(), {4}, {4}, DType::kF32,
                                    comm::Device::cpu(), [](void*) {});
  CHECK(flat_blocks({column}, elsewhere.data_ptr(), 0) == nullptr);
  CHECK(flat_blocks({}, elsewhere.data_ptr(), 0) == nullptr);
}

TEST_CASE("zero-byte blocks at one address are one flat buffer", "[nccl]") {
  Tensor buffer = Tensor::zeros({8}, DType::kF32);
  const std::vector<Tensor> empty{buffer.slice(2, 2), buffer.slice(2, 2)};
  Tensor other = buffer.slice(2, 2);
  CHECK(flat_blocks(empty, other.data_ptr(), 1) == empty[0].data_ptr());
}
