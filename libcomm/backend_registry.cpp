#include "libcomm/backend_registry.h"

#include <map>
#include <mutex>

#include "backends/tcp/tcp_backend.h"
#include "libcomm/error.h"

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

std::shared_ptr<Backend> create_backend(const std::string& name,
                                        const BackendContext& context) {
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
    std::string hint;
    if (name == "nccl") {
      hint =
          "; libcomm was built without NCCL (see the GPU support section of "
          "the "
          "meson summary)";
    }
    throw InvalidArgument("no backend named '" + name +
                          "'; registered: " + known + hint);
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
