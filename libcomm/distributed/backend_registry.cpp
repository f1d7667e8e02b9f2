#include "libcomm/distributed/backend_registry.h"

#include <map>
#include <mutex>

#include "backends/tcp/tcp_backend.h"
#include "libcomm/config.h"
#include "libcomm/error.h"

#if COMM_WITH_NCCL
#include "backends/nccl/nccl_backend.h"
#include "libcomm/cuda.h"
#endif

namespace comm {
namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, BackendFactory> factories;

  Registry() {
    factories["tcp"] = [](const BackendContext& context) {
      return std::make_shared<TcpBackend>(context.store, context.rank,
                                          context.size, context.timeout);
    };
#if COMM_WITH_NCCL
    factories["nccl"] = [](const BackendContext& context) {
      // Refused at its creation, as c10d's NCCL group refuses, rather than
      // at the first call, where the group is NCCL's alone.
      if (!context.host_memory_elsewhere && cuda_device_count() == 0) {
        throw InvalidArgument(
            "the nccl backend needs a CUDA device, and this process sees "
            "none (check CUDA_VISIBLE_DEVICES and the driver); host tensors "
            "go over \"tcp\" (\"gloo\"), or a group of both "
            "(\"cpu:tcp,cuda:nccl\")");
      }
      return std::make_shared<NcclBackend>(context.store, context.rank,
                                           context.size, context.timeout);
    };
#endif
  }
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

void register_backend(const std::string& name, BackendFactory factory) {
  if (name.empty() || !factory) {
    throw InvalidArgument("register_backend needs a name and a factory");
  }
  std::lock_guard<std::mutex> lock(registry().mutex);
  if (!registry().factories.emplace(name, std::move(factory)).second) {
    throw InvalidArgument("a backend named '" + name +
                          "' is already registered");
  }
}

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

std::shared_ptr<Backend> create_backend(const std::string& name,
                                        const BackendContext& context) {
  if (name.find(':') != std::string::npos) {
    throw InvalidArgument("'" + name +
                          "' names a backend per kind of device; pass it to "
                          "a ProcessGroup, which routes each call, and give "
                          "create_backend one backend's name");
  }
  BackendFactory factory;
  {
    std::lock_guard<std::mutex> lock(registry().mutex);
    auto it = registry().factories.find(name);
    if (it != registry().factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const std::string& n : registered_backends())
      known += (known.empty() ? "" : ", ") + n;
    const std::string message =
        "no backend named '" + name + "'; registered: " + known;
    if (name == "nccl") {
      throw UnsupportedError(
          message + "; this libcomm was built without the NCCL backend (" +
          COMM_NCCL_STATUS +
          "); install CUDA and NCCL under /usr/local/cuda (or pass "
          "-Dgpu_root) and rebuild");
    }
    throw InvalidArgument(message);
  }
  return factory(context);
}

std::vector<std::string> registered_backends() {
  std::lock_guard<std::mutex> lock(registry().mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : registry().factories)
    names.push_back(name);
  return names;
}

}  // namespace comm
