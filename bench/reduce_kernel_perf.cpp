// reduce_kernel_perf: how close the in-place SUM kernel comes to memcpy.
//
// Both run on the same pair of 64 MiB float32 buffers in one process,
// alternating, so that the machine's noise falls on both alike; the figure
// that matters is their ratio. SUM reads two buffers and writes one, memcpy
// reads one and writes one, so a memory-bound SUM sits near 2/3 of memcpy.
//
//   reduce_kernel_perf [-b BYTES] [-n ITERATIONS] [-d DTYPE] [-o OP]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "libcomm/error.h"
#include "libcomm/reduce_kernels.h"
#include "libcomm/tensor.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

[[noreturn]] void usage(const char* program, const std::string& problem) {
  std::fprintf(stderr,
               "%s: %s\nusage: %s [-b BYTES] [-n ITERATIONS] [-d DTYPE] "
               "[-o OP]\n  defaults: -b 67108864 -n 20 -d float32 -o sum\n",
               program, problem.c_str(), program);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t bytes = 64u << 20;
  int iterations = 20;
  comm::DType dtype = comm::DType::kF32;
  comm::ReduceOp op = comm::ReduceOp::kSum;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (i + 1 >= argc) usage(argv[0], "flag " + flag + " needs a value");
      const std::string value = argv[++i];
      if (flag == "-b") {
        bytes = std::stoull(value);
      } else if (flag == "-n") {
        iterations = std::stoi(value);
        if (iterations < 1) usage(argv[0], "-n must be at least 1");
      } else if (flag == "-d") {
        dtype = comm::parse_dtype(value);
      } else if (flag == "-o") {
        op = comm::parse_reduce_op(value);
      } else {
        usage(argv[0], "unknown flag " + flag);
      }
    }
    comm::check_reduce_op(op, dtype);
  } catch (const std::exception& e) {
    usage(argv[0], e.what());
  }

  const std::size_t count = bytes / comm::dtype_size(dtype);
  bytes = count * comm::dtype_size(dtype);
  // Small integer values keep SUM and PRODUCT finite over many iterations.
  comm::Tensor dst =
      comm::Tensor::full({static_cast<std::int64_t>(count)}, 1.0, dtype);
  comm::Tensor src =
      comm::Tensor::full({static_cast<std::int64_t>(count)}, 1.0, dtype);
  if (op == comm::ReduceOp::kSum || op == comm::ReduceOp::kAvg) {
    src = comm::Tensor::zeros({static_cast<std::int64_t>(count)}, dtype);
  }

  std::vector<double> reduce_times, copy_times;
  // One untimed round first: it faults the pages in.
  for (int i = -1; i < iterations; ++i) {
    auto start = Clock::now();
    comm::reduce_into(op, dtype, dst.data_ptr(), src.data_ptr(), count);
    const double reduce_seconds = seconds_since(start);
    start = Clock::now();
    std::memcpy(dst.data_ptr(), src.data_ptr(), bytes);
    const double copy_seconds = seconds_since(start);
    if (i >= 0) {
      reduce_times.push_back(reduce_seconds);
      copy_times.push_back(copy_seconds);
    }
  }

  const double reduce_rate = static_cast<double>(bytes) / median(reduce_times);
  const double copy_rate = static_cast<double>(bytes) / median(copy_times);
  std::printf(
      "# in-place %s of two %zu-byte %s buffers vs memcpy of %zu bytes, "
      "median of %d\n",
      comm::reduce_op_name(op), bytes, comm::dtype_name(dtype), bytes,
      iterations);
  std::printf("%-10s %14s %12s %10s\n", "kernel", "time_us", "GB/s", "ratio");
  std::printf("%-10s %14.1f %12.2f %10.3f\n", comm::reduce_op_name(op),
              median(reduce_times) * 1e6, reduce_rate / 1e9,
              reduce_rate / copy_rate);
  std::printf("%-10s %14.1f %12.2f %10.3f\n", "memcpy",
              median(copy_times) * 1e6, copy_rate / 1e9, 1.0);
  std::printf("ratio %s/memcpy: %.3f\n", comm::reduce_op_name(op),
              reduce_rate / copy_rate);
  return 0;
}
