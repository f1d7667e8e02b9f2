// reduce_kernel_perf: how close the in-place SUM kernel comes to memcpy.
//
// Both run on the same pair of 64 MiB float32 buffers in one process,
// alternating, so that the machine's noise falls on both alike; the figure
// that matters is their ratio. SUM reads two buffers and writes one, memcpy
// reads one and writes one, so a memory-bound SUM sits near 2/3 of memcpy.
//
//   reduce_kernel_perf [-b BYTES[K|M|G]] [-n ITERATIONS] [-d DTYPE] [-o OP]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench/harness/options.h"
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "reduce_kernel_perf: an in-place reduction of one buffer into another "
      "against memcpy of the same bytes, alternating, in one process"};
  std::string bytes_text = "64M", dtype_text = "float32", op_text = "sum";
  int iterations = 20;
  app.add_option("-b,--bytes", bytes_text,
                 "bytes of each buffer, with an optional K, M or G suffix "
                 "(default 64M)");
  app.add_option("-n,--iters", iterations,
                 "timed runs of each, alternating (default 20)")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("-d,--dtype", dtype_text, "element type (default float32)");
  app.add_option("-o,--op", op_text, "reduction (default sum)");
  std::size_t bytes = 0;
  comm::DType dtype = comm::DType::kF32;
  comm::ReduceOp op = comm::ReduceOp::kSum;
  try {
    app.parse(argc, argv);
    const std::int64_t parsed = comm::bench::parse_size("-b", bytes_text);
    dtype = comm::parse_dtype(dtype_text);
    op = comm::parse_reduce_op(op_text);
    comm::check_reduce_op(op, dtype);
    if (parsed < static_cast<std::int64_t>(comm::dtype_size(dtype))) {
      throw comm::bench::UsageError("-b " + bytes_text +
                                    " holds no element of " + dtype_text +
                                    "; pass at least one element's bytes");
    }
    bytes = static_cast<std::size_t>(parsed);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help, or the status of a bad flag
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "reduce_kernel_perf: %s\nRun '%s --help' for the options.\n",
                 e.what(), argv[0]);
    return 2;
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
