#include "libcomm/distributed/backend_registry.h"

#include <map>
#include <mutex>

#include "backends/tcp/tcp_backend.h"
#include "libcomm/config.h"
#include "libcomm/distributed/device_router.h"
#include "libcomm/error.h"
#include "store/prefix_store.h"

#if COMM_WITH_NCCL
#include "backends/nccl/nccl_backend.h"
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

// "cpu:tcp,cuda:nccl": one backend per kind of device, each in a scope of
// the store of its own, behind a router.
std::shared_ptr<Backend> create_routed_backend(const std::string& spec,
                                               const BackendContext& context) {
  std::shared_ptr<Backend> host, cuda;
  for (const auto& [type, name] : detail::parse_backend_spec(spec)) {
    BackendContext scoped = context;
    const std::string scope = type == DeviceType::kCPU ? "cpu/" : "cuda/";
    scoped.store = std::make_shared<PrefixStore>(scope, context.store);
    (type == DeviceType::kCPU ? host : cuda) = create_backend(name, scoped);
  }
  return std::make_shared<detail::DeviceRouter>(context.rank, context.size,
                                                spec, host, cuda);
}

std::shared_ptr<Backend> create_backend(const std::string& name,
                                        const BackendContext& context) {
  if (name.find(':') != std::string::npos) {
    return create_routed_backend(name, context);
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
