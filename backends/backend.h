// comm::Backend: what a communication backend (TCP, NCCL, a third party's)
// implements. ProcessGroup forwards to it; users call ProcessGroup.
//
// Contract for every operation:
// - It is issued in the same order on every rank of the group (as in c10d);
//   operations of one rank run in the order they were issued.
// - It returns at once with a Work; the tensors it was given stay alive
//   until the Work completes, and must not be touched by the caller before.
// - Arguments that cannot work (a root outside the group, a non-contiguous
//   tensor, tensors of different sizes) throw InvalidArgument right away,
//   naming what was wrong, before anything is sent.
// - Failures found while running (a dead peer, a mismatch with another
//   rank's call, a timeout) fail the Work.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "libcomm/export.h"
#include "libcomm/options.h"
#include "libcomm/tensor.h"
#include "libcomm/work.h"

namespace comm {

class COMM_API Backend {
 public:
  Backend(int rank, int size);
  virtual ~Backend();
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string name() const = 0;

  // `tensor` on the root is sent to every rank's `tensor`.
  virtual std::shared_ptr<Work> broadcast(Tensor& tensor,
                                          const BroadcastOptions& options) = 0;
  // The root's `tensor` becomes op over every rank's `tensor`; the others'
  // tensors may be used as scratch and are unspecified afterwards.
  virtual std::shared_ptr<Work> reduce(Tensor& tensor,
                                       const ReduceOptions& options) = 0;
  // Every rank's `tensor` becomes op over every rank's `tensor`, bitwise
  // identical on every rank.
  virtual std::shared_ptr<Work> all_reduce(Tensor& tensor,
                                           const AllReduceOptions& options) = 0;
  // Out of place, as NCCL's and MPI's: every rank's `output` becomes op over
  // every rank's `input`, which is left as it was. The two match in dtype,
  // count and device, and are the same memory exactly (the in-place call)
  // or apart. The default copies `input` into `output` when the call is
  // made and reduces in place; a backend that can read the input where it
  // lies overrides it and saves a pass over the data.
  virtual std::shared_ptr<Work> all_reduce_into(
      Tensor& output, const Tensor& input, const AllReduceOptions& options);
  // outputs[r] on every rank receives rank r's `input`.
  virtual std::shared_ptr<Work> all_gather(std::vector<Tensor>& outputs,
                                           const Tensor& input,
                                           const AllGatherOptions& options) = 0;
  // The same into one tensor of size() * input.numel() elements, rank r's
  // input at rows [r * n, (r + 1) * n) of dimension 0 (flattened).
  virtual std::shared_ptr<Work> all_gather_into(
      Tensor& output, const Tensor& input, const AllGatherOptions& options) = 0;
  // On the root, outputs[r] receives rank r's `input`; elsewhere `outputs`
  // must be empty.
  virtual std::shared_ptr<Work> gather(std::vector<Tensor>& outputs,
                                       const Tensor& input,
                                       const GatherOptions& options) = 0;
  // Every rank's `output` receives the root's inputs[rank]; elsewhere
  // `inputs` must be empty.
  virtual std::shared_ptr<Work> scatter(Tensor& output,
                                        const std::vector<Tensor>& inputs,
                                        const ScatterOptions& options) = 0;
  // `output` receives op over every rank's inputs[rank].
  virtual std::shared_ptr<Work> reduce_scatter(
      Tensor& output, const std::vector<Tensor>& inputs,
      const ReduceScatterOptions& options) = 0;
  // Rows of `input` go to each rank in order, and rows from each rank fill
  // `output` in order; see AllToAllOptions for the split sizes. `output`
  // may be `input` itself (in place).
  virtual std::shared_ptr<Work> all_to_all(Tensor& output, const Tensor& input,
                                           const AllToAllOptions& options) = 0;
  // Completes once every rank has entered the barrier.
  virtual std::shared_ptr<Work> barrier(const BarrierOptions& options) = 0;
  // Point-to-point. A receive from kAnySource reports the sender through
  // Work::source_rank().
  virtual std::shared_ptr<Work> send(const Tensor& tensor, int dst,
                                     const SendOptions& options) = 0;
  virtual std::shared_ptr<Work> recv(Tensor& tensor, int src,
                                     const RecvOptions& options) = 0;

  // Fails every pending Work with an error saying the group was shut down,
  // closes connections and joins background threads. Idempotent; the
  // destructor calls it. Operations issued afterwards throw BackendError.
  virtual void shutdown() = 0;

 private:
  int rank_;
  int size_;
};

}  // namespace comm
