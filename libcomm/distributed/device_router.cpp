#include "libcomm/distributed/device_router.h"

#include "libcomm/error.h"

namespace comm::detail {

std::vector<std::pair<DeviceType, std::string>> parse_backend_spec(
    const std::string& spec) {
  std::vector<std::pair<DeviceType, std::string>> routes;
  std::size_t start = 0;
  while (start <= spec.size()) {
    std::size_t end = spec.find(',', start);
    if (end == std::string::npos) end = spec.size();
    const std::string part = spec.substr(start, end - start);
    const auto colon = part.find(':');
    const std::string device = part.substr(0, colon);
    const std::string backend =
        colon == std::string::npos ? "" : part.substr(colon + 1);
    DeviceType type;
    if (device == "cpu") {
      type = DeviceType::kCPU;
    } else if (device == "cuda") {
      type = DeviceType::kCUDA;
    } else {
      throw InvalidArgument("backend '" + spec + "': '" + part +
                            "' does not start with cpu: or cuda:; write "
                            "it like \"cpu:tcp,cuda:nccl\"");
    }
    if (backend.empty()) {
      throw InvalidArgument("backend '" + spec + "': '" + part +
                            "' names no backend after the colon");
    }
    for (const auto& [seen, name] : routes) {
      if (seen == type) {
        throw InvalidArgument("backend '" + spec + "' names " + device +
                              " twice");
      }
    }
    routes.emplace_back(type, backend);
    start = end + 1;
  }
  return routes;
}

DeviceRouter::DeviceRouter(int rank, int size, std::string spec,
                           std::shared_ptr<Backend> host,
                           std::shared_ptr<Backend> cuda)
    : Backend(rank, size),
      spec_(std::move(spec)),
      host_(std::move(host)),
      cuda_(std::move(cuda)) {}

DeviceRouter::~DeviceRouter() { shutdown(); }

Backend& DeviceRouter::route(const std::string& op, const Tensor& first,
                             const std::vector<Tensor>& others) {
  if (!first.defined()) throw InvalidArgument(op + " got an undefined tensor");
  const DeviceType type = first.device().type;
  for (const Tensor& t : others) {
    if (t.defined() && t.device().type != type) {
      throw InvalidArgument(op + ": " + first.describe() + " and " +
                            t.describe() +
                            " are on different kinds of device; a group "
                            "made with '" +
                            spec_ + "' runs each call on one of them");
    }
  }
  Backend* backend = type == DeviceType::kCPU ? host_.get() : cuda_.get();
  if (backend == nullptr) {
    throw InvalidArgument(op + ": " + first.describe() + " is on " +
                          first.device().str() + ", and the group's backend '" +
                          spec_ + "' names no backend for that device");
  }
  return *backend;
}

std::shared_ptr<Work> DeviceRouter::broadcast(Tensor& tensor,
                                              const BroadcastOptions& options) {
  return route("broadcast", tensor).broadcast(tensor, options);
}

std::shared_ptr<Work> DeviceRouter::reduce(Tensor& tensor,
                                           const ReduceOptions& options) {
  return route("reduce", tensor).reduce(tensor, options);
}

std::shared_ptr<Work> DeviceRouter::all_reduce(
    Tensor& tensor, const AllReduceOptions& options) {
  return route("all_reduce", tensor).all_reduce(tensor, options);
}

std::shared_ptr<Work> DeviceRouter::all_reduce_into(
    Tensor& output, const Tensor& input, const AllReduceOptions& options) {
  return route("all_reduce_into", input, {output})
      .all_reduce_into(output, input, options);
}

std::shared_ptr<Work> DeviceRouter::all_gather(
    std::vector<Tensor>& outputs, const Tensor& input,
    const AllGatherOptions& options) {
  return route("all_gather", input, outputs)
      .all_gather(outputs, input, options);
}

std::shared_ptr<Work> DeviceRouter::all_gather_into(
    Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  return route("all_gather_into", input, {output})
      .all_gather_into(output, input, options);
}

std::shared_ptr<Work> DeviceRouter::gather(std::vector<Tensor>& outputs,
                                           const Tensor& input,
                                           const GatherOptions& options) {
  return route("gather", input, outputs).gather(outputs, input, options);
}

std::shared_ptr<Work> DeviceRouter::scatter(Tensor& output,
                                            const std::vector<Tensor>& inputs,
                                            const ScatterOptions& options) {
  return route("scatter", output, inputs).scatter(output, inputs, options);
}

std::shared_ptr<Work> DeviceRouter::reduce_scatter(
    Tensor& output, const std::vector<Tensor>& inputs,
    const ReduceScatterOptions& options) {
  return route("reduce_scatter", output, inputs)
      .reduce_scatter(output, inputs, options);
}

std::shared_ptr<Work> DeviceRouter::all_to_all(Tensor& output,
                                               const Tensor& input,
                                               const AllToAllOptions& options) {
  return route("all_to_all", input, {output})
      .all_to_all(output, input, options);
}

std::shared_ptr<Work> DeviceRouter::barrier(const BarrierOptions& options) {
  return (host_ ? *host_ : *cuda_).barrier(options);
}

std::shared_ptr<Work> DeviceRouter::send(const Tensor& tensor, int dst,
                                         const SendOptions& options) {
  return route("send", tensor).send(tensor, dst, options);
}

std::shared_ptr<Work> DeviceRouter::recv(Tensor& tensor, int src,
                                         const RecvOptions& options) {
  return route("recv", tensor).recv(tensor, src, options);
}

void DeviceRouter::shutdown() {
  if (host_) host_->shutdown();
  if (cuda_) cuda_->shutdown();
}

}  // namespace comm::detail
