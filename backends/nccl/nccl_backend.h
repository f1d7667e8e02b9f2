// comm::NcclBackend: collectives on CUDA tensors through NCCL.
//
// The group's NCCL communicator is created on first use, on the device of
// the first tensor (or cuda:LOCAL_RANK for a barrier that comes first); its
// ncclUniqueId travels through the group's Store. Every operation is issued
// on the group's own CUDA stream, after an event recorded on the caller's
// current stream (comm::current_cuda_stream), so the kernels that produced
// the input run first; its completion is an event of that stream.
//
// Work::wait() without a timeout makes the caller's current stream wait for
// that event and returns without blocking the host (barrier's waits on the
// host); wait(timeout) blocks the host at most `timeout`. The tensors of an
// operation stay referenced until it completes.
//
// A watchdog thread polls the events, NCCL's asynchronous error and each
// operation's deadline. On an error or a timeout it aborts the
// communicator (ncclCommAbort) and fails every pending Work with an error
// naming the operation, its sequence number and NCCL's message; the group
// then refuses new operations. shutdown() and the destructor abort a
// communicator with work in flight instead of waiting for it, so they never
// hang; work the GPU has already run counts as done, so a group shut down
// after its caller synchronized finalizes its communicator.
//
// NCCL takes all_gather's outputs and reduce_scatter's inputs as one flat
// buffer: a list of tensors that are the consecutive blocks of one buffer is
// used where it lies. Other lists, and an in-place all_to_all, are staged
// through a device buffer taken from the communicator's own stream-ordered
// memory pool (cudaMemPoolCreate), so a call allocates no device memory and
// synchronizes nothing once its size has been staged before; the pool keeps
// the largest staging in flight at once until the group is shut down.
// Staging that cannot be allocated fails the call; in a group of more than
// one rank it also aborts the communicator, since the peers issued the
// operation and NCCL pairs operations by their order alone.
//
// NCCL has no bitwise reductions and no receive from any source; asking for
// them is InvalidArgument. Tags of send and recv are accepted and ignored:
// NCCL matches messages between two ranks in issue order.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backends/backend.h"
#include "store/store.h"

namespace comm {

class COMM_API NcclBackend final : public Backend {
 public:
  // Creates no communicator yet: that needs a device, which the first
  // operation's tensor gives.
  NcclBackend(std::shared_ptr<Store> store, int rank, int size,
              std::chrono::milliseconds timeout);
  ~NcclBackend() override;

  std::string name() const override { return "nccl"; }

  void shutdown() override;

  // Aborts the communicator now (ncclCommAbort) and fails every pending
  // Work with an error quoting `reason`; later operations are refused.
  // Does nothing when there is no communicator yet or it was aborted.
  void abort(const std::string& reason);

  // The device the group is bound to, or -1 before its first operation.
  int device() const;

  struct Communicator;
  struct Pending;

 private:
  std::shared_ptr<Work> do_broadcast(Tensor& tensor,
                                     const BroadcastOptions& options) override;
  std::shared_ptr<Work> do_reduce(Tensor& tensor,
                                  const ReduceOptions& options) override;
  std::shared_ptr<Work> do_all_reduce(Tensor& tensor,
                                      const AllReduceOptions& options) override;
  // NCCL reads the input where it lies: no copy, and nothing runs outside
  // the group's stream order.
  std::shared_ptr<Work> do_all_reduce_into(
      Tensor& output, const Tensor& input,
      const AllReduceOptions& options) override;
  std::shared_ptr<Work> do_all_gather(std::vector<Tensor>& outputs,
                                      const Tensor& input,
                                      const AllGatherOptions& options) override;
  std::shared_ptr<Work> do_all_gather_into(
      Tensor& output, const Tensor& input,
      const AllGatherOptions& options) override;
  std::shared_ptr<Work> do_gather(std::vector<Tensor>& outputs,
                                  const Tensor& input,
                                  const GatherOptions& options) override;
  std::shared_ptr<Work> do_scatter(Tensor& output,
                                   const std::vector<Tensor>& inputs,
                                   const ScatterOptions& options) override;
  std::shared_ptr<Work> do_reduce_scatter(
      Tensor& output, const std::vector<Tensor>& inputs,
      const ReduceScatterOptions& options) override;
  std::shared_ptr<Work> do_all_to_all(Tensor& output, const Tensor& input,
                                      const AllToAllOptions& options) override;
  std::shared_ptr<Work> do_barrier(const BarrierOptions& options) override;
  // Each send and receive is issued alone on the group's stream, and an
  // NCCL send may wait on the GPU for its receive: two ranks that both
  // send to each other first can wait until the timeout.
  std::shared_ptr<Work> do_send(const Tensor& tensor, int dst,
                                const SendOptions& options) override;
  std::shared_ptr<Work> do_recv(Tensor& tensor, int src,
                                const RecvOptions& options) override;

  // What an issued operation runs on the group's stream: NCCL calls (the
  // communicator and stream are passed in) and stream-ordered copies.
  using Launch = std::function<void(Communicator&)>;

  // Issues `launch` for the operation `description` on the tensors `keep`
  // (kept alive until it completes), on `device`, with the given timeout.
  // `blocks_host`: an unbounded wait() waits on the host (barrier).
  std::shared_ptr<Work> issue(std::string description, std::vector<Tensor> keep,
                              int device, OpTimeout timeout, Launch launch,
                              bool blocks_host = false);
  // The device of `tensor`, checked against the group's (binding the group
  // on its first operation). Throws InvalidArgument for a host tensor or
  // another device.
  int device_for(const Tensor& tensor, const std::string& op);
  // do_all_reduce and do_all_reduce_into; `op_name` names the call in
  // errors.
  std::shared_ptr<Work> start_all_reduce(const char* op_name, Tensor& output,
                                         const Tensor& input,
                                         const AllReduceOptions& options);
  Communicator& communicator(int device);
  void watch();
  // The releaser's loop: drops what released_ holds, without the lock.
  void release();
  // Stops the releaser once released_ is empty, and joins it.
  void stop_releaser();
  // shutdown()'s end, with mutex_ held: finalizes (or, with operations
  // pending, aborts) the communicator and frees what it owns.
  void close_communicator_locked();
  // With mutex_ held.
  void abort_locked(const std::string& reason, bool timed_out);
  void check_open_locked() const;
  std::string describe(const char* op, const Tensor& tensor,
                       const std::string& extra) const;

  std::shared_ptr<Store> store_;
  std::chrono::milliseconds timeout_;

  mutable std::mutex mutex_;
  std::condition_variable watchdog_wake_;
  std::unique_ptr<Communicator> communicator_;
  std::vector<std::shared_ptr<Pending>> pending_;
  // The tensors finished or aborted operations kept, dropped by releaser_,
  // a thread of their own: the last reference to a CUDA tensor libcomm
  // allocated frees it with cudaFree, which waits until the whole device
  // is idle, and so until an operation that hangs on a peer ends, which
  // only the watchdog's abort brings about. Neither the watchdog nor a
  // caller issuing its next operation may wait for that.
  std::vector<std::vector<Tensor>> released_;
  std::condition_variable releaser_wake_;
  bool releaser_stopping_ = false;
  std::thread releaser_;
  std::optional<int> device_;
  std::uint64_t next_sequence_ = 0;
  bool stopping_ = false;
  std::string aborted_;  // why the communicator was aborted, if it was
  std::thread watchdog_;
};

}  // namespace comm
