#include "libcomm/detail/collective_args.h"

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "libcomm/cuda.h"
#include "libcomm/error.h"

namespace comm::detail {

namespace {

// The CUDA devices this process sees, asked once: the answer does not
// change while the process runs.
int visible_cuda_devices() {
  static const int count = cuda_device_count();
  return count;
}

}  // namespace

void check_tensor(const Tensor& tensor, std::string_view op,
                  std::string_view role) {
  if (tensor.defined() && tensor.is_contiguous() &&
      (tensor.device().is_cpu() ||
       tensor.device().index < visible_cuda_devices())) {
    return;
  }
  std::string name(op);
  if (!role.empty()) name.append(" ").append(role);
  if (!tensor.defined()) {
    throw InvalidArgument(name + " got an undefined tensor");
  }
  tensor.check_contiguous(name);
  const int visible = visible_cuda_devices();
  throw InvalidArgument(
      name + ": " + tensor.describe() +
      " is on a device that does not exist: this process sees " +
      std::to_string(visible) + " CUDA device" + (visible == 1 ? "" : "s") +
      (visible == 0 ? ""
                    : " (cuda:0 to cuda:" + std::to_string(visible - 1) + ")") +
      "; pass a tensor on a device that exists");
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto* a0 = static_cast<const std::uint8_t*>(a.data_ptr());
  const auto* b0 = static_cast<const std::uint8_t*>(b.data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

void check_out_of_place(std::string_view op, const Tensor& output,
                        const Tensor& input) {
  check_tensor(output, op, "output");
  check_tensor(input, op, "input");
  if (output.dtype() != input.dtype() || output.numel() != input.numel()) {
    throw InvalidArgument(std::string(op) + ": the output (" +
                          std::string(dtype_name(output.dtype())) + " x " +
                          std::to_string(output.numel()) +
                          ") must match the input (" +
                          std::string(dtype_name(input.dtype())) + " x " +
                          std::to_string(input.numel()) + ")");
  }
  if (output.device() != input.device()) {
    throw InvalidArgument(std::string(op) + ": the output is on " +
                          output.device().str() + " but the input on " +
                          input.device().str() + "; put both on one device");
  }
  if (output.data_ptr() != input.data_ptr() && overlaps(output, input)) {
    throw InvalidArgument(std::string(op) +
                          ": the output and the input overlap in part; "
                          "pass the same tensor twice for the in-place call, "
                          "or tensors apart");
  }
}

void check_root(std::string_view op, int root, int size) {
  if (root < 0 || root >= size) {
    throw InvalidArgument(std::string(op) + ": root " + std::to_string(root) +
                          " is outside the group of " + std::to_string(size) +
                          " ranks");
  }
}

void check_tensor_list(std::string_view op, const std::vector<Tensor>& list,
                       std::size_t expected, const Tensor& like,
                       const char* role) {
  if (list.size() != expected) {
    throw InvalidArgument(
        expected == 0
            ? std::string(op) + ": only the root passes " + role +
                  " tensors; this rank passed " + std::to_string(list.size())
            : std::string(op) + " needs one " + role + " tensor per rank (" +
                  std::to_string(expected) + "), got " +
                  std::to_string(list.size()));
  }
  for (const Tensor& t : list) {
    check_tensor(t, op);
    if (t.dtype() != like.dtype() || t.numel() != like.numel()) {
      throw InvalidArgument(std::string(op) + ": " + role + " " + t.describe() +
                            " does not match " + like.describe());
    }
  }
  if (std::string_view(role) == "output") check_apart(op, list);
}

void check_apart(std::string_view op, const std::vector<Tensor>& outputs) {
  const auto refuse = [&](std::size_t i, std::size_t j) {
    throw InvalidArgument(
        std::string(op) + ": outputs " + std::to_string(std::min(i, j)) +
        " and " + std::to_string(std::max(i, j)) +
        " share memory, so one rank's result would overwrite another's; "
        "pass a tensor of its own for each rank");
  };
  const auto shared = [&](std::size_t i, std::size_t j) {
    return outputs[i].device() == outputs[j].device() &&
           overlaps(outputs[i], outputs[j]);
  };
  // A small list is compared pair by pair, without allocating: this runs
  // on every call.
  constexpr std::size_t kPairwise = 16;
  if (outputs.size() <= kPairwise) {
    for (std::size_t i = 1; i < outputs.size(); ++i) {
      for (std::size_t j = 0; j < i; ++j) {
        if (shared(i, j)) refuse(i, j);
      }
    }
    return;
  }
  // Sorted by device and start, an output that shares memory with one
  // sorted before it shares it with the furthest-ending output before it
  // on its device; empty outputs share nothing and are passed over.
  std::vector<std::size_t> order(outputs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto start = [&](std::size_t i) {
    return reinterpret_cast<std::uintptr_t>(outputs[i].data_ptr());
  };
  const auto key = [&](std::size_t i) {
    const Device device = outputs[i].device();
    return std::tuple(device.is_cuda(), device.index, start(i));
  };
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return key(a) < key(b); });
  std::size_t reach = order.front();  // the furthest-ending so far
  for (std::size_t k = 1; k < order.size(); ++k) {
    const std::size_t i = order[k];
    if (outputs[i].nbytes() == 0) continue;
    if (outputs[reach].device() != outputs[i].device()) {
      reach = i;
      continue;
    }
    if (shared(i, reach)) refuse(i, reach);
    if (start(i) + outputs[i].nbytes() >
        start(reach) + outputs[reach].nbytes()) {
      reach = i;
    }
  }
}

namespace {

// Throws unless `given` splits `t` into `size` blocks of rows (see
// check_all_to_all).
void check_splits(const std::vector<std::int64_t>& given, const Tensor& t,
                  int size, const char* which) {
  const auto n = static_cast<std::size_t>(size);
  const std::int64_t rows = t.size(0);
  // Without split sizes every rank gets as many rows.
  if (given.empty()) {
    if (rows % size == 0) return;
    throw InvalidArgument(std::string("all_to_all: ") + which + " " +
                          t.describe() + " has " + std::to_string(rows) +
                          " rows, not divisible by the group size " +
                          std::to_string(size) + "; pass split sizes");
  }
  // Each count is checked against the total before it is added, so the sum
  // cannot overflow.
  bool fits = given.size() == n;
  std::int64_t sum = 0;
  for (std::size_t p = 0; fits && p < n; ++p) {
    const std::int64_t block = given[p];
    fits = block >= 0 && block <= rows - sum;
    if (fits) sum += block;
  }
  if (!fits || sum != rows) {
    throw InvalidArgument(std::string("all_to_all: ") + which +
                          " split sizes must be one non-negative row count "
                          "per rank adding up to " +
                          std::to_string(rows));
  }
}

// Fills `offsets` and `counts` with the blocks of `t` that check_splits
// accepted, in elements.
void split(const std::vector<std::int64_t>& given, const Tensor& t, int size,
           std::span<std::size_t> offsets, std::span<std::size_t> counts) {
  const std::int64_t rows = t.size(0);
  const std::size_t row = rows == 0 ? 0
                                    : static_cast<std::size_t>(t.numel()) /
                                          static_cast<std::size_t>(rows);
  if (given.empty()) {
    // rows / size is exact: check_splits refused the rest.
    const std::size_t each = static_cast<std::size_t>(rows / size) * row;
    for (std::size_t p = 0; p < offsets.size(); ++p) {
      offsets[p] = p * each;
      counts[p] = each;
    }
    return;
  }
  std::size_t at = 0;
  for (std::size_t p = 0; p < offsets.size(); ++p) {
    offsets[p] = at;
    counts[p] = static_cast<std::size_t>(given[p]) * row;
    at += counts[p];
  }
}

}  // namespace

void check_all_to_all(const Tensor& output, const Tensor& input,
                      const std::vector<std::int64_t>& input_rows,
                      const std::vector<std::int64_t>& output_rows, int size) {
  check_tensor(input, "all_to_all");
  check_tensor(output, "all_to_all");
  if (input.dtype() != output.dtype() || input.dim() == 0 ||
      output.dim() == 0) {
    throw InvalidArgument(
        "all_to_all: input " + input.describe() + " and output " +
        output.describe() +
        " must share a dtype and have at least one dimension");
  }
  check_splits(input_rows, input, size, "input");
  check_splits(output_rows, output, size, "output");
}

AllToAllLayout all_to_all_layout(const Tensor& output, const Tensor& input,
                                 const std::vector<std::int64_t>& input_rows,
                                 const std::vector<std::int64_t>& output_rows,
                                 int size) {
  AllToAllLayout layout(size);
  split(input_rows, input, size, layout.send_offsets(), layout.send_counts());
  split(output_rows, output, size, layout.receive_offsets(),
        layout.receive_counts());
  return layout;
}

}  // namespace comm::detail
