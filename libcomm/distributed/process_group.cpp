#include "libcomm/distributed/process_group.h"

#include <algorithm>

#include "libcomm/distributed/backend_registry.h"
#include "libcomm/distributed/rendezvous.h"
#include "libcomm/error.h"
#include "store/prefix_store.h"

namespace comm {

namespace {

std::size_t index_of(DeviceType type) { return static_cast<std::size_t>(type); }

}  // namespace

ProcessGroup::ProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                           const std::string& backend,
                           std::chrono::milliseconds timeout, std::string name)
    : store_(std::move(store)),
      backend_name_(backend),
      name_(std::move(name)),
      rank_(rank),
      size_(size),
      timeout_(timeout) {
  if (!store_) throw InvalidArgument("ProcessGroup needs a store");
  if (size < 1 || rank < 0 || rank >= size) {
    throw InvalidArgument("ProcessGroup: rank " + std::to_string(rank) +
                          " is outside [0, " + std::to_string(size) + ")");
  }
  BackendContext context;
  context.store = std::make_shared<PrefixStore>("pg/" + name_, store_);
  context.rank = rank;
  context.size = size;
  context.timeout = timeout;
  if (backend.find(':') == std::string::npos) {
    backends_[0] = backends_[1] = create_backend(backend, context);
    return;
  }
  // One backend per kind of device, each in a scope of the store of its own.
  const auto routes = parse_backend_spec(backend);
  for (const auto& [type, backend_name] : routes) {
    BackendContext scoped = context;
    scoped.host_memory_elsewhere =
        type != DeviceType::kCPU &&
        std::any_of(routes.begin(), routes.end(), [](const auto& route) {
          return route.first == DeviceType::kCPU;
        });
    const std::string scope = type == DeviceType::kCPU ? "cpu/" : "cuda/";
    scoped.store = std::make_shared<PrefixStore>(scope, context.store);
    backends_[index_of(type)] = create_backend(backend_name, scoped);
  }
}

ProcessGroup::~ProcessGroup() { shutdown(); }

void ProcessGroup::shutdown() {
  if (backends_[0]) backends_[0]->shutdown();
  if (backends_[1] && backends_[1] != backends_[0]) backends_[1]->shutdown();
}

std::shared_ptr<Backend> ProcessGroup::backend(DeviceType device) const {
  return backends_[index_of(device)];
}

Backend& ProcessGroup::route(const char* op, const Tensor& first,
                             std::span<const Tensor> others) const {
  if (!first.defined()) {
    throw InvalidArgument(std::string(op) + " got an undefined tensor");
  }
  const DeviceType type = first.device().type;
  for (const Tensor& t : others) {
    if (t.defined() && t.device().type != type) {
      throw InvalidArgument(std::string(op) + ": " + first.describe() +
                            " and " + t.describe() +
                            " are on different kinds of device; a group "
                            "made with '" +
                            backend_name_ + "' runs each call on one of them");
    }
  }
  Backend* backend = backends_[index_of(type)].get();
  if (backend == nullptr) {
    throw InvalidArgument(std::string(op) + ": " + first.describe() +
                          " is on " + first.device().str() +
                          ", and the group's backend '" + backend_name_ +
                          "' names no backend for that device");
  }
  return *backend;
}

