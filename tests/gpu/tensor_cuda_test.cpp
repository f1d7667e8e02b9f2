#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "libcomm/error.h"
#include "libcomm/tensor.h"
#include "libcomm/tensor_dlpack.h"

#include <dlpack/dlpack.h>

using comm::Device;
using comm::DType;
using comm::Tensor;

TEST_CASE("host -> CUDA -> host copies keep every byte", "[gpu][tensor]") {
  for (DType dtype : comm::kAllDTypes) {
    Tensor host = Tensor::arange(1000, dtype);
    Tensor device = host.to(Device::cuda(0));
    CHECK(device.device() == Device::cuda(0));
    CHECK(device.is_contiguous());
    Tensor back = device.to(Device::cpu());
    CHECK(std::memcmp(back.data_ptr(), host.data_ptr(), host.nbytes()) == 0);
  }
}

TEST_CASE("CUDA factories and slices", "[gpu][tensor]") {
  Tensor full = Tensor::full({4, 8}, 3.0, DType::kF32, Device::cuda(0));
  Tensor rows = full.slice(1, 3);
  CHECK(rows.data_ptr() ==
        static_cast<char*>(full.data_ptr()) + 8 * sizeof(float));
  Tensor back = rows.to(Device::cpu());
  for (int i = 0; i < 16; ++i) CHECK(back.data<float>()[i] == 3.0f);
  // CUDA -> CUDA.
  Tensor copy = Tensor::zeros({2, 8}, DType::kF32, Device::cuda(0));
  copy.copy_(rows);
  CHECK(copy.to(Device::cpu()).data<float>()[15] == 3.0f);
}

TEST_CASE("strided copies involving CUDA memory are refused", "[gpu][tensor]") {
  Tensor device = Tensor::zeros({4, 4}, DType::kF32, Device::cuda(0));
  std::vector<float> memory(32);
  Tensor strided =
      Tensor::from_blob(memory.data(), {4, 4}, {8, 1}, DType::kF32);
  CHECK_THROWS_WITH(device.copy_(strided), Catch::Contains("contiguous"));
}

TEST_CASE("CUDA tensors export and import through DLPack", "[gpu][dlpack]") {
  Tensor device = Tensor::zeros({16}, DType::kBF16, Device::cuda(0));
  DLManagedTensor* exported = comm::to_dlpack(device);
  CHECK(exported->dl_tensor.device.device_type == kDLCUDA);
  CHECK(exported->dl_tensor.device.device_id == 0);
  Tensor imported = comm::from_dlpack(exported);
  CHECK(imported.device() == Device::cuda(0));
  CHECK(imported.data_ptr() == device.data_ptr());
}
