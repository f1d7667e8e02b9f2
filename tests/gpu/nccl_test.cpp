// The NCCL backend on one GPU (NCCL refuses two ranks on one GPU, so the
// group has one rank): every collective, stream ordering, the watchdog's
// timeout and abort, destruction with work in flight, and a group that
// routes host tensors to TCP and CUDA tensors to NCCL.
#include <cuda_runtime_api.h>

#include <catch2/catch.hpp>

#include <chrono>
#include <optional>
#include <thread>

#include "backends/nccl/nccl_backend.h"
#include "libcomm/cuda.h"
#include "libcomm/detail/dispatch.h"
#include "libcomm/distributed/ddp/distributed_data_parallel.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "store/hash_store.h"
#include "support/capture_stderr.h"

using comm::Device;
using comm::DType;
using comm::ProcessGroup;
using comm::ReduceOp;
using comm::Tensor;
using namespace std::chrono_literals;

namespace {

const Device kGpu = Device::cuda(0);

std::unique_ptr<ProcessGroup> nccl_group(
    const std::string& backend = "nccl",
    std::chrono::milliseconds timeout = 60s) {
  return std::make_unique<ProcessGroup>(std::make_shared<comm::HashStore>(), 0,
                                        1, backend, timeout);
}

std::vector<double> host_values(const Tensor& t) {
  const Tensor host = t.to(Device::cpu());
  std::vector<double> values;
  comm::detail::dispatch_dtype(host.dtype(), [&]<typename T>() {
    for (std::int64_t i = 0; i < host.numel(); ++i) {
      if constexpr (std::is_same_v<T, comm::Float16> ||
                    std::is_same_v<T, comm::BFloat16>) {
        values.push_back(static_cast<float>(host.data<T>()[i]));
      } else {
        values.push_back(static_cast<double>(host.data<T>()[i]));
      }
    }
  });
  return values;
}

// A CUDA stream whose work waits `ms` on a host callback first: what the
// group's stream must wait behind, when it is the caller's stream. With
// cudaStreamNonBlocking, work on the legacy default stream does not wait
// for it either.
struct SlowStream {
  cudaStream_t stream = nullptr;
  explicit SlowStream(int ms, unsigned flags = cudaStreamDefault) {
    REQUIRE(cudaStreamCreateWithFlags(&stream, flags) == cudaSuccess);
    delay = ms;
    REQUIRE(cudaLaunchHostFunc(stream, &SlowStream::sleep, &delay) ==
            cudaSuccess);
  }
  ~SlowStream() {
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
  }
  static void sleep(void* ms) {
    std::this_thread::sleep_for(
        std::chrono::milliseconds(*static_cast<int*>(ms)));
  }
  int delay = 0;
};

// An int32 input of 1<<20 elements that the stream `slow` fills with 0x01
// bytes only after 300 ms (the "kernel" that produces it), and a zeroed
// output: what a collective issued on that stream must wait for.
struct LateInput {
  explicit LateInput(unsigned stream_flags) {
    // The zeros are in place before the slow stream starts its wait, so
    // that this synchronization cannot wait for it.
    comm::synchronize_cuda_stream(0);
    slow.emplace(300, stream_flags);
    REQUIRE(cudaMemsetAsync(input.data_ptr(), 1, input.nbytes(),
                            slow->stream) == cudaSuccess);
  }
  Tensor input = Tensor::zeros({1 << 20}, DType::kI32, kGpu);
  Tensor output = Tensor::zeros({1 << 20}, DType::kI32, kGpu);
  std::optional<SlowStream> slow;
};

}  // namespace

TEST_CASE("every collective at world size 1", "[gpu][nccl]") {
  auto group = nccl_group();
  CHECK(group->backend_name() == "nccl");
  for (DType dtype : {DType::kF32, DType::kI32, DType::kF16, DType::kBF16,
                      DType::kI64, DType::kU8, DType::kF64, DType::kI8}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct,
                        ReduceOp::kMin, ReduceOp::kMax}) {
      INFO(comm::dtype_name(dtype) << " " << comm::reduce_op_name(op));
      Tensor t = Tensor::full({1003}, 3, dtype, kGpu);
      group->all_reduce(t, {.op = op})->wait();
      Tensor r = Tensor::full({17}, 5, dtype, kGpu);
      group->reduce(r, {.root = 0, .op = op})->wait();
      comm::synchronize_cuda_stream(0);
      CHECK(host_values(t)[1002] == 3);
      CHECK(host_values(r)[16] == 5);
    }
  }
  Tensor flag = Tensor::full({4}, 1, DType::kBool, kGpu);
  group->all_reduce(flag)->wait();
  Tensor b = Tensor::full({64}, 9, DType::kF32, kGpu);
  group->broadcast(b, {.root = 0})->wait();

  Tensor in = Tensor::arange(8, DType::kF32, kGpu);
  std::vector<Tensor> list{Tensor::zeros({8}, DType::kF32, kGpu)};
  group->all_gather(list, in)->wait();
  Tensor flat = Tensor::zeros({8}, DType::kF32, kGpu);
  group->all_gather_into(flat, in)->wait();
  Tensor scattered = Tensor::zeros({8}, DType::kF32, kGpu);
  group->reduce_scatter(scattered, {in})->wait();
  Tensor own = in.clone();
  group->reduce_scatter(own, {own})->wait();  // in place
  std::vector<Tensor> gathered{Tensor::zeros({8}, DType::kF32, kGpu)};
  group->gather(gathered, in, {.root = 0})->wait();
  Tensor out = Tensor::zeros({8}, DType::kF32, kGpu);
  group->scatter(out, {in}, {.root = 0})->wait();
  Tensor a2a = Tensor::zeros({8}, DType::kF32, kGpu);
  group->all_to_all(a2a, in)->wait();
  Tensor a2a_in_place = in.clone();
  group->all_to_all(a2a_in_place, a2a_in_place)->wait();
  group->barrier()->wait();
  comm::synchronize_cuda_stream(0);

  const std::vector<double> expected{0, 1, 2, 3, 4, 5, 6, 7};
  for (const Tensor* t : {&list[0], &flat, &scattered, &own, &gathered[0], &out,
                          &a2a, &a2a_in_place}) {
    CHECK(host_values(*t) == expected);
  }
  CHECK(host_values(b) == std::vector<double>(64, 9));
  group->shutdown();
}

