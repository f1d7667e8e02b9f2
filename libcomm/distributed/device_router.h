// A Backend that routes each call, by the device of its tensors, to one of
// two backends: what a group made with "cpu:tcp,cuda:nccl" runs on, as in
// c10d. Each backend keeps its own order and sequence numbers; a call whose
// tensors sit on different kinds of device is InvalidArgument. A barrier
// goes to the host backend when there is one.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "libcomm/device.h"
#include "libcomm/export.h"

namespace comm::detail {

// "cpu:tcp,cuda:nccl" -> {{kCPU, "tcp"}, {kCUDA, "nccl"}}. Throws
// InvalidArgument naming the part that is wrong (an unknown device, a
// device named twice, an empty backend).
COMM_API std::vector<std::pair<DeviceType, std::string>> parse_backend_spec(
    const std::string& spec);

class DeviceRouter final : public Backend {
 public:
  // Either backend may be null (then tensors on that kind of device are
  // refused with an error naming the spec).
  DeviceRouter(int rank, int size, std::string spec,
               std::shared_ptr<Backend> host, std::shared_ptr<Backend> cuda);
  ~DeviceRouter() override;

  std::string name() const override { return spec_; }

  std::shared_ptr<Work> broadcast(Tensor& tensor,
                                  const BroadcastOptions& options) override;
  std::shared_ptr<Work> reduce(Tensor& tensor,
                               const ReduceOptions& options) override;
  std::shared_ptr<Work> all_reduce(Tensor& tensor,
                                   const AllReduceOptions& options) override;
  std::shared_ptr<Work> all_reduce_into(
      Tensor& output, const Tensor& input,
      const AllReduceOptions& options) override;
  std::shared_ptr<Work> all_gather(std::vector<Tensor>& outputs,
                                   const Tensor& input,
                                   const AllGatherOptions& options) override;
  std::shared_ptr<Work> all_gather_into(
      Tensor& output, const Tensor& input,
      const AllGatherOptions& options) override;
  std::shared_ptr<Work> gather(std::vector<Tensor>& outputs,
                               const Tensor& input,
                               const GatherOptions& options) override;
  std::shared_ptr<Work> scatter(Tensor& output,
                                const std::vector<Tensor>& inputs,
                                const ScatterOptions& options) override;
  std::shared_ptr<Work> reduce_scatter(
      Tensor& output, const std::vector<Tensor>& inputs,
      const ReduceScatterOptions& options) override;
  std::shared_ptr<Work> all_to_all(Tensor& output, const Tensor& input,
                                   const AllToAllOptions& options) override;
  std::shared_ptr<Work> barrier(const BarrierOptions& options) override;
  std::shared_ptr<Work> send(const Tensor& tensor, int dst,
                             const SendOptions& options) override;
  std::shared_ptr<Work> recv(Tensor& tensor, int src,
                             const RecvOptions& options) override;
  void shutdown() override;

 private:
  // The backend for `first`'s device, after checking that every tensor of
  // `others` is on the same kind of device.
  Backend& route(const std::string& op, const Tensor& first,
                 const std::vector<Tensor>& others = {});

  std::string spec_;
  std::shared_ptr<Backend> host_;
  std::shared_ptr<Backend> cuda_;
};

}  // namespace comm::detail
