#include "backends/backend.h"

#include "libcomm/detail/collective_args.h"

namespace comm {

Backend::Backend(int rank, int size) : rank_(rank), size_(size) {}
Backend::~Backend() = default;

std::shared_ptr<Work> Backend::all_reduce_into(
    Tensor& output, const Tensor& input, const AllReduceOptions& options) {
  detail::check_out_of_place("all_reduce_into", output, input);
  if (output.data_ptr() != input.data_ptr()) output.copy_(input);
  return all_reduce(output, options);
}

}  // namespace comm
