// Backends by name. "tcp" is always there; "nccl" when libcomm was built
// with NCCL; third parties register their own before creating groups.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "libcomm/device.h"
#include "libcomm/export.h"
#include "store/store.h"

namespace comm {

// What a factory gets: the group's own store (already scoped to the group),
// this rank, the group size, and the group's timeout.
struct BackendContext {
  std::shared_ptr<Store> store;
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout = Store::kDefaultTimeout;
  // Whether the group sends host tensors over another backend (it is routed
  // by device, "cpu:tcp,cuda:nccl"). A backend that could run no call on
  // this machine refuses to be made unless the group has another to run
  // the calls it can.
  bool host_memory_elsewhere = false;
};

using BackendFactory =
    std::function<std::shared_ptr<Backend>(const BackendContext& context)>;

// Adds a backend. Throws InvalidArgument when the name is taken or empty.
COMM_API void register_backend(const std::string& name, BackendFactory factory);

// Creates the named backend. Throws InvalidArgument naming the registered
// backends when there is none by that name, and for a per-device spec
// (which only ProcessGroup takes).
COMM_API std::shared_ptr<Backend> create_backend(const std::string& name,
                                                 const BackendContext& context);

COMM_API std::vector<std::string> registered_backends();

// A backend per kind of device, as ProcessGroup takes it:
// "cpu:tcp,cuda:nccl" -> {{kCPU, "tcp"}, {kCUDA, "nccl"}}. Throws
// InvalidArgument naming the part that is wrong (an unknown device, a
// device named twice, an empty backend).
COMM_API std::vector<std::pair<DeviceType, std::string>> parse_backend_spec(
    const std::string& spec);

}  // namespace comm
