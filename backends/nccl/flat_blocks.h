// Whether a list of tensors can be handed to NCCL as one flat buffer.
//
// NCCL's all_gather writes, and its reduce_scatter reads, the blocks of all
// ranks as one buffer, block r at r times the block size. The NCCL backend
// passes a list of tensors where it lies when the list already is such a
// buffer, and stages it otherwise. Header-only, with no CUDA in it, so that
// the unit tests check it on any machine.
#pragma once

#include <cstdint>
#include <vector>

#include "libcomm/tensor.h"

namespace comm::nccl {

// The start of `blocks` when they are the consecutive equal blocks of one
// flat buffer (block r at start + r times its size, each contiguous), else
// null. `other` is the operation's other buffer, of one block's size (an
// all_gather's input, a reduce_scatter's output): NCCL works in place only
// when it is exactly this rank's block, so a flat buffer that `other`
// overlaps anywhere else is refused too. Zero-byte blocks are one flat
// buffer when they all start at the same address.
inline void* flat_blocks(const std::vector<Tensor>& blocks, const void* other,
                         int rank) {
  if (blocks.empty()) return nullptr;
  const auto start = reinterpret_cast<std::uintptr_t>(blocks[0].data_ptr());
  const std::uintptr_t bytes = blocks[0].nbytes();
  for (std::size_t r = 0; r < blocks.size(); ++r) {
    if (!blocks[r].is_contiguous() || blocks[r].nbytes() != bytes ||
        reinterpret_cast<std::uintptr_t>(blocks[r].data_ptr()) !=
            start + r * bytes) {
      return nullptr;
    }
  }
  const std::uintptr_t end = start + bytes * blocks.size();
  const auto at = reinterpret_cast<std::uintptr_t>(other);
  const bool outside = at + bytes <= start || at >= end;
  const bool own_block =
      at == start + static_cast<std::uintptr_t>(rank) * bytes;
  return outside || own_block ? blocks[0].data_ptr() : nullptr;
}

}  // namespace comm::nccl
