#include "backends/backend.h"

#include "libcomm/detail/collective_args.h"
#include "libcomm/error.h"
#include "libcomm/reduce_kernels.h"

namespace comm {

using detail::check_root;
using detail::check_tensor;
using detail::check_tensor_list;

namespace {

// The number of tensors a rooted call's list holds on this rank: one per
// rank on the root, none elsewhere.
std::size_t rooted_list_size(int rank, int root, int size) {
  return rank == root ? static_cast<std::size_t>(size) : 0;
}

// `peer` is another rank of the group, or kAnySource where `any` allows it.
void check_peer(const char* op, const char* role, int peer, int rank, int size,
                bool any) {
  if (any && peer == kAnySource) return;
  if (peer < 0 || peer >= size || peer == rank) {
    throw InvalidArgument(
        std::string(op) + ": " + role + " " + std::to_string(peer) +
        " is not another rank of the group of " + std::to_string(size) +
        (any ? " (or kAnySource)" : ""));
  }
}

}  // namespace

Backend::Backend(int rank, int size) : rank_(rank), size_(size) {}
Backend::~Backend() = default;

std::shared_ptr<Work> Backend::broadcast(Tensor& tensor,
                                         const BroadcastOptions& options) {
  check_tensor(tensor, "broadcast");
  check_root("broadcast", options.root, size_);
  return do_broadcast(tensor, options);
}

std::shared_ptr<Work> Backend::reduce(Tensor& tensor,
                                      const ReduceOptions& options) {
  check_tensor(tensor, "reduce");
  check_reduce_op(options.op, tensor.dtype());
  check_root("reduce", options.root, size_);
  return do_reduce(tensor, options);
}

std::shared_ptr<Work> Backend::all_reduce(Tensor& tensor,
                                          const AllReduceOptions& options) {
  check_tensor(tensor, "all_reduce");
  check_reduce_op(options.op, tensor.dtype());
  return do_all_reduce(tensor, options);
}

std::shared_ptr<Work> Backend::all_reduce_into(
    Tensor& output, const Tensor& input, const AllReduceOptions& options) {
  detail::check_out_of_place("all_reduce_into", output, input);
  check_reduce_op(options.op, input.dtype());
  return do_all_reduce_into(output, input, options);
}

std::shared_ptr<Work> Backend::do_all_reduce_into(
    Tensor& output, const Tensor& input, const AllReduceOptions& options) {
  if (output.data_ptr() != input.data_ptr()) output.copy_(input);
  return do_all_reduce(output, options);
}

std::shared_ptr<Work> Backend::all_gather(std::vector<Tensor>& outputs,
                                          const Tensor& input,
                                          const AllGatherOptions& options) {
  check_tensor(input, "all_gather");
  check_tensor_list("all_gather", outputs, static_cast<std::size_t>(size_),
                    input, "output");
  return do_all_gather(outputs, input, options);
}

std::shared_ptr<Work> Backend::all_gather_into(
    Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  check_tensor(input, "all_gather_into", "input");
  check_tensor(output, "all_gather_into", "output");
  if (output.dtype() != input.dtype() ||
      output.numel() != input.numel() * size_) {
    throw InvalidArgument("all_gather_into: output " + output.describe() +
                          " must have the input's dtype and " +
                          std::to_string(size_) + " times its " +
                          std::to_string(input.numel()) + " elements");
  }
  return do_all_gather_into(output, input, options);
}

std::shared_ptr<Work> Backend::gather(std::vector<Tensor>& outputs,
                                      const Tensor& input,
                                      const GatherOptions& options) {
  check_tensor(input, "gather");
  check_root("gather", options.root, size_);
  check_tensor_list("gather", outputs,
                    rooted_list_size(rank_, options.root, size_), input,
                    "output");
  return do_gather(outputs, input, options);
}

std::shared_ptr<Work> Backend::scatter(Tensor& output,
                                       const std::vector<Tensor>& inputs,
                                       const ScatterOptions& options) {
  check_tensor(output, "scatter");
  check_root("scatter", options.root, size_);
  check_tensor_list("scatter", inputs,
                    rooted_list_size(rank_, options.root, size_), output,
                    "input");
  return do_scatter(output, inputs, options);
}

std::shared_ptr<Work> Backend::reduce_scatter(
    Tensor& output, const std::vector<Tensor>& inputs,
    const ReduceScatterOptions& options) {
  check_tensor(output, "reduce_scatter");
  check_reduce_op(options.op, output.dtype());
  check_tensor_list("reduce_scatter", inputs, static_cast<std::size_t>(size_),
                    output, "input");
  return do_reduce_scatter(output, inputs, options);
}

std::shared_ptr<Work> Backend::all_to_all(Tensor& output, const Tensor& input,
                                          const AllToAllOptions& options) {
  // The backend builds the blocks' layout it runs the call with.
  detail::check_all_to_all(output, input, options.input_split_sizes,
                           options.output_split_sizes, size_);
  return do_all_to_all(output, input, options);
}

std::shared_ptr<Work> Backend::barrier(const BarrierOptions& options) {
  return do_barrier(options);
}

std::shared_ptr<Work> Backend::send(const Tensor& tensor, int dst,
                                    const SendOptions& options) {
  check_tensor(tensor, "send");
  check_peer("send", "destination", dst, rank_, size_, false);
  return do_send(tensor, dst, options);
}

std::shared_ptr<Work> Backend::recv(Tensor& tensor, int src,
                                    const RecvOptions& options) {
  check_tensor(tensor, "recv");
  check_peer("recv", "source", src, rank_, size_, true);
  return do_recv(tensor, src, options);
}

}  // namespace comm
