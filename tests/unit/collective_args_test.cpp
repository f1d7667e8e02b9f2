// comm::detail's all_to_all checks and layout: every block where the split
// sizes put it, in groups small enough for the layout's own arrays and in
// larger ones, and a clear error for splits that do not cover the tensor.
#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "libcomm/detail/collective_args.h"
#include "libcomm/error.h"
#include "libcomm/tensor.h"

using comm::DType;
using comm::InvalidArgument;
using comm::Tensor;
using comm::detail::all_to_all_layout;
using comm::detail::AllToAllLayout;
using comm::detail::check_all_to_all;

namespace {

// What all_to_all_layout must give for blocks of `rows` rows each (in
// order) of `row` elements.
void require_blocks(std::span<const std::size_t> offsets,
                    std::span<const std::size_t> counts,
                    const std::vector<std::int64_t>& rows, std::size_t row) {
  REQUIRE(offsets.size() == rows.size());
  REQUIRE(counts.size() == rows.size());
  std::size_t at = 0;
  for (std::size_t p = 0; p < rows.size(); ++p) {
    CHECK(offsets[p] == at);
    CHECK(counts[p] == static_cast<std::size_t>(rows[p]) * row);
    at += static_cast<std::size_t>(rows[p]) * row;
  }
}

}  // namespace

TEST_CASE("all_to_all layouts place every block, in small and large groups") {
  // 16 ranks fill the layout's own arrays; 17 and 40 take the heap.
  for (int size : {1, 3, 16, 17, 40}) {
    const auto n = static_cast<std::size_t>(size);
    std::vector<std::int64_t> input_rows(n);
    std::vector<std::int64_t> output_rows(n);
    for (std::size_t p = 0; p < n; ++p) {
      input_rows[p] = static_cast<std::int64_t>(p % 3);
      output_rows[p] = static_cast<std::int64_t>((p + 1) % 4);
    }
    const std::int64_t in_total =
        std::accumulate(input_rows.begin(), input_rows.end(), std::int64_t{0});
    const std::int64_t out_total = std::accumulate(
        output_rows.begin(), output_rows.end(), std::int64_t{0});
    const Tensor input = Tensor::zeros({in_total, 5}, DType::kF32);
    const Tensor output = Tensor::zeros({out_total, 5}, DType::kF32);
    check_all_to_all(output, input, input_rows, output_rows, size);
    AllToAllLayout layout =
        all_to_all_layout(output, input, input_rows, output_rows, size);
    require_blocks(layout.send_offsets(), layout.send_counts(), input_rows, 5);
    require_blocks(layout.receive_offsets(), layout.receive_counts(),
                   output_rows, 5);

    // Moved (into a task) and scaled to bytes, it still describes them,
    // whatever becomes of the layout it was moved from, which describes no
    // ranks.
    AllToAllLayout moved = std::move(layout);
    REQUIRE(layout.send_counts().empty());  // NOLINT(bugprone-use-after-move)
    REQUIRE(layout.receive_offsets().empty());
    layout = AllToAllLayout(size);
    for (std::size_t& entry : layout.send_counts()) entry = 99;
    moved.scale(4);
    require_blocks(moved.send_offsets(), moved.send_counts(), input_rows, 20);
    require_blocks(moved.receive_offsets(), moved.receive_counts(), output_rows,
                   20);

    // Without split sizes every rank gets as many rows.
    const Tensor even = Tensor::zeros({2 * size, 3}, DType::kI32);
    check_all_to_all(even, even, {}, {}, size);
    const AllToAllLayout equal = all_to_all_layout(even, even, {}, {}, size);
    require_blocks(equal.send_offsets(), equal.send_counts(),
                   std::vector<std::int64_t>(n, 2), 3);
    require_blocks(equal.receive_offsets(), equal.receive_counts(),
                   std::vector<std::int64_t>(n, 2), 3);
  }
}

TEST_CASE("all_to_all splits that do not cover the tensor are refused") {
  const Tensor t = Tensor::zeros({6, 2}, DType::kF32);
  // Rows not divisible by the group, without split sizes.
  CHECK_THROWS_WITH(check_all_to_all(t, t, {}, {}, 4),
                    Catch::Contains("not divisible by the group size 4") &&
                        Catch::Contains("pass split sizes"));
  // Splits that add up to too few or too many rows, have a negative count,
  // or are not one per rank.
  for (const std::vector<std::int64_t>& bad :
       std::vector<std::vector<std::int64_t>>{
           {1, 1, 1}, {3, 3, 1}, {7, -1, 0}, {3, 3}, {2, 2, 2, 0}}) {
    CHECK_THROWS_AS(check_all_to_all(t, t, bad, {2, 2, 2}, 3), InvalidArgument);
    CHECK_THROWS_WITH(check_all_to_all(t, t, {2, 2, 2}, bad, 3),
                      Catch::Contains("output split sizes must be one "
                                      "non-negative row count per rank "
                                      "adding up to 6"));
  }
  check_all_to_all(t, t, {6, 0, 0}, {0, 0, 6}, 3);
}