TEST_CASE("blocks that are not one flat buffer are staged, in stream order",
          "[gpu][nccl]") {
  // NCCL takes all_gather's outputs and reduce_scatter's inputs as one flat
  // buffer, in place only at this rank's own block. Here the other buffer
  // overlaps that flat buffer elsewhere, so the backend must stage; at
  // world size 1 each result is the input.
  auto group = nccl_group();
  const std::vector<double> expected{0, 1, 2, 3, 4, 5, 6, 7};
  for (int round = 0; round < 3; ++round) {  // later rounds reuse the pool
    Tensor buffer = Tensor::arange(12, DType::kF32, kGpu);
    Tensor input = buffer.slice(0, 8);
    std::vector<Tensor> outputs{buffer.slice(4, 12)};
    group->all_gather(outputs, input)->wait();
    comm::synchronize_cuda_stream(0);
    CHECK(host_values(outputs[0]) == expected);

    Tensor other = Tensor::arange(12, DType::kF32, kGpu);
    Tensor output = other.slice(4, 12);
    group->reduce_scatter(output, {other.slice(0, 8)})->wait();
    comm::synchronize_cuda_stream(0);
    CHECK(host_values(output) == expected);

    Tensor in_place = Tensor::arange(8, DType::kF32, kGpu);
    group->all_to_all(in_place, in_place)->wait();
    comm::synchronize_cuda_stream(0);
    CHECK(host_values(in_place) == expected);
  }
}

TEST_CASE("arguments NCCL cannot serve are refused by name", "[gpu][nccl]") {
  auto group = nccl_group();
  Tensor t = Tensor::full({4}, 1, DType::kI32, kGpu);
  CHECK_THROWS_WITH(group->all_reduce(t, {.op = ReduceOp::kBxor}),
                    Catch::Contains("bxor") && Catch::Contains("NCCL"));
  CHECK_THROWS_WITH(group->irecv(t, comm::kAnySource),
                    Catch::Contains("any source"));
  Tensor host = Tensor::full({4}, 1, DType::kI32);
  CHECK_THROWS_WITH(group->all_reduce(host), Catch::Contains("host memory"));
  CHECK_THROWS_AS(group->isend(t, 0), comm::InvalidArgument);  // itself
  if (comm::cuda_device_count() > 1) {
    group->all_reduce(t)->wait();  // binds the group to cuda:0
    Tensor other = Tensor::full({4}, 1, DType::kI32, Device::cuda(1));
    CHECK_THROWS_WITH(group->all_reduce(other),
                      Catch::Contains("cuda:1") && Catch::Contains("cuda:0"));
  }
}

TEST_CASE("a collective runs after the work queued on the caller's stream",
          "[gpu][nccl]") {
  auto group = nccl_group();
  LateInput late(cudaStreamDefault);
  {
    comm::CudaStreamGuard guard(0, late.slow->stream);
    auto work = group->all_gather_into(late.output, late.input);
    work->wait();  // orders the slow stream after it; the host goes on
    CHECK_FALSE(work->is_completed());
    REQUIRE(cudaStreamSynchronize(late.slow->stream) == cudaSuccess);
  }
  const auto values = host_values(late.output);
  CHECK(values.front() == 0x01010101);
  CHECK(values.back() == 0x01010101);
}

TEST_CASE("all_reduce_into reads its input in stream order and keeps it",
          "[gpu][nccl]") {
  auto group = nccl_group();
  // Non-blocking: a copy on the legacy stream, made on the host when the
  // call is issued, would read the zeros the memset has not replaced yet.
  LateInput late(cudaStreamNonBlocking);
  {
    comm::CudaStreamGuard guard(0, late.slow->stream);
    group->all_reduce_into(late.output, late.input, {.op = ReduceOp::kMax})
        ->wait();
    REQUIRE(cudaStreamSynchronize(late.slow->stream) == cudaSuccess);
  }
  const auto result = host_values(late.output);
  CHECK(result.front() == 0x01010101);
  CHECK(result.back() == 0x01010101);
  CHECK(host_values(late.input).back() == 0x01010101);
}

