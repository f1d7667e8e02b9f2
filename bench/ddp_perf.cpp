// ddp_perf: the DDP layer's throughput and overlap, training the example
// MLP (examples/mlp.h, sized up) over the TCP backend.
//
//   ddp_perf [--worlds 1,2,4] [--steps 10] [--batch 4] [--inputs 512]
//            [--hidden 1024] [--outputs 512] [--bucket-cap-mb 2]
//            [--bucket-memory shared|ordinary]
//
// For each world size it starts that many local ranks and times three ways
// of running a step (forward, backward, gradient averaging, optimizer):
//   compute   no communication at all (the floor);
//   bucketed  DDP with buckets of --bucket-cap-mb, whose all_reduces start
//             while the backward is still running;
//   serial    DDP with one bucket: one all_reduce after the backward.
// It prints samples/s for each, and the share of the communication hidden
// behind the backward: (serial - bucketed) / (serial - compute), from the
// slowest rank's mean step times. The default model is wide and the batch
// small, so that communication is a visible part of a step even with this
// naive (unvectorised) compute. --bucket-memory ordinary keeps the
// buckets out of shared host memory (DdpOptions::shared_host_buckets), to
// compare with the default.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "examples/mlp.h"
#include "libcomm/detail/socket.h"
#include "libcomm/distributed/ddp/distributed_data_parallel.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/distributed/rendezvous.h"

