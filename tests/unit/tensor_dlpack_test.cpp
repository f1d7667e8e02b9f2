#include <catch2/catch.hpp>

#include <dlpack/dlpack.h>

#include <cstdint>
#include <vector>

#include "libcomm/error.h"
#include "libcomm/tensor_dlpack.h"

using comm::DType;
using comm::Tensor;

namespace {

// A DLPack producer as a foreign framework would write one: it owns a
// vector and counts how often its deleter runs.
struct ForeignTensor {
  std::vector<float> data;
  std::vector<std::int64_t> shape;
  DLManagedTensor managed{};
  int* deleter_calls;
};

DLManagedTensor* make_foreign(int* deleter_calls, std::uint64_t byte_offset) {
  auto* foreign =
      new ForeignTensor{{0, 1, 2, 3, 4, 5, 6, 7}, {2, 3}, {}, deleter_calls};
  DLTensor& dl = foreign->managed.dl_tensor;
  dl.data = foreign->data.data();
  dl.byte_offset = byte_offset;
  dl.device = {kDLCPU, 0};
  dl.ndim = 2;
  dl.dtype = {kDLFloat, 32, 1};
  dl.shape = foreign->shape.data();
  dl.strides = nullptr;  // compact row-major
  foreign->managed.manager_ctx = foreign;
  foreign->managed.deleter = [](DLManagedTensor* self) {
    auto* owner = static_cast<ForeignTensor*>(self->manager_ctx);
    ++*owner->deleter_calls;
    delete owner;
  };
  return &foreign->managed;
}

}  // namespace

TEST_CASE("a DLPack round trip keeps the data pointer and frees once",
          "[dlpack]") {
  int calls = 0;
  void* original = nullptr;
  {
    std::vector<float> memory = {1, 2, 3, 4, 5, 6};
    Tensor source =
        Tensor::from_blob(memory.data(), {3, 2}, DType::kF32,
                          comm::Device::cpu(), [&](void*) { ++calls; });
    original = source.data_ptr();
    DLManagedTensor* exported = comm::to_dlpack(source);
    CHECK(exported->dl_tensor.data == original);
    CHECK(exported->dl_tensor.ndim == 2);
    CHECK(exported->dl_tensor.shape[0] == 3);
    CHECK(exported->dl_tensor.strides[0] == 2);
    CHECK(exported->dl_tensor.dtype.code == kDLFloat);
    CHECK(exported->dl_tensor.dtype.bits == 32);

    source = Tensor();  // the export alone keeps the memory alive
    CHECK(calls == 0);
    Tensor imported = comm::from_dlpack(exported);
    CHECK(imported.data_ptr() == original);
    CHECK(imported.shape() == comm::Shape{3, 2});
    CHECK(imported.data<float>()[5] == 6.0f);
    Tensor view = imported.slice(1, 2);
    imported = Tensor();
    CHECK(calls == 0);  // `view` still holds the memory
    CHECK(view.data<float>()[0] == 3.0f);
  }
  CHECK(calls == 1);
}

TEST_CASE("every dtype survives a DLPack round trip", "[dlpack]") {
  for (DType dtype : comm::kAllDTypes) {
    Tensor source = Tensor::zeros({4}, dtype);
    Tensor imported = comm::from_dlpack(comm::to_dlpack(source));
    CHECK(imported.dtype() == dtype);
    CHECK(imported.data_ptr() == source.data_ptr());
  }
}

TEST_CASE("importing a foreign tensor honours byte_offset and its deleter",
          "[dlpack]") {
  int calls = 0;
  {
    Tensor t = comm::from_dlpack(make_foreign(&calls, 2 * sizeof(float)));
    CHECK(t.shape() == comm::Shape{2, 3});
    CHECK(t.is_contiguous());
    CHECK(t.data<float>()[0] == 2.0f);
    CHECK(calls == 0);
  }
  CHECK(calls == 1);
}

TEST_CASE("an unsupported DLPack tensor is refused and stays the caller's",
          "[dlpack]") {
  int calls = 0;
  DLManagedTensor* managed = make_foreign(&calls, 0);
  managed->dl_tensor.dtype = {kDLComplex, 64, 1};
  CHECK_THROWS_WITH(comm::from_dlpack(managed),
                    Catch::Contains("a tensor of complex64 (DLPack code 5"));
  // torch.int16, by the name torch gives it, and what would do instead.
  managed->dl_tensor.dtype = {kDLInt, 16, 1};
  CHECK_THROWS_WITH(comm::from_dlpack(managed),
                    Catch::Contains("a tensor of int16 (") &&
                        Catch::Contains("supported are float16/32/64"));
  managed->dl_tensor.dtype = {kDLFloat, 32, 4};
  CHECK_THROWS_WITH(comm::from_dlpack(managed), Catch::Contains("4 lanes"));
  managed->dl_tensor.dtype = {kDLFloat, 32, 1};
  managed->dl_tensor.device = {kDLVulkan, 0};
  CHECK_THROWS_AS(comm::from_dlpack(managed), comm::InvalidArgument);
  CHECK(calls == 0);
  managed->deleter(managed);
  CHECK(calls == 1);
  CHECK_THROWS_AS(comm::from_dlpack(nullptr), comm::InvalidArgument);
}
