// comm::Backend: what a communication backend (TCP, NCCL, a third party's)
// implements. ProcessGroup routes each call to the backend that serves the
// device of its tensors; users call ProcessGroup.
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

  // Each public call checks its arguments, the same way for every backend,
  // and then calls the backend's do_ function of the same name, which may
  // rely on them: every tensor is defined and contiguous, lists hold one
  // tensor per rank (or none off the root) matching in dtype and number of
  // elements, roots and peers are ranks of the group, the reduce op is
  // defined on the dtype, and an out-of-place pair is one tensor or two
  // apart. A backend adds only the checks of its own (devices it serves,
  // ops it lacks).

  // `tensor` on the root is sent to every rank's `tensor`.
  std::shared_ptr<Work> broadcast(Tensor& tensor,
                                  const BroadcastOptions& options);
  // The root's `tensor` becomes op over every rank's `tensor`; the others'
  // tensors may be used as scratch and are unspecified afterwards.
  std::shared_ptr<Work> reduce(Tensor& tensor, const ReduceOptions& options);
  // Every rank's `tensor` becomes op over every rank's `tensor`, bitwise
  // identical on every rank.
  std::shared_ptr<Work> all_reduce(Tensor& tensor,
                                   const AllReduceOptions& options);
  // Out of place, as NCCL's and MPI's: every rank's `output` becomes op over
  // every rank's `input`, which is left as it was. The two match in dtype,
  // count and device, and are the same memory exactly (the in-place call)
  // or apart.
  std::shared_ptr<Work> all_reduce_into(Tensor& output, const Tensor& input,
                                        const AllReduceOptions& options);
  // outputs[r] on every rank receives rank r's `input`.
  std::shared_ptr<Work> all_gather(std::vector<Tensor>& outputs,
                                   const Tensor& input,
                                   const AllGatherOptions& options);
  // The same into one tensor of size() * input.numel() elements, rank r's
  // input at rows [r * n, (r + 1) * n) of dimension 0 (flattened).
  std::shared_ptr<Work> all_gather_into(Tensor& output, const Tensor& input,
                                        const AllGatherOptions& options);
  // On the root, outputs[r] receives rank r's `input`; elsewhere `outputs`
  // must be empty.
  std::shared_ptr<Work> gather(std::vector<Tensor>& outputs,
                               const Tensor& input,
                               const GatherOptions& options);
  // Every rank's `output` receives the root's inputs[rank]; elsewhere
  // `inputs` must be empty.
  std::shared_ptr<Work> scatter(Tensor& output,
                                const std::vector<Tensor>& inputs,
                                const ScatterOptions& options);
  // `output` receives op over every rank's inputs[rank].
  std::shared_ptr<Work> reduce_scatter(Tensor& output,
                                       const std::vector<Tensor>& inputs,
                                       const ReduceScatterOptions& options);
  // Rows of `input` go to each rank in order, and rows from each rank fill
  // `output` in order; see AllToAllOptions for the split sizes. `output`
  // may be `input` itself (in place).
  std::shared_ptr<Work> all_to_all(Tensor& output, const Tensor& input,
                                   const AllToAllOptions& options);
  // Completes once every rank has entered the barrier.
  std::shared_ptr<Work> barrier(const BarrierOptions& options);
  // Point-to-point with another rank of the group. A receive from
  // kAnySource reports the sender through Work::source_rank().
  std::shared_ptr<Work> send(const Tensor& tensor, int dst,
                             const SendOptions& options);
  std::shared_ptr<Work> recv(Tensor& tensor, int src,
                             const RecvOptions& options);

  // Fails every pending Work with an error saying the group was shut down,
  // closes connections and joins background threads. Idempotent; the
  // destructor calls it. Operations issued afterwards throw BackendError.
  virtual void shutdown() = 0;

 private:
  // What each backend implements, called with checked arguments (see
  // above).
  virtual std::shared_ptr<Work> do_broadcast(
      Tensor& tensor, const BroadcastOptions& options) = 0;
  virtual std::shared_ptr<Work> do_reduce(Tensor& tensor,
                                          const ReduceOptions& options) = 0;
  virtual std::shared_ptr<Work> do_all_reduce(
      Tensor& tensor, const AllReduceOptions& options) = 0;
  // The default copies `input` into `output` when the call is made and
  // reduces in place; a backend that can read the input where it lies
  // overrides it and saves a pass over the data.
  virtual std::shared_ptr<Work> do_all_reduce_into(
      Tensor& output, const Tensor& input, const AllReduceOptions& options);
  virtual std::shared_ptr<Work> do_all_gather(
      std::vector<Tensor>& outputs, const Tensor& input,
      const AllGatherOptions& options) = 0;
  virtual std::shared_ptr<Work> do_all_gather_into(
      Tensor& output, const Tensor& input, const AllGatherOptions& options) = 0;
  virtual std::shared_ptr<Work> do_gather(std::vector<Tensor>& outputs,
                                          const Tensor& input,
                                          const GatherOptions& options) = 0;
  virtual std::shared_ptr<Work> do_scatter(Tensor& output,
                                           const std::vector<Tensor>& inputs,
                                           const ScatterOptions& options) = 0;
  virtual std::shared_ptr<Work> do_reduce_scatter(
      Tensor& output, const std::vector<Tensor>& inputs,
      const ReduceScatterOptions& options) = 0;
  virtual std::shared_ptr<Work> do_all_to_all(
      Tensor& output, const Tensor& input, const AllToAllOptions& options) = 0;
  virtual std::shared_ptr<Work> do_barrier(const BarrierOptions& options) = 0;
  virtual std::shared_ptr<Work> do_send(const Tensor& tensor, int dst,
                                        const SendOptions& options) = 0;
  virtual std::shared_ptr<Work> do_recv(Tensor& tensor, int src,
                                        const RecvOptions& options) = 0;

  int rank_;
  int size_;
};

}  // namespace comm
