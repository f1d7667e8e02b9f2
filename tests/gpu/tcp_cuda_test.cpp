// CUDA tensors through the TCP backend, staged through host memory, with
// 2 to 4 ranks (threads) sharing one GPU.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <string>

#include "libcomm/distributed/process_group.h"
#include "support/rank_checks.h"
#include "support/thread_ranks.h"

using comm::Device;
using comm::DType;
using comm::ProcessGroup;
using comm::Tensor;
using comm::testing::expect;
using comm::testing::run_ranks;

namespace {

float first(const Tensor& cuda) {
  return cuda.to(Device::cpu()).data<float>()[0];
}
float last(const Tensor& cuda) {
  Tensor host = cuda.to(Device::cpu());
  return host.data<float>()[host.numel() - 1];
}

}  // namespace

TEST_CASE("collectives and point-to-point on CUDA tensors", "[gpu][tcp]") {
  for (int world = 2; world <= 4; ++world) {
    auto errors = run_ranks(world, [&](ProcessGroup& group) {
      const int me = group.rank();
      const Device gpu = Device::cuda(0);
      for (std::int64_t count : {1, 1003, 1 << 20}) {
        Tensor sum = Tensor::full({count}, me + 1, DType::kF32, gpu);
        group.all_reduce(sum)->wait();
        expect(first(sum) == world * (world + 1) / 2 && last(sum) == first(sum),
               "all_reduce");

        Tensor b = Tensor::full({count}, me == 1 ? 7.0 : 0.0, DType::kF32, gpu);
        group.broadcast(b, {1})->wait();
        expect(last(b) == 7.0f, "broadcast");

        Tensor r = Tensor::full({count}, 2.0, DType::kF32, gpu);
        group.reduce(r, {0, comm::ReduceOp::kProduct})->wait();
        if (me == 0)
          expect(first(r) == static_cast<float>(1 << world), "reduce");

        std::vector<Tensor> outputs;
        for (int q = 0; q < world; ++q)
          outputs.push_back(Tensor::zeros({count}, DType::kF32, gpu));
        group.all_gather(outputs, Tensor::full({count}, me, DType::kF32, gpu))
            ->wait();
        for (int q = 0; q < world; ++q)
          expect(last(outputs[q]) == q, "all_gather");

        const int right = (me + 1) % world;
        const int left = (me + world - 1) % world;
        Tensor in = Tensor::zeros({count}, DType::kF32, gpu);
        auto receive = group.irecv(in, left);
        group.isend(Tensor::full({count}, me, DType::kF32, gpu), right)->wait();
        receive->wait();
        expect(last(in) == left, "send/recv");
      }
    });
    INFO("world " << world);
    for (const auto& error : errors) CHECK(error == "");
  }
}