namespace {

struct Config {
  std::vector<int> worlds{1, 2, 4};
  int steps = 10;
  int warmup = 2;
  std::size_t batch = 4;
  comm::examples::MlpShape shape{512, 1024, 512};
  double bucket_cap_mb = 2;
  bool shared_host_buckets = true;
};

using Clock = std::chrono::steady_clock;

// Mean seconds per step of one way of running, the slowest rank's.
double time_steps(const Config& config, comm::ProcessGroup& group,
                  comm::examples::Mlp& model,
                  comm::DistributedDataParallel* ddp) {
  double seconds = 0;
  for (int step = 0; step < config.warmup + config.steps; ++step) {
    std::vector<std::size_t> batch;
    for (std::size_t j = 0; j < config.batch; ++j)
      batch.push_back(
          (static_cast<std::size_t>(step) * group.size() + group.rank()) *
              config.batch +
          j);
    group.barrier()->wait();
    const auto start = Clock::now();
    if (ddp) ddp->before_forward();
    model.forward_backward(batch, 1.0, [&](std::size_t p) {
      if (ddp) ddp->mark_grad_ready(p);
    });
    if (ddp) ddp->finish();
    model.sgd_step(1e-4, 0.9);
    model.zero_grads();
    if (step >= config.warmup)
      seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  comm::Tensor t =
      comm::Tensor::full({1}, seconds / config.steps, comm::DType::kF64);
  group.all_reduce(t, {.op = comm::ReduceOp::kMax})->wait();
  return t.data<double>()[0];
}

int run_rank(const Config& config, int world, int rank, std::uint16_t port) {
  auto joined = comm::rendezvous("tcp://127.0.0.1:" + std::to_string(port),
                                 rank, world, std::chrono::seconds(120));
  auto group = std::make_shared<comm::ProcessGroup>(
      joined.store, rank, world, "tcp", std::chrono::seconds(300));
  comm::examples::Mlp model(config.shape, 1);
  auto params = [&] {
    std::vector<comm::Parameter> list;
    for (std::size_t p = 0; p < model.params().size(); ++p)
      list.push_back({model.names()[p], model.params()[p], model.grads()[p]});
    return list;
  };
  const double compute = time_steps(config, *group, model, nullptr);
  comm::DdpOptions bucketed_options;
  bucketed_options.first_bucket_mb = std::min(1.0, config.bucket_cap_mb);
  bucketed_options.bucket_cap_mb = config.bucket_cap_mb;
  bucketed_options.shared_host_buckets = config.shared_host_buckets;
  comm::DistributedDataParallel bucketed(group, params(), {}, bucketed_options);
  const double overlapped = time_steps(config, *group, model, &bucketed);
  const std::size_t buckets = bucketed.bucket_count();
  comm::DdpOptions one_bucket;
  one_bucket.first_bucket_mb = 1e6;
  one_bucket.bucket_cap_mb = 1e6;
  one_bucket.shared_host_buckets = config.shared_host_buckets;
  comm::DistributedDataParallel serial(group, params(), {}, one_bucket);
  const double after = time_steps(config, *group, model, &serial);
  if (rank == 0) {
    const double samples = static_cast<double>(config.batch) * world;
    const double communication = after - compute;
    const double hidden =
        communication > 0
            ? std::clamp((after - overlapped) / communication, 0.0, 1.0)
            : 0.0;
    std::printf("%6d %14.0f %14.0f %14.0f %9zu %10.2f\n", world,
                samples / compute, samples / overlapped, samples / after,
                buckets, hidden);
    std::fflush(stdout);
  }
  group->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  std::string worlds = "1,2,4";
  CLI::App app{"ddp_perf: DDP throughput and overlap on the example MLP"};
  app.add_option("--worlds", worlds, "comma-separated world sizes")
      ->capture_default_str();
  app.add_option("--steps", config.steps, "timed steps per mode")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--batch", config.batch, "samples per rank per step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--inputs", config.shape.inputs)
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--hidden", config.shape.hidden)
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--outputs", config.shape.outputs)
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--bucket-cap-mb", config.bucket_cap_mb,
                 "bucket size of the bucketed mode")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  std::string bucket_memory = "shared";
  app.add_option("--bucket-memory", bucket_memory,
                 "where host buckets lie: shared host memory, which local "
                 "peers read directly, or ordinary memory")
      ->check(CLI::IsMember({"shared", "ordinary"}))
      ->capture_default_str();
  try {
    app.parse(argc, argv);
    config.shared_host_buckets = bucket_memory == "shared";
    config.worlds.clear();
    std::stringstream list(worlds);
    for (std::string item; std::getline(list, item, ',');) {
      const int w = std::stoi(item);
      if (w < 1 || w > 64)
        throw CLI::ValidationError("--worlds", item + " is not in [1, 64]");
      config.worlds.push_back(w);
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception&) {
    std::fprintf(stderr,
                 "ddp_perf: --worlds takes sizes like 1,2,4, not '%s'\n",
                 worlds.c_str());
    return 2;
  }
  const double mib = 4.0 *
                     (config.shape.hidden * (config.shape.inputs + 1) +
                      config.shape.outputs * (config.shape.hidden + 1)) /
                     (1 << 20);
  std::printf(
      "# ddp_perf: MLP %d-%d-%d (%.1f MiB of float32 gradients), batch %zu "
      "per rank, %d steps, tcp backend, bucket cap %.1f MiB, buckets in %s "
      "memory\n",
      config.shape.inputs, config.shape.hidden, config.shape.outputs, mib,
      config.batch, config.steps, config.bucket_cap_mb,
      config.shared_host_buckets ? "shared host" : "ordinary");
  std::printf("%6s %14s %14s %14s %9s %10s\n", "world", "compute/s",
              "bucketed/s", "serial/s", "buckets", "hidden");
  std::fflush(stdout);
  for (int world : config.worlds) {
    const std::uint16_t port = comm::detail::free_loopback_port();
    std::vector<pid_t> children;
    for (int rank = 0; rank < world; ++rank) {
      const pid_t pid = fork();
      if (pid == 0) {
        int code = 1;
        try {
          code = run_rank(config, world, rank, port);
        } catch (const std::exception& e) {
          std::fprintf(stderr, "ddp_perf: rank %d: %s\n", rank, e.what());
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
      failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    if (failed) return 1;
  }
  return 0;
}
