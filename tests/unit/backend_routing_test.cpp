// Backends by name: the registry's errors, and a group whose backend string
// routes host tensors and CUDA tensors to different backends
// ("cpu:tcp,cuda:nccl"), exercised here with host tensors; the gpu suite
// covers the CUDA side.
#include <catch2/catch.hpp>

#include <thread>
#include "libcomm/config.h"
#include "libcomm/cuda.h"
#include "libcomm/distributed/backend_registry.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "store/hash_store.h"

using comm::DeviceType;
using comm::InvalidArgument;
using comm::parse_backend_spec;
using comm::ProcessGroup;
using comm::Tensor;

TEST_CASE("backend strings name one backend per kind of device", "[router]") {
  using Routes = std::vector<std::pair<DeviceType, std::string>>;
  CHECK(parse_backend_spec("cpu:tcp,cuda:nccl") ==
        Routes{{DeviceType::kCPU, "tcp"}, {DeviceType::kCUDA, "nccl"}});
  CHECK(parse_backend_spec("cuda:nccl") == Routes{{DeviceType::kCUDA, "nccl"}});
  CHECK_THROWS_WITH(parse_backend_spec("gpu:nccl"),
                    Catch::Contains("'gpu:nccl'"));
  CHECK_THROWS_WITH(parse_backend_spec("cpu:"),
                    Catch::Contains("names no backend"));
  CHECK_THROWS_WITH(parse_backend_spec("cpu:tcp,cpu:tcp"),
                    Catch::Contains("names cpu twice"));
  CHECK_THROWS_WITH(parse_backend_spec("cpu:tcp,"),
                    Catch::Contains("does not start with cpu: or cuda:"));
}

// The routed group's cuda backend: NCCL where libcomm has it, else TCP,
// which stages CUDA tensors through host memory, so that the routing is
// tested in every build.
#if COMM_WITH_NCCL
constexpr const char* kRouted = "cpu:tcp,cuda:nccl";
#else
constexpr const char* kRouted = "cpu:tcp,cuda:tcp";
#endif

TEST_CASE("a routed group runs host tensors on its cpu backend", "[router]") {
  for (int world : {1, 2, 3}) {
    std::vector<std::string> names(static_cast<std::size_t>(world));
    auto store = std::make_shared<comm::HashStore>();
    std::vector<std::thread> threads;
    std::vector<std::string> failures(static_cast<std::size_t>(world));
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        try {
          ProcessGroup group(store, rank, world, kRouted,
                             std::chrono::seconds(60), "routed");
          names[static_cast<std::size_t>(rank)] = group.backend_name();
          Tensor t = Tensor::full({1000}, rank + 1, comm::DType::kF32);
          group.all_reduce(t)->wait();
          if (t.data<float>()[999] != world * (world + 1) / 2)
            failures[static_cast<std::size_t>(rank)] = "wrong sum";
          group.barrier()->wait();
        } catch (const std::exception& e) {
          failures[static_cast<std::size_t>(rank)] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& f : failures) CHECK(f.empty());
    for (const auto& n : names) CHECK(n == kRouted);
  }
}

TEST_CASE("asking for a backend that is not there says what is", "[router]") {
  comm::BackendContext context;
  context.store = std::make_shared<comm::HashStore>();
  CHECK_THROWS_WITH(
      comm::create_backend("gloo", context),
      Catch::Contains("no backend named 'gloo'") && Catch::Contains("tcp"));
#if !COMM_WITH_NCCL
  CHECK_THROWS_WITH(comm::create_backend("nccl", context),
                    Catch::Contains("built without the NCCL backend"));
#else
  // Built with NCCL: the backend exists. Without a GPU it refuses to be
  // made, saying why; with one, it refuses host tensors by name.
  if (comm::cuda_device_count() == 0) {
    CHECK_THROWS_WITH(
        ProcessGroup(context.store, 0, 1, "nccl"),
        Catch::Contains("needs a CUDA device") && Catch::Contains("sees none"));
  } else {
    ProcessGroup group(context.store, 0, 1, "nccl");
    Tensor host = Tensor::full({4}, 1, comm::DType::kF32);
    CHECK_THROWS_WITH(group.all_reduce(host), Catch::Contains("host memory"));
  }
#endif
}
