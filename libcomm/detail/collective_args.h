// The argument checks every backend makes before it starts an operation, so
// that the same mistake gets the same message whichever backend runs it.
// Each throws InvalidArgument naming the operation and what was wrong.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "libcomm/tensor.h"

namespace comm::detail {

// Defined, contiguous, and in host memory or on a CUDA device this process
// sees. The error names "<op> <role>" (or just op); the name is composed
// only when the check fails, since it runs on every call.
void check_tensor(const Tensor& tensor, std::string_view op,
                  std::string_view role = {});

// Whether two tensors share any byte (empty ones share none). Only the
// addresses are compared, so both must be on one device.
bool overlaps(const Tensor& a, const Tensor& b);

// An out-of-place pair: both pass check_tensor, with one dtype, one
// number of elements and one device, and they are either the same memory
// exactly (the in-place call) or apart. As for check_tensor, and for the
// two checks below, `op` becomes a string only in an error.
void check_out_of_place(std::string_view op, const Tensor& output,
                        const Tensor& input);

// `root` is a rank of a group of `size`.
void check_root(std::string_view op, int root, int size);

// `list` holds `expected` tensors (0: this rank passes none, not being the
// root), each passing check_tensor and matching `like` in dtype and number
// of elements; `role` is "input" or "output", and outputs pass
// check_apart.
void check_tensor_list(std::string_view op, const std::vector<Tensor>& list,
                       std::size_t expected, const Tensor& like,
                       const char* role);

// No two of `outputs` share a byte: each receives another rank's data, and
// the ranks write them in no fixed order, so outputs that shared memory
// would end up holding different results on different ranks. Inputs may
// share memory (the same tensor scattered to every rank).
void check_apart(std::string_view op, const std::vector<Tensor>& outputs);

// Where each rank's blocks of an all_to_all lie, in elements until
// scale() makes them bytes: for each rank p, the offset and length of the
// input block sent to p and of the output block received from p. The
// four arrays live in the layout itself for groups of up to kInlineRanks
// ranks, and in one heap allocation for larger ones: a small call would
// otherwise spend a good part of its time in malloc and free.
class AllToAllLayout {
 public:
  static constexpr std::size_t kInlineRanks = 16;

  explicit AllToAllLayout(int size) : size_(static_cast<std::size_t>(size)) {
    if (size_ > kInlineRanks) heap_.resize(4 * size_);
  }
  AllToAllLayout(const AllToAllLayout&) = default;
  AllToAllLayout& operator=(const AllToAllLayout&) = default;
  // A layout moved from describes no ranks: its spans are empty.
  AllToAllLayout(AllToAllLayout&& other) noexcept
      : size_(std::exchange(other.size_, 0)),
        inline_(other.inline_),
        heap_(std::move(other.heap_)) {}
  AllToAllLayout& operator=(AllToAllLayout&& other) noexcept {
    if (this == &other) return *this;
    size_ = std::exchange(other.size_, 0);
    inline_ = other.inline_;
    heap_ = std::move(other.heap_);
    return *this;
  }

  std::span<std::size_t> send_offsets() { return part(0); }
  std::span<std::size_t> send_counts() { return part(1); }
  std::span<std::size_t> receive_offsets() { return part(2); }
  std::span<std::size_t> receive_counts() { return part(3); }
  std::span<const std::size_t> send_offsets() const { return part(0); }
  std::span<const std::size_t> send_counts() const { return part(1); }
  std::span<const std::size_t> receive_offsets() const { return part(2); }
  std::span<const std::size_t> receive_counts() const { return part(3); }

  // Multiplies every offset and count by `factor` (an element's bytes).
  void scale(std::size_t factor) {
    for (std::size_t& entry : std::span(entries(), 4 * size_)) entry *= factor;
  }

 private:
  // Looked up on each access rather than kept as a pointer, so that the
  // layout can be moved (into a task) as it is.
  std::size_t* entries() {
    return size_ > kInlineRanks ? heap_.data() : inline_.data();
  }
  const std::size_t* entries() const {
    return size_ > kInlineRanks ? heap_.data() : inline_.data();
  }
  std::span<std::size_t> part(std::size_t k) {
    return {entries() + k * size_, size_};
  }
  std::span<const std::size_t> part(std::size_t k) const {
    return {entries() + k * size_, size_};
  }

  std::size_t size_;
  std::array<std::size_t, 4 * kInlineRanks> inline_{};
  std::vector<std::size_t> heap_;
};

// Throws InvalidArgument unless an all_to_all's tensors are defined,
// contiguous, of one dtype and at least one dimension, and each is split
// along dimension 0 into `size` blocks: by the row counts given (one per
// rank, adding up to size(0)), or equally when none are given (size(0)
// must then divide by `size`). Allocates nothing.
void check_all_to_all(const Tensor& output, const Tensor& input,
                      const std::vector<std::int64_t>& input_rows,
                      const std::vector<std::int64_t>& output_rows, int size);

// The blocks of an all_to_all whose arguments check_all_to_all accepted,
// as Backend::all_to_all does before any backend runs the call; it checks
// nothing itself.
AllToAllLayout all_to_all_layout(const Tensor& output, const Tensor& input,
                                 const std::vector<std::int64_t>& input_rows,
                                 const std::vector<std::int64_t>& output_rows,
                                 int size);

}  // namespace comm::detail
