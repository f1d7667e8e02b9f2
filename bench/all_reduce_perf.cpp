// all_reduce_perf: all_reduce bandwidth over the TCP backend, float32 sum,
// with the columns of ../shared/peers/ (bytes, time_us, algbw, busbw) so
// that the peers' figures compare line by line.
//
//   all_reduce_perf [-np N] [-b MIN_BYTES] [-e MAX_BYTES] [-f FACTOR]
//                   [-n ITERS] [-w WARMUP] [-c CHECK]
//
// It starts N local ranks itself (forked processes, joined over tcp:// on
// loopback). With -n 0 (the default) each size runs as many iterations as
// the peers do: 2^26 / bytes, clamped to [3, 200]. busbw = algbw * 2(n-1)/n,
// as nccl-tests defines it. The full nccl-tests harness comes with the
// bench binaries' issue; this is the driver the TCP backend is tuned with.
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "libcomm/detail/socket.h"
#include "libcomm/error.h"
#include "libcomm/process_group.h"

namespace {

struct Config {
  int ranks = 2;
  std::int64_t min_bytes = 1024;
  std::int64_t max_bytes = 64 << 20;
  int factor = 4;
  int iterations = 0;
  int warmup = 2;
  bool check = false;
};

int run_rank(const Config& config, const std::string& url, int rank) {
  auto group = comm::init_process_group("tcp", url, rank, config.ranks,
                                        std::chrono::seconds(120));
  const int world = group->size();
  if (rank == 0) {
    std::printf("# libcomm all_reduce (tcp) float32 sum, world=%d\n", world);
    std::printf("%10s %10s %10s %10s %8s\n", "bytes", "time_us", "algbw_GBs",
                "busbw_GBs", "#wrong");
  }
  for (std::int64_t bytes = config.min_bytes; bytes <= config.max_bytes;
       bytes *= config.factor) {
    const std::int64_t count = bytes / 4;
    comm::Tensor t = comm::Tensor::full({count}, 1.0, comm::DType::kF32);
    int iterations = config.iterations;
    if (iterations <= 0) {
      iterations = static_cast<int>(
          std::clamp<std::int64_t>((std::int64_t{1} << 26) / bytes, 3, 200));
    }
    for (int i = 0; i < config.warmup; ++i) group->all_reduce(t)->wait();
    group->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) group->all_reduce(t)->wait();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
            .count() /
        iterations;
    long wrong = 0;
    if (config.check) {
      // Every element was 1 and was summed warmup + iterations times.
      comm::Tensor fresh =
          comm::Tensor::full({count}, rank + 1, comm::DType::kF32);
      group->all_reduce(fresh)->wait();
      const float expected = static_cast<float>(world * (world + 1) / 2);
      for (std::int64_t i = 0; i < count; ++i)
        wrong += fresh.data<float>()[i] != expected;
    }
    const double algbw = static_cast<double>(bytes) / seconds / 1e9;
    if (rank == 0) {
      std::printf("%10lld %10.1f %10.3f %10.3f %8ld\n",
                  static_cast<long long>(bytes), seconds * 1e6, algbw,
                  algbw * 2.0 * (world - 1) / world, wrong);
      std::fflush(stdout);
    }
  }
  group->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  CLI::App app{"all_reduce_perf: TCP backend all_reduce bandwidth"};
  app.add_option("-p,--np", config.ranks, "local ranks to start")
      ->check(CLI::Range(1, 256));
  app.add_option("-b,--minbytes", config.min_bytes, "smallest size in bytes")
      ->check(CLI::Range(std::int64_t{4}, std::int64_t{1} << 40));
  app.add_option("-e,--maxbytes", config.max_bytes, "largest size in bytes")
      ->check(CLI::Range(std::int64_t{4}, std::int64_t{1} << 40));
  app.add_option("-f,--stepfactor", config.factor, "size multiplier")
      ->check(CLI::Range(2, 1024));
  app.add_option("-n,--iters", config.iterations,
                 "iterations per size (0: as the peers)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("-w,--warmup_iters", config.warmup, "warm-up iterations")
      ->check(CLI::Range(0, 1000));
  app.add_option("-c,--check", config.check, "check results (0 or 1)");
  // nccl-tests spells it -np; CLI11 takes one-letter short options, so
  // rewrite it before parsing.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (auto& arg : args) {
    if (arg == "-np") arg = "--np";
  }
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (config.min_bytes > config.max_bytes) {
    std::fprintf(stderr, "all_reduce_perf: -b %lld is larger than -e %lld\n",
                 static_cast<long long>(config.min_bytes),
                 static_cast<long long>(config.max_bytes));
    return 2;
  }
  const std::string url =
      "tcp://127.0.0.1:" + std::to_string(comm::detail::free_loopback_port());
  std::vector<pid_t> children;
  for (int rank = 0; rank < config.ranks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code = 1;
      try {
        code = run_rank(config, url, rank);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      _exit(code);
    }
    children.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  return failed == 0 ? 0 : 1;
}
