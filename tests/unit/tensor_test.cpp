#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>
#include <vector>

#include "libcomm/cuda.h"
#include "libcomm/error.h"
#include "libcomm/tensor.h"

using comm::DType;
using comm::Tensor;

TEST_CASE("factories make contiguous CPU tensors", "[tensor]") {
  Tensor e = Tensor::empty({2, 3, 4}, DType::kF64);
  CHECK(e.defined());
  CHECK(e.numel() == 24);
  CHECK(e.nbytes() == 24 * 8);
  CHECK(e.dim() == 3);
  CHECK(e.size(-1) == 4);
  CHECK(e.strides() == comm::Strides{12, 4, 1});
  CHECK(e.is_contiguous());
  CHECK(e.device() == comm::Device::cpu());
  CHECK(reinterpret_cast<std::uintptr_t>(e.data_ptr()) % 64 == 0);

  Tensor z = Tensor::zeros({5}, DType::kI32);
  for (int i = 0; i < 5; ++i) CHECK(z.data<std::int32_t>()[i] == 0);

  Tensor f = Tensor::full({3}, 2.5, DType::kBF16);
  CHECK(static_cast<float>(f.data<comm::BFloat16>()[2]) == 2.5f);
  Tensor b = Tensor::full({2}, 7.0, DType::kBool);
  CHECK(*static_cast<std::uint8_t*>(b.data_ptr()) == 1);

  Tensor r = Tensor::arange(6, DType::kI64);
  CHECK(r.shape() == comm::Shape{6});
  CHECK(r.data<std::int64_t>()[5] == 5);

  Tensor scalar = Tensor::full({}, 3.0, DType::kF32);
  CHECK(scalar.numel() == 1);
  CHECK(scalar.dim() == 0);
  Tensor nothing = Tensor::empty({0, 4}, DType::kF32);
  CHECK(nothing.numel() == 0);
  CHECK(nothing.is_contiguous());
  // No elements: contiguous whatever the strides, and sizes whose product
  // would overflow are never multiplied.
  float unused = 0;
  Tensor huge_and_empty = Tensor::from_blob(
      &unused, {0, std::int64_t{1} << 40, std::int64_t{1} << 40},
      {0, std::int64_t{1} << 40, 1}, DType::kF32);
  CHECK(huge_and_empty.numel() == 0);
  CHECK(huge_and_empty.is_contiguous());
}

TEST_CASE("bad shapes and types are InvalidArgument", "[tensor]") {
  CHECK_THROWS_AS(Tensor::empty({2, -1}, DType::kF32), comm::InvalidArgument);
  CHECK_THROWS_AS(Tensor::empty({INT64_MAX, 4}, DType::kF32),
                  comm::InvalidArgument);
  Tensor t = Tensor::zeros({2}, DType::kF32);
  CHECK_THROWS_WITH(t.data<double>(), Catch::Contains("float64") &&
                                          Catch::Contains("float32[2]"));
  CHECK_THROWS_AS(t.size(1), comm::InvalidArgument);
}

TEST_CASE("slice views rows of dimension 0", "[tensor]") {
  Tensor t = Tensor::arange(12, DType::kF32).view({4, 3});
  Tensor rows = t.slice(1, 3);
  CHECK(rows.shape() == comm::Shape{2, 3});
  CHECK(rows.storage_offset() == 3);
  CHECK(rows.data_ptr() == t.data<float>() + 3);
  CHECK(rows.is_contiguous());
  rows.data<float>()[0] = 100.0f;  // shares memory with t
  CHECK(t.data<float>()[3] == 100.0f);
  CHECK(t.slice(4, 4).numel() == 0);
  CHECK_THROWS_AS(t.slice(2, 5), comm::InvalidArgument);
  CHECK_THROWS_AS(t.slice(3, 2), comm::InvalidArgument);
  CHECK_THROWS_AS(Tensor::full({}, 1.0, DType::kF32).slice(0, 0),
                  comm::InvalidArgument);
}

TEST_CASE("a copy keeps its own shape while the original is reassigned",
          "[tensor]") {
  Tensor t = Tensor::arange(12, DType::kF32).view({4, 3});
  Tensor copy = t;
  t = t.slice(1, 2);
  CHECK(t.shape() == comm::Shape{1, 3});
  CHECK(copy.shape() == comm::Shape{4, 3});
  CHECK(copy.strides() == comm::Strides{3, 1});
  CHECK(copy.numel() == 12);
  Tensor moved = std::move(copy);
  CHECK(moved.shape() == comm::Shape{4, 3});
  CHECK(Tensor().dim() == 0);
  CHECK(Tensor().shape().empty());
}