std::shared_ptr<Work> ProcessGroup::broadcast(Tensor& tensor,
                                              const BroadcastOptions& options) {
  return route("broadcast", tensor).broadcast(tensor, options);
}
std::shared_ptr<Work> ProcessGroup::reduce(Tensor& tensor,
                                           const ReduceOptions& options) {
  return route("reduce", tensor).reduce(tensor, options);
}
std::shared_ptr<Work> ProcessGroup::all_reduce(
    Tensor& tensor, const AllReduceOptions& options) {
  return route("all_reduce", tensor).all_reduce(tensor, options);
}
std::shared_ptr<Work> ProcessGroup::all_reduce_into(
    Tensor& output, const Tensor& input, const AllReduceOptions& options) {
  return route("all_reduce_into", input, {&output, 1})
      .all_reduce_into(output, input, options);
}
std::shared_ptr<Work> ProcessGroup::all_gather(
    std::vector<Tensor>& outputs, const Tensor& input,
    const AllGatherOptions& options) {
  return route("all_gather", input, outputs)
      .all_gather(outputs, input, options);
}
std::shared_ptr<Work> ProcessGroup::all_gather_into(
    Tensor& output, const Tensor& input, const AllGatherOptions& options) {
  return route("all_gather_into", input, {&output, 1})
      .all_gather_into(output, input, options);
}
std::shared_ptr<Work> ProcessGroup::gather(std::vector<Tensor>& outputs,
                                           const Tensor& input,
                                           const GatherOptions& options) {
  return route("gather", input, outputs).gather(outputs, input, options);
}
std::shared_ptr<Work> ProcessGroup::scatter(Tensor& output,
                                            const std::vector<Tensor>& inputs,
                                            const ScatterOptions& options) {
  return route("scatter", output, inputs).scatter(output, inputs, options);
}
std::shared_ptr<Work> ProcessGroup::reduce_scatter(
    Tensor& output, const std::vector<Tensor>& inputs,
    const ReduceScatterOptions& options) {
  return route("reduce_scatter", output, inputs)
      .reduce_scatter(output, inputs, options);
}
std::shared_ptr<Work> ProcessGroup::all_to_all(Tensor& output,
                                               const Tensor& input,
                                               const AllToAllOptions& options) {
  return route("all_to_all", input, {&output, 1})
      .all_to_all(output, input, options);
}
std::shared_ptr<Work> ProcessGroup::barrier(const BarrierOptions& options) {
  // On the host backend when the group has one, as c10d's.
  Backend& backend = backends_[0] ? *backends_[0] : *backends_[1];
  return backend.barrier(options);
}
std::shared_ptr<Work> ProcessGroup::isend(const Tensor& tensor, int dst,
                                          const SendOptions& options) {
  return route("send", tensor).send(tensor, dst, options);
}
std::shared_ptr<Work> ProcessGroup::irecv(Tensor& tensor, int src,
                                          const RecvOptions& options) {
  return route("recv", tensor).recv(tensor, src, options);
}
void ProcessGroup::send(const Tensor& tensor, int dst,
                        const SendOptions& options) {
  isend(tensor, dst, options)->wait();
}
int ProcessGroup::recv(Tensor& tensor, int src, const RecvOptions& options) {
  auto work = irecv(tensor, src, options);
  work->wait();
  return work->source_rank();
}

std::shared_ptr<ProcessGroup> ProcessGroup::new_group(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty()) {
    throw InvalidArgument(
        "new_group: the list of ranks is empty; a group needs at least one "
        "rank of the group of " +
        std::to_string(size_));
  }
  if (std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() ||
      ranks.front() < 0 || ranks.back() >= size_) {
    throw InvalidArgument(
        "new_group: ranks must be distinct members of the group of " +
        std::to_string(size_) + " (0 to " + std::to_string(size_ - 1) + ")");
  }
  // Every rank counts the call, members or not, so that the next
  // new_group gets the same name everywhere.
  const std::string name = name_ + "/" + std::to_string(subgroups_created_++);
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
  return std::make_shared<ProcessGroup>(
      store_, static_cast<int>(me - ranks.begin()),
      static_cast<int>(ranks.size()), backend_name_, timeout_, name);
}

std::shared_ptr<ProcessGroup> init_process_group(
    const std::string& backend, const std::string& init_method, int rank,
    int world_size, std::chrono::milliseconds timeout) {
  RendezvousResult joined = rendezvous(init_method, rank, world_size, timeout);
  return std::make_shared<ProcessGroup>(joined.store, joined.rank,
                                        joined.world_size, backend, timeout);
}

}  // namespace comm
