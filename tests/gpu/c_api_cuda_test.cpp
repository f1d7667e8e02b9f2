// The C API on CUDA buffers: device and stream arguments, through the TCP
// backend (staged through host memory) and, where built, NCCL.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "comm/comm.h"
#include "libcomm/config.h"
#include "libcomm/tensor.h"

using comm::Device;
using comm::DType;
using comm::Tensor;

namespace {

// A group of one rank on `backend`, freed with its store at scope exit.
struct OneRank {
  explicit OneRank(const char* backend) {
    REQUIRE(comm_store_create_hash(COMM_DEFAULT_TIMEOUT, &store) ==
            COMM_SUCCESS);
    const comm_result_t made =
        comm_group_create(store, 0, 1, backend, 30000, &group);
    INFO(comm_last_error());
    REQUIRE(made == COMM_SUCCESS);
  }
  ~OneRank() {
    comm_group_free(group);
    comm_store_free(store);
  }
  comm_store_t store = nullptr;
  comm_group_t group = nullptr;
};

std::vector<float> host_copy(const Tensor& cuda) {
  Tensor host = cuda.to(Device::cpu());
  return {host.data<float>(), host.data<float>() + host.numel()};
}

void check_all_reduce_on_device(const char* backend) {
  OneRank one(backend);
  const Tensor send = Tensor::arange(1 << 16, DType::kF32, Device::cuda(0));
  Tensor recv = Tensor::zeros({1 << 16}, DType::kF32, Device::cuda(0));
  const comm_result_t result =
      comm_all_reduce(send.data_ptr(), recv.data_ptr(), 1 << 16, COMM_FLOAT32,
                      COMM_SUM, one.group, 0, nullptr, nullptr);
  INFO(comm_last_error());
  REQUIRE(result == COMM_SUCCESS);
  const std::vector<float> got = host_copy(recv);
  CHECK(got[0] == 0.0f);
  CHECK(got[12345] == 12345.0f);

  comm_work_t work = nullptr;
  REQUIRE(comm_all_reduce(recv.data_ptr(), recv.data_ptr(), 1 << 16,
                          COMM_FLOAT32, COMM_MAX, one.group, 0, nullptr,
                          &work) == COMM_SUCCESS);
  REQUIRE(comm_work_wait(work, 30000) == COMM_SUCCESS);
  REQUIRE(comm_work_free(work) == COMM_SUCCESS);
  CHECK(host_copy(recv)[777] == 777.0f);

  // A host stream argument for device buffers of another device is refused.
  CHECK(comm_all_reduce(send.data_ptr(), recv.data_ptr(), 4, COMM_FLOAT32,
                        COMM_SUM, one.group, COMM_CPU,
                        reinterpret_cast<void*>(1),
                        nullptr) == COMM_INVALID_ARGUMENT);
}

}  // namespace

TEST_CASE("C API collectives on CUDA buffers over the TCP backend",
          "[gpu][c_api]") {
  check_all_reduce_on_device("tcp");
}

TEST_CASE("C API collectives on CUDA buffers over NCCL", "[gpu][c_api]") {
  if (!COMM_WITH_NCCL) {
    WARN("SKIP part: libcomm was built without NCCL");
    return;
  }
  check_all_reduce_on_device("nccl");
  // NCCL has no bitwise reductions: unsupported, not a crash.
  OneRank one("nccl");
  Tensor ints = Tensor::zeros({8}, DType::kI32, Device::cuda(0));
  CHECK(comm_all_reduce(ints.data_ptr(), ints.data_ptr(), 8, COMM_INT32,
                        COMM_BXOR, one.group, 0, nullptr,
                        nullptr) == COMM_UNSUPPORTED);
  CHECK(std::string(comm_last_error()).find("bitwise") != std::string::npos);
}