TEST_CASE("contiguity is checked where it is required", "[tensor]") {
  std::vector<float> memory(24);
  // Columns 0..1 of a 4x6 matrix: shape [4, 2], strides [6, 1].
  Tensor columns =
      Tensor::from_blob(memory.data(), {4, 2}, {6, 1}, DType::kF32);
  CHECK_FALSE(columns.is_contiguous());
  CHECK_THROWS_WITH(
      columns.check_contiguous("all_reduce"),
      Catch::Contains("all_reduce") && Catch::Contains("[4, 2]") &&
          Catch::Contains("[6, 1]") && Catch::Contains("contiguous()"));
  CHECK_THROWS_AS(columns.view({8}), comm::InvalidArgument);
  // Size-1 dimensions may carry any stride.
  Tensor row = Tensor::from_blob(memory.data(), {1, 6}, {100, 1}, DType::kF32);
  CHECK(row.is_contiguous());
}

TEST_CASE("copy_ copies strided host tensors and contiguous() packs them",
          "[tensor]") {
  std::vector<std::int32_t> memory(24);
  for (int i = 0; i < 24; ++i) memory[i] = i;
  // A transposed 4x6 view: shape [6, 4], strides [1, 6].
  Tensor transposed =
      Tensor::from_blob(memory.data(), {6, 4}, {1, 6}, DType::kI32);
  Tensor packed = transposed.contiguous();
  CHECK(packed.is_contiguous());
  CHECK(packed.data_ptr() != transposed.data_ptr());
  for (int r = 0; r < 6; ++r) {
    for (int c = 0; c < 4; ++c) {
      CHECK(packed.data<std::int32_t>()[r * 4 + c] == c * 6 + r);
    }
  }
  Tensor back = Tensor::zeros({6, 4}, DType::kI32);
  back.copy_(packed);
  CHECK(std::vector<std::int32_t>(back.data<std::int32_t>(),
                                  back.data<std::int32_t>() + 24) ==
        std::vector<std::int32_t>(packed.data<std::int32_t>(),
                                  packed.data<std::int32_t>() + 24));
  // Strided destination.
  Tensor target = Tensor::from_blob(memory.data(), {6, 4}, {1, 6}, DType::kI32);
  target.copy_(Tensor::zeros({6, 4}, DType::kI32));
  for (int i = 0; i < 24; ++i) CHECK(memory[i] == 0);

  CHECK_THROWS_AS(back.copy_(Tensor::zeros({6, 4}, DType::kF32)),
                  comm::InvalidArgument);
  CHECK_THROWS_AS(back.copy_(Tensor::zeros({4, 6}, DType::kI32)),
                  comm::InvalidArgument);
}

TEST_CASE("from_blob never frees borrowed memory", "[tensor]") {
  // Under ASan a free of stack memory would abort the test.
  float stack_memory[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  {
    Tensor view = Tensor::from_blob(stack_memory, {2, 4}, DType::kF32);
    Tensor copy = view;  // another handle to the same storage
    Tensor rows = view.slice(1, 2);
    CHECK(rows.data<float>()[0] == 5.0f);
  }
  CHECK(stack_memory[7] == 8.0f);
}

TEST_CASE("a from_blob deleter runs exactly once, after the last view",
          "[tensor]") {
  int calls = 0;
  std::vector<float> memory(4, 1.0f);
  Tensor rows;
  {
    Tensor t = Tensor::from_blob(memory.data(), {4}, DType::kF32,
                                 comm::Device::cpu(), [&](void* p) {
                                   CHECK(p == memory.data());
                                   ++calls;
                                 });
    rows = t.slice(2, 4);
    Tensor flat = t.flatten();
  }
  CHECK(calls == 0);  // `rows` still views the memory
  rows = Tensor();
  CHECK(calls == 1);

  SECTION("even when from_blob rejects its arguments") {
    int rejected_calls = 0;
    CHECK_THROWS_AS(Tensor::from_blob(memory.data(), {4}, {1, 1}, DType::kF32,
                                      comm::Device::cpu(),
                                      [&](void*) { ++rejected_calls; }),
                    comm::InvalidArgument);
    CHECK(rejected_calls == 1);
  }
}

TEST_CASE(
    "CUDA tensors are made on a device that exists and refused on one "
    "that does not",
    "[tensor]") {
  const int devices = comm::cuda_device_count();
  if (devices == 0) {
    // Only the refusal can be checked here; the gpu suite covers the rest.
    WARN("no CUDA device"
         << (comm::built_with_cuda() ? "" : " (libcomm built without CUDA)")
         << ": CUDA tensors are checked to be refused, not made");
    CHECK_THROWS_AS(Tensor::empty({4}, DType::kF32, comm::Device::cuda(0)),
                    comm::Error);
    return;
  }
  Tensor made = Tensor::full({4}, 2.5, DType::kF32, comm::Device::cuda(0));
  CHECK(made.device() == comm::Device::cuda(0));
  CHECK(made.numel() == 4);
  const Tensor back = made.to(comm::Device::cpu());
  for (int i = 0; i < 4; ++i) CHECK(back.data<float>()[i] == 2.5f);
  CHECK_THROWS_AS(Tensor::empty({4}, DType::kF32, comm::Device::cuda(devices)),
                  comm::Error);
}