TEST_CASE(
    "a tensor on a CUDA device this process does not see is refused, "
    "naming the device once and the devices there are") {
  float value = 0;
  // Past any machine's device count.
  const Tensor far =
      Tensor::from_blob(&value, {1}, DType::kF32, comm::Device::cuda(4000));
  try {
    comm::detail::check_tensor(far, "all_reduce", "output");
    FAIL("accepted a tensor on cuda:4000");
  } catch (const InvalidArgument& e) {
    const std::string message = e.what();
    CHECK_THAT(message, Catch::StartsWith("all_reduce output: ") &&
                            Catch::Contains("does not exist") &&
                            Catch::Contains("this process sees"));
    // The device appears once, in the tensor's description.
    CHECK(message.find("cuda:4000") != std::string::npos);
    CHECK(message.find("cuda:4000") == message.rfind("cuda:4000"));
  }
}

TEST_CASE(
    "outputs that share memory are refused, naming the two, in short lists "
    "and long ones; outputs apart, inputs that share, and empty outputs "
    "pass") {
  using comm::detail::check_tensor_list;
  std::vector<float> memory(64 * 8);
  const auto view = [&](std::size_t at, std::int64_t count) {
    return Tensor::from_blob(memory.data() + at, {count}, DType::kF32);
  };
  for (const std::size_t size : {2UL, 5UL, 16UL, 17UL, 64UL}) {
    INFO("outputs: " << size);
    const Tensor like = Tensor::zeros({8}, DType::kF32);
    std::vector<Tensor> apart;
    // Placed out of order, back to back, so that sorting them matters.
    for (std::size_t i = 0; i < size; ++i) {
      apart.push_back(view(((i * 7) % size) * 8, 8));
    }
    check_tensor_list("all_gather", apart, size, like, "output");

    std::vector<Tensor> same = apart;  // `[t] * world`
    same.back() = same.front();
    CHECK_THROWS_WITH(
        check_tensor_list("all_gather", same, size, like, "output"),
        Catch::Contains("all_gather: outputs 0 and " +
                        std::to_string(size - 1) + " share memory"));
    // One output straddling the first two blocks, which others hold.
    std::vector<Tensor> straddles = apart;
    straddles[size / 2] = view(4, 8);
    CHECK_THROWS_AS(
        check_tensor_list("gather", straddles, size, like, "output"),
        InvalidArgument);
    // The same tensor as every input (scatter from one buffer) is fine.
    const std::vector<Tensor> inputs(size, apart.front());
    check_tensor_list("scatter", inputs, size, like, "input");
  }
  // Empty outputs share no byte, wherever they point.
  const Tensor none = Tensor::zeros({0}, DType::kF32);
  const std::vector<Tensor> empties(20, view(0, 0));
  check_tensor_list("all_gather", empties, 20, none, "output");
}

TEST_CASE(
    "check_apart, past 16 outputs, finds two that share memory with an "
    "empty one sorted between them, and keeps devices apart") {
  using comm::detail::check_apart;
  std::vector<float> memory(1000);
  const auto at = [&](std::size_t start, std::int64_t count,
                      comm::Device device = comm::Device::cpu()) {
    return Tensor::from_blob(memory.data() + start, {count}, DType::kF32,
                             device);
  };
  // Twenty outputs apart, ten elements each from 500 on, and empty ones
  // inside them: the sorted path, as more than 16.
  std::vector<Tensor> outputs;
  for (std::size_t i = 0; i < 20; ++i) {
    outputs.push_back(at(500 + i * 10, 10));
    outputs.push_back(at(500 + i * 10 + 5, 0));
  }
  check_apart("all_gather", outputs);
  // The same addresses on a CUDA device are other memory, even sorted
  // between the CPU ones' starts.
  std::vector<Tensor> two_devices = outputs;
  for (std::size_t i = 0; i < 20; ++i) {
    two_devices.push_back(at(500 + i * 10 + 3, 10, comm::Device::cuda(0)));
  }
  check_apart("all_gather", two_devices);
  // A long output, then an empty one inside it, then one it overlaps:
  // the empty one in between must not hide the overlap.
  std::vector<Tensor> empty_between = {at(0, 100), at(10, 0), at(20, 10)};
  empty_between.insert(empty_between.end(), outputs.begin(), outputs.end());
  CHECK_THROWS_WITH(check_apart("gather", empty_between),
                    Catch::Contains("gather: outputs 0 and 2 share memory"));
  // Overlapping outputs, one on each device, with another device's
  // output sorted between them in address.
  std::vector<Tensor> devices_between = outputs;
  devices_between.push_back(at(0, 10, comm::Device::cuda(0)));
  devices_between.push_back(at(2, 10));
  devices_between.push_back(at(5, 10, comm::Device::cuda(0)));
  CHECK_THROWS_WITH(check_apart("gather", devices_between),
                    Catch::Contains("outputs 40 and 42 share memory"));
}