TEST_CASE("the watchdog fails a timed-out collective and aborts",
          "[gpu][nccl]") {
  auto group = nccl_group();
  Tensor t = Tensor::full({16}, 1, DType::kF32, kGpu);
  group->all_reduce(t)->wait();  // the communicator exists
  SlowStream slow(2000);
  std::shared_ptr<comm::Work> work;
  {
    comm::CudaStreamGuard guard(0, slow.stream);
    work = group->all_reduce(t, {.timeout = 200ms});
  }
  try {
    work->wait(10s);
    FAIL("the collective did not fail");
  } catch (const comm::TimeoutError& e) {
    CHECK_THAT(e.what(),
               Catch::Contains("all_reduce #1") && Catch::Contains("aborted"));
  }
  // The group refuses further work instead of hanging on a dead
  // communicator.
  CHECK_THROWS_WITH(group->all_reduce(t), Catch::Contains("aborted"));
}

TEST_CASE("a Work on an aborted communicator fails instead of hanging",
          "[gpu][nccl]") {
  auto group = nccl_group();
  Tensor t = Tensor::full({16}, 1, DType::kF32, kGpu);
  group->all_reduce(t)->wait();
  SlowStream slow(2000);
  std::shared_ptr<comm::Work> work;
  {
    comm::CudaStreamGuard guard(0, slow.stream);
    work = group->all_reduce(t);
  }
  dynamic_cast<comm::NcclBackend&>(*group->backend(comm::DeviceType::kCUDA))
      .abort("told to by a test");
  CHECK_THROWS_WITH(work->wait(10s), Catch::Contains("told to by a test"));
  CHECK_FALSE(work->is_success());
}

TEST_CASE("destroying a group with work in flight does not hang",
          "[gpu][nccl]") {
  Tensor t = Tensor::full({16}, 1, DType::kF32, kGpu);
  std::shared_ptr<comm::Work> work;
  SlowStream slow(2000);
  {
    auto group = nccl_group();
    group->all_reduce(t)->wait();
    comm::CudaStreamGuard guard(0, slow.stream);
    work = group->all_reduce(t);
  }  // the group goes away here
  CHECK_THROWS_WITH(work->wait(10s), Catch::Contains("shut down"));
}

TEST_CASE("a group shut down after its work ran finalizes instead of aborting",
          "[gpu][nccl]") {
  // The work is done on the GPU, but the watchdog may not have looked yet:
  // shutdown must see that, not abort the communicator as if it hung.
  const std::string log = comm::testing::capture_stderr([] {
    auto group = nccl_group();
    Tensor t = Tensor::full({1 << 20}, 1, DType::kF32, kGpu);
    for (int i = 0; i < 4; ++i) group->all_reduce(t)->wait();
    comm::synchronize_cuda_stream(0);
    group->shutdown();
  });
  CHECK_THAT(log, !Catch::Contains("aborting"));
}

TEST_CASE("\"cpu:tcp,cuda:nccl\" routes each call by its tensor's device",
          "[gpu][nccl][router]") {
  auto group = nccl_group("cpu:tcp,cuda:nccl");
  CHECK(group->backend_name() == "cpu:tcp,cuda:nccl");
  Tensor host = Tensor::full({8}, 2, DType::kF32);
  Tensor gpu = Tensor::full({8}, 3, DType::kF32, kGpu);
  group->all_reduce(host)->wait();
  group->all_reduce(gpu)->wait();
  group->barrier()->wait();
  comm::synchronize_cuda_stream(0);
  CHECK(host.data<float>()[7] == 2);
  CHECK(host_values(gpu) == std::vector<double>(8, 3));
  std::vector<Tensor> mixed{Tensor::zeros({8}, DType::kF32)};
  CHECK_THROWS_WITH(group->all_gather(mixed, gpu),
                    Catch::Contains("different kinds of device"));
}

TEST_CASE("DDP averages CUDA gradients over the NCCL backend",
          "[gpu][nccl][ddp]") {
  std::shared_ptr<ProcessGroup> group = nccl_group();
  std::vector<comm::Parameter> params;
  for (int p = 0; p < 3; ++p) {
    params.push_back({"p" + std::to_string(p),
                      Tensor::full({1000 + p}, p, DType::kF32, kGpu),
                      Tensor::full({1000 + p}, 0.5, DType::kF32, kGpu)});
  }
  comm::DdpOptions options;
  options.first_bucket_mb = 0.004;  // a bucket per parameter
  options.bucket_cap_mb = 0.004;
  comm::DistributedDataParallel ddp(group, params, {}, options);
  CHECK(ddp.bucket_count() == 3);
  for (std::size_t p = 3; p-- > 0;) ddp.mark_grad_ready(p);
  ddp.finish();
  comm::synchronize_cuda_stream(0);
  for (std::size_t p = 0; p < 3; ++p)
    CHECK(host_values(ddp.grad(p)) == std::vector<double>(1000 + p, 0.5));
}
