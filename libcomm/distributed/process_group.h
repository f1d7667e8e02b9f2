// comm::ProcessGroup: a set of ranks that run collectives together, as in
// torch.distributed. It owns a backend per kind of device (looked up by name
// in the registry), routes each call to the backend of its tensors' device,
// and owns the group's own scope in the store.
//
// Collectives return a Work at once; call wait() on it (or use the blocking
// send and recv). Every rank of a group must issue the same collectives in
// the same order.
#pragma once

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "libcomm/device.h"
#include "libcomm/export.h"
#include "store/store.h"

namespace comm {

class COMM_API ProcessGroup {
 public:
  // Every rank of the group constructs one at about the same time, with
  // the same store, backend and group name. `backend` is a registered
  // backend's name, which then serves tensors on every device, or one per
  // kind of device, "cpu:tcp,cuda:nccl" (as c10d's); each backend of such a
  // group keeps its own order and sequence numbers, and a call whose
  // tensors sit on different kinds of device is InvalidArgument. `timeout`
  // bounds the set-up and is the default timeout of every operation.
  ProcessGroup(std::shared_ptr<Store> store, int rank, int size,
               const std::string& backend = "tcp",
               std::chrono::milliseconds timeout = Store::kDefaultTimeout,
               std::string name = "default");
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The backend as given: a backend's name or a per-device spec.
  const std::string& backend_name() const { return backend_name_; }
  const std::string& name() const { return name_; }
  // The backend that runs calls on tensors of `device`, or null when the
  // group has none for it.
  std::shared_ptr<Backend> backend(DeviceType device) const;
  std::chrono::milliseconds timeout() const { return timeout_; }

  std::shared_ptr<Work> broadcast(Tensor& tensor,
                                  const BroadcastOptions& options = {});
  std::shared_ptr<Work> reduce(Tensor& tensor,
                               const ReduceOptions& options = {});
  std::shared_ptr<Work> all_reduce(Tensor& tensor,
                                   const AllReduceOptions& options = {});
  // Out of place: `output` becomes op over every rank's `input` (see
  // Backend::all_reduce_into).
  std::shared_ptr<Work> all_reduce_into(Tensor& output, const Tensor& input,
                                        const AllReduceOptions& options = {});
  std::shared_ptr<Work> all_gather(std::vector<Tensor>& outputs,
                                   const Tensor& input,
                                   const AllGatherOptions& options = {});
  std::shared_ptr<Work> all_gather_into(Tensor& output, const Tensor& input,
                                        const AllGatherOptions& options = {});
  std::shared_ptr<Work> gather(std::vector<Tensor>& outputs,
                               const Tensor& input,
                               const GatherOptions& options = {});
  std::shared_ptr<Work> scatter(Tensor& output,
                                const std::vector<Tensor>& inputs,
                                const ScatterOptions& options = {});
  std::shared_ptr<Work> reduce_scatter(
      Tensor& output, const std::vector<Tensor>& inputs,
      const ReduceScatterOptions& options = {});
  std::shared_ptr<Work> all_to_all(Tensor& output, const Tensor& input,
                                   const AllToAllOptions& options = {});
  std::shared_ptr<Work> barrier(const BarrierOptions& options = {});

  std::shared_ptr<Work> isend(const Tensor& tensor, int dst,
                              const SendOptions& options = {});
  std::shared_ptr<Work> irecv(Tensor& tensor, int src,
                              const RecvOptions& options = {});
  // Blocking forms. recv returns the rank the message came from (useful
  // with kAnySource).
  void send(const Tensor& tensor, int dst, const SendOptions& options = {});
  int recv(Tensor& tensor, int src, const RecvOptions& options = {});

  // A subgroup of `ranks` (numbered in this group). Every rank of this
  // group must call it, in the same order as its other new_group calls;
  // ranks outside `ranks` get null. Group rank i is the i-th smallest of
  // `ranks`. Throws InvalidArgument for duplicates or ranks out of range.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks);

  // Fails pending operations with an error saying so and closes the
  // connections; see Backend::shutdown.
  void shutdown();

 private:
  std::shared_ptr<Store> store_;  // unscoped: subgroups scope their own
  std::string backend_name_;
  std::string name_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  // Indexed by DeviceType; both point to one backend when a single name
  // was given.
  std::shared_ptr<Backend> backends_[2];
  int subgroups_created_ = 0;

  // The backend for `first`'s device, after checking that every tensor of
  // `others` is on the same kind of device. A span, so that a call with
  // one other tensor copies nothing.
  Backend& route(const char* op, const Tensor& first,
                 std::span<const Tensor> others = {}) const;
};

// Rendezvous through `init_method` (see rendezvous.h), then the default
// group of all ranks on `backend`.
COMM_API std::shared_ptr<ProcessGroup> init_process_group(
    const std::string& backend, const std::string& init_method = "env://",
    int rank = -1, int world_size = -1,
    std::chrono::milliseconds timeout = Store::kDefaultTimeout);

}  // namespace comm
