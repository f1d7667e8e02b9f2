// DistributedDataParallel over the TCP backend, with real processes: the
// example MLP trained under DDP against the same MLP trained in one process
// on the whole batch, gradient accumulation, unused parameters, checkpoint
// resume, overlap of the first bucket with the backward, and a parameter
// mismatch. Each rank writes its final parameters to a safetensors file,
// which this process reads back and compares.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <string>

#include "examples/mlp.h"
#include "libcomm/detail/socket.h"
#include "libcomm/distributed/ddp/checkpoint.h"
#include "libcomm/distributed/ddp/distributed_data_parallel.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/distributed/rendezvous.h"
#include "libcomm/error.h"
#include "libcomm/half.h"
#include "libcomm/shared_host_memory.h"
#include "support/child_process.h"
#include "support/shared_host_mappings.h"
#include "support/temp_path.h"

using comm::DistributedDataParallel;
using comm::NamedTensors;
using comm::ProcessGroup;
using comm::Tensor;
using comm::examples::Mlp;
using comm::examples::MlpShape;
using comm::testing::ChildProcess;
using comm::testing::TempPath;
using namespace std::chrono_literals;

namespace {

constexpr std::size_t kBatchPerRank = 8;
constexpr double kLearningRate = 0.05;
constexpr double kMomentum = 0.9;
const MlpShape kShape{16, 32, 4};

// Runs body(group) in `world` processes meeting over a TCPStore; returns
// their exit codes (0: body returned normally; 10: it threw
// InvalidArgument, with the message in `messages_path`.rank).
std::vector<int> run_world(int world,
                           const std::function<void(ProcessGroup&)>& body,
                           const std::string& messages_path = "") {
  const std::uint16_t port = comm::detail::free_loopback_port();
  std::vector<std::unique_ptr<ChildProcess>> ranks;
  for (int rank = 0; rank < world; ++rank) {
    ranks.push_back(std::make_unique<ChildProcess>([=]() {
      auto joined = comm::rendezvous("tcp://127.0.0.1:" + std::to_string(port),
                                     rank, world, 60s);
      auto group =
          std::make_shared<ProcessGroup>(joined.store, rank, world, "tcp", 60s);
      try {
        body(*group);
      } catch (const comm::InvalidArgument& e) {
        if (!messages_path.empty()) {
          FILE* f = std::fopen(
              (messages_path + "." + std::to_string(rank)).c_str(), "w");
          std::fputs(e.what(), f);
          std::fclose(f);
        }
        return 10;
      }
      group->shutdown();
      return 0;
    }));
  }
  std::vector<int> codes;
  for (auto& r : ranks) codes.push_back(r->wait(120s));
  return codes;
}

std::string read_text(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return "";
  std::string text;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof(buffer), f))
    text.append(buffer, n);
  std::fclose(f);
  return text;
}

// The samples of step `step` on `rank`: its share of a global batch of
// kBatchPerRank x world consecutive samples.
std::vector<std::size_t> batch_of(int step, int rank, int world) {
  std::vector<std::size_t> batch;
  const std::size_t base = static_cast<std::size_t>(step) * kBatchPerRank *
                           static_cast<std::size_t>(world);
  for (std::size_t j = 0; j < kBatchPerRank; ++j)
    batch.push_back(base + static_cast<std::size_t>(rank) * kBatchPerRank + j);
  return batch;
}

std::vector<comm::Parameter> parameters_of(Mlp& model) {
  std::vector<comm::Parameter> params;
  for (std::size_t p = 0; p < model.params().size(); ++p)
    params.push_back({model.names()[p], model.params()[p], model.grads()[p]});
  return params;
}

// Trains `steps` steps under DDP from `first_step`; with gradient views,
// the model's gradients become the buckets' views.
void train(DistributedDataParallel& ddp, Mlp& model, ProcessGroup& group,
           int first_step, int steps) {
  for (std::size_t p = 0; p < model.grads().size(); ++p)
    model.grads()[p] = ddp.grad(p);
  for (int step = first_step; step < first_step + steps; ++step) {
    ddp.before_forward();
    model.forward_backward(batch_of(step, group.rank(), group.size()), 1.0,
                           [&](std::size_t p) { ddp.mark_grad_ready(p); });
    ddp.finish();
    model.sgd_step(kLearningRate, kMomentum);
    model.zero_grads();
  }
}

NamedTensors named(Mlp& model) {
  NamedTensors out;
  for (std::size_t p = 0; p < model.params().size(); ++p)
    out.emplace_back(model.names()[p], model.params()[p]);
  return out;
}

// The same training in one process on the concatenated batch.
NamedTensors reference(int world, int steps, const MlpShape& shape = kShape) {
  Mlp model(shape, 1);
  for (int step = 0; step < steps; ++step) {
    std::vector<std::size_t> all;
    for (int r = 0; r < world; ++r)
      for (auto i : batch_of(step, r, world)) all.push_back(i);
    model.forward_backward(all, 1.0, [](std::size_t) {});
    model.sgd_step(kLearningRate, kMomentum);
    model.zero_grads();
  }
  return named(model);
}

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// max |a - b| over max |b|.
double relative_difference(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 0;
  for (std::int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff,
                    std::fabs(double(a.data<float>()[i]) - b.data<float>()[i]));
    scale = std::max(scale, std::fabs(double(b.data<float>()[i])));
  }
  return diff / std::max(scale, 1e-30);
}

// Each rank's parameters, which it wrote to `out`.rank, are rank 0's bit
// for bit and `expected` within float rounding; removes the files.
void check_trained(const TempPath& out, int world,
                   const NamedTensors& expected) {
  const NamedTensors rank0 = comm::read_safetensors(out.str() + ".0");
  for (int r = 0; r < world; ++r) {
    const std::string path = out.str() + "." + std::to_string(r);
    const NamedTensors mine = comm::read_safetensors(path);
    REQUIRE(mine.size() == expected.size());
    for (std::size_t p = 0; p < mine.size(); ++p) {
      INFO(mine[p].first << " on rank " << r);
      CHECK(mine[p].first == expected[p].first);
      CHECK(bitwise_equal(mine[p].second, rank0[p].second));
      CHECK(relative_difference(mine[p].second, expected[p].second) <= 1e-5);
    }
    std::remove(path.c_str());
  }
}

}  // namespace

TEST_CASE("DDP training matches one process on the whole batch",
          "[ddp][multiproc]") {
  for (int world : {1, 2, 4}) {
    for (bool views : {false, true}) {
      INFO("world " << world << (views ? ", gradient views" : ""));
      TempPath out("ddp_params");
      const int steps = 50;
      auto codes = run_world(world, [&](ProcessGroup& group) {
        // Ranks start from different weights; DDP makes them rank 0's.
        Mlp model(kShape, 1 + static_cast<std::uint64_t>(group.rank()) * 17);
        comm::DdpOptions options;
        options.gradient_as_bucket_view = views;
        options.first_bucket_mb = 0.001;  // more than one bucket
        options.bucket_cap_mb = 0.002;
        auto group_ptr =
            std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
        DistributedDataParallel ddp(group_ptr, parameters_of(model), {},
                                    options);
        train(ddp, model, group, 0, steps);
        comm::write_safetensors(out.str() + "." + std::to_string(group.rank()),
                                named(model));
      });
      for (int code : codes) REQUIRE(code == 0);
      check_trained(out, world, reference(world, steps));
    }
  }
}

// Two buckets of 64-65 KiB (32 KiB compressed), each read directly.
const MlpShape kWideShape{64, 256, 64};

comm::DdpOptions two_buckets() {
  comm::DdpOptions options;
  options.first_bucket_mb = 0.07;
  options.bucket_cap_mb = 0.07;
  return options;
}

TEST_CASE("host buckets lie in one block of shared host memory, read in place",
          "[ddp][multiproc]") {
  const int steps = 5;
  for (int world : {2, 3}) {
    for (bool shared : {true, false}) {
      INFO("world " << world << (shared ? "" : ", shared_host_buckets off"));
      TempPath out("ddp_shared");
      auto codes = run_world(world, [&](ProcessGroup& group) {
        Mlp model(kWideShape, 1);
        comm::DdpOptions options = two_buckets();
        options.gradient_as_bucket_view = true;
        options.shared_host_buckets = shared;
        auto group_ptr =
            std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
        DistributedDataParallel ddp(group_ptr, parameters_of(model), {},
                                    options);
        REQUIRE(ddp.bucket_count() == 2);
        for (std::size_t p = 0; p < model.params().size(); ++p) {
          const Tensor& grad = ddp.grad(p);
          CHECK(comm::find_shared_host(grad.data_ptr(), grad.nbytes())
                    .has_value() == shared);
        }
        train(ddp, model, group, 0, steps);
        // Its own block, and each peer's, mapped once for both buckets.
        CHECK(comm::testing::shared_host_mappings() == (shared ? world : 0));
        comm::write_safetensors(out.str() + "." + std::to_string(group.rank()),
                                named(model));
      });
      for (int code : codes) REQUIRE(code == 0);
      check_trained(out, world, reference(world, steps, kWideShape));
    }
  }
}

TEST_CASE("with a compression hook the compressed buckets are the shared ones",
          "[ddp][multiproc]") {
  const int world = 2;
  auto codes = run_world(world, [&](ProcessGroup& group) {
    Mlp model(kWideShape, 1);
    comm::DdpOptions options = two_buckets();
    options.gradient_as_bucket_view = true;
    options.comm_hook = comm::CommHook::kFp16Compress;
    auto group_ptr =
        std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DistributedDataParallel ddp(group_ptr, parameters_of(model), {}, options);
    for (std::size_t p = 0; p < model.params().size(); ++p) {
      const Tensor& grad = ddp.grad(p);
      CHECK_FALSE(
          comm::find_shared_host(grad.data_ptr(), grad.nbytes()).has_value());
    }
    train(ddp, model, group, 0, 2);
    CHECK(comm::testing::shared_host_mappings() == world);
  });
  for (int code : codes) REQUIRE(code == 0);
}

// How rank 1 differs from the others in the test below.
enum class Differs { kNoDescriptors, kFileSizeLimit, kOptionOff };

TEST_CASE(
    "one rank without shared host memory puts every rank's buckets in "
    "ordinary memory",
    "[ddp][multiproc]") {
  const int world = 3;
  const int steps = 5;
  for (Differs how : {Differs::kNoDescriptors, Differs::kFileSizeLimit,
                      Differs::kOptionOff}) {
    INFO("rank 1 differs by " << static_cast<int>(how));
    TempPath out("ddp_refused");
    auto codes = run_world(world, [&](ProcessGroup& group) {
      Mlp model(kWideShape, 1);
      auto group_ptr =
          std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
      comm::DdpOptions options = two_buckets();
      options.gradient_as_bucket_view = true;
      rlimit descriptors{};
      rlimit file_size{};
      REQUIRE(getrlimit(RLIMIT_NOFILE, &descriptors) == 0);
      REQUIRE(getrlimit(RLIMIT_FSIZE, &file_size) == 0);
      if (group.rank() == 1) {
        if (how == Differs::kNoDescriptors) {
          // No descriptor left for a memfd: the lowest free one is the
          // limit.
          const int lowest_free = dup(0);
          REQUIRE(lowest_free >= 0);
          close(lowest_free);
          rlimit none_left = descriptors;
          none_left.rlim_cur = static_cast<rlim_t>(lowest_free);
          REQUIRE(setrlimit(RLIMIT_NOFILE, &none_left) == 0);
        } else if (how == Differs::kFileSizeLimit) {
          // Sizing the block past it would raise SIGXFSZ and end the rank;
          // ignored here only so that a write to a log file past the limit
          // cannot end it either.
          signal(SIGXFSZ, SIG_IGN);
          rlimit small = file_size;
          small.rlim_cur = 64 << 10;
          REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
        } else {
          options.shared_host_buckets = false;
        }
      }
      DistributedDataParallel ddp(group_ptr, parameters_of(model), {}, options);
      REQUIRE(setrlimit(RLIMIT_NOFILE, &descriptors) == 0);
      REQUIRE(setrlimit(RLIMIT_FSIZE, &file_size) == 0);
      for (std::size_t p = 0; p < model.params().size(); ++p) {
        const Tensor& grad = ddp.grad(p);
        CHECK_FALSE(
            comm::find_shared_host(grad.data_ptr(), grad.nbytes()).has_value());
      }
      // Without the agreement, each all_reduce would fail on the address
      // mark between rank 1 and the others.
      train(ddp, model, group, 0, steps);
      CHECK(comm::testing::shared_host_mappings() == 0);
      comm::write_safetensors(out.str() + "." + std::to_string(group.rank()),
                              named(model));
    });
    for (int code : codes) REQUIRE(code == 0);
    check_trained(out, world, reference(world, steps, kWideShape));
  }
}

TEST_CASE(
    "no_sync over a micro-batch then a synchronized one equals one "
    "step on their union",
    "[ddp][multiproc]") {
  TempPath out("ddp_nosync");
  const int world = 2;
  auto codes = run_world(world, [&](ProcessGroup& group) {
    Mlp model(kShape, 1);
    auto group_ptr =
        std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DistributedDataParallel ddp(group_ptr, parameters_of(model));
    // Two micro-batches of the rank's batch, each half the weight.
    auto batch = batch_of(0, group.rank(), world);
    std::vector<std::size_t> first(batch.begin(), batch.begin() + 4);
    std::vector<std::size_t> second(batch.begin() + 4, batch.end());
    {
      auto guard = ddp.no_sync();
      model.forward_backward(first, 0.5,
                             [&](std::size_t p) { ddp.mark_grad_ready(p); });
      ddp.finish();  // communicates nothing
    }
    model.forward_backward(second, 0.5,
                           [&](std::size_t p) { ddp.mark_grad_ready(p); });
    ddp.finish();
    model.sgd_step(kLearningRate, kMomentum);
    comm::write_safetensors(out.str() + "." + std::to_string(group.rank()),
                            named(model));
  });
  for (int code : codes) REQUIRE(code == 0);
  const NamedTensors expected = reference(world, 1);
  for (int r = 0; r < world; ++r) {
    const std::string path = out.str() + "." + std::to_string(r);
    const NamedTensors mine = comm::read_safetensors(path);
    for (std::size_t p = 0; p < mine.size(); ++p) {
      INFO(mine[p].first);
      CHECK(relative_difference(mine[p].second, expected[p].second) <= 1e-5);
    }
    std::remove(path.c_str());
  }
}

TEST_CASE("a parameter never marked ready is an error naming it",
          "[ddp][multiproc]") {
  TempPath messages("ddp_unused");
  auto codes = run_world(
      2,
      [&](ProcessGroup& group) {
        Mlp model(kShape, 1);
        auto group_ptr =
            std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
        DistributedDataParallel ddp(group_ptr, parameters_of(model));
        // fc1.bias takes no part in this step.
        model.forward_backward(batch_of(0, group.rank(), 2), 1.0,
                               [&](std::size_t p) {
                                 if (p != 1) ddp.mark_grad_ready(p);
                               });
        ddp.finish();
      },
      messages.str());
  CHECK(codes == std::vector<int>{10, 10});
  for (int r = 0; r < 2; ++r) {
    const std::string path = messages.str() + "." + std::to_string(r);
    const std::string text = read_text(path);
    CHECK_THAT(text, Catch::Contains("'fc1.bias'") &&
                         Catch::Contains("find_unused_parameters"));
    std::remove(path.c_str());
  }

  // With find_unused_parameters, it is reduced as zeros and training goes on.
  auto tolerant = run_world(2, [&](ProcessGroup& group) {
    Mlp model(kShape, 1);
    comm::DdpOptions options;
    options.find_unused_parameters = true;
    auto group_ptr =
        std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DistributedDataParallel ddp(group_ptr, parameters_of(model), {}, options);
    for (int step = 0; step < 3; ++step) {
      model.forward_backward(batch_of(step, group.rank(), 2), 1.0,
                             [&](std::size_t p) {
                               if (p != 1) ddp.mark_grad_ready(p);
                             });
      ddp.finish();
      const float* g = model.grads()[1].data<float>();
      for (std::int64_t i = 0; i < model.grads()[1].numel(); ++i)
        if (g[i] != 0) throw std::runtime_error("unused gradient not zero");
      model.zero_grads();
    }
  });
  CHECK(tolerant == std::vector<int>{0, 0});
}

TEST_CASE("resuming from a checkpoint ends where an uninterrupted run does",
          "[ddp][multiproc][checkpoint]") {
  TempPath checkpoint("ddp_checkpoint");
  TempPath straight("ddp_straight");
  TempPath resumed("ddp_resumed");
  const int world = 2;
  auto optimizer_state = [](Mlp& model) {
    NamedTensors state;
    for (std::size_t p = 0; p < model.params().size(); ++p)
      state.emplace_back("optimizer." + model.names()[p] + ".momentum_buffer",
                         model.momenta()[p]);
    return state;
  };
  // Uninterrupted: 20 steps. Interrupted: 10 steps and a checkpoint, then a
  // new job loads it and trains 10 more.
  REQUIRE(run_world(world, [&](ProcessGroup& group) {
            Mlp model(kShape, 1);
            auto g =
                std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
            DistributedDataParallel ddp(g, parameters_of(model));
            train(ddp, model, group, 0, 20);
            if (group.rank() == 0)
              comm::write_safetensors(straight.str(), named(model));
          }) == std::vector<int>{0, 0});
  REQUIRE(run_world(world, [&](ProcessGroup& group) {
            Mlp model(kShape, 1);
            auto g =
                std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
            DistributedDataParallel ddp(g, parameters_of(model));
            train(ddp, model, group, 0, 10);
            NamedTensors everything = ddp.state();
            for (auto& s : optimizer_state(model)) everything.push_back(s);
            comm::save_checkpoint(group, checkpoint.str(), everything);
          }) == std::vector<int>{0, 0});
  REQUIRE(run_world(world, [&](ProcessGroup& group) {
            Mlp model(kShape, 99);  // different start: the checkpoint wins
            const NamedTensors loaded = comm::load_checkpoint(checkpoint.str());
            NamedTensors targets = named(model);
            for (auto& s : optimizer_state(model)) targets.push_back(s);
            comm::restore(loaded, targets);
            auto g =
                std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
            DistributedDataParallel ddp(g, parameters_of(model));
            train(ddp, model, group, 10, 10);
            if (group.rank() == 0)
              comm::write_safetensors(resumed.str(), named(model));
          }) == std::vector<int>{0, 0});
  const NamedTensors a = comm::read_safetensors(straight.str());
  const NamedTensors b = comm::read_safetensors(resumed.str());
  REQUIRE(a.size() == b.size());
  for (std::size_t p = 0; p < a.size(); ++p) {
    INFO(a[p].first);
    CHECK(a[p].first == b[p].first);
    CHECK(bitwise_equal(a[p].second, b[p].second));
  }
  // Keys are the parameters' own names.
  const NamedTensors saved = comm::read_safetensors(checkpoint.str());
  CHECK(saved[0].first == "fc1.weight");
  CHECK(saved[4].first == "optimizer.fc1.weight.momentum_buffer");
}

TEST_CASE("the first bucket's all_reduce starts before the backward ends",
          "[ddp][multiproc]") {
  TempPath out("ddp_overlap");
  auto codes = run_world(2, [&](ProcessGroup& group) {
    Mlp model(kShape, 1);
    comm::DdpOptions options;
    // fc2's gradients (132 floats) fill the first bucket; fc1's the next.
    options.first_bucket_mb = 600.0 / (1 << 20);
    options.bucket_cap_mb = 1;
    auto g = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DistributedDataParallel ddp(g, parameters_of(model), {}, options);
    if (ddp.bucket_count() != 2) throw std::runtime_error("expected 2 buckets");
    train(ddp, model, group, 0, 1);
    const auto& at = ddp.marked_at_launch();
    // Launch order and how much of the backward had run by then.
    const std::string text = std::to_string(at.size()) + " " +
                             std::to_string(at[0]) + " " +
                             std::to_string(at[1]);
    FILE* f = std::fopen(
        (out.str() + "." + std::to_string(group.rank())).c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
  });
  CHECK(codes == std::vector<int>{0, 0});
  for (int r = 0; r < 2; ++r) {
    const std::string path = out.str() + "." + std::to_string(r);
    // Bucket 0 started when 2 of the 4 gradients were ready.
    CHECK(read_text(path) == "2 2 4");
    std::remove(path.c_str());
  }
}

TEST_CASE("ranks with different parameters fail at construction",
          "[ddp][multiproc]") {
  TempPath messages("ddp_mismatch");
  auto codes = run_world(
      3,
      [&](ProcessGroup& group) {
        MlpShape shape = kShape;
        if (group.rank() == 2) shape.hidden = 33;  // fc1.weight differs
        Mlp model(shape, 1);
        auto g = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
        DistributedDataParallel ddp(g, parameters_of(model));
      },
      messages.str());
  CHECK(codes == std::vector<int>{10, 10, 10});
  for (int r = 0; r < 3; ++r) {
    const std::string path = messages.str() + "." + std::to_string(r);
    const std::string text = read_text(path);
    CHECK_THAT(
        text, Catch::Contains("parameter 0 differs") &&
                  Catch::Contains("rank 0 has 'fc1.weight' float32 [32, 16]") &&
                  Catch::Contains("rank 2 has 'fc1.weight' float32 [33, 16]"));
    std::remove(path.c_str());
  }
}

TEST_CASE("compression hooks average in half precision", "[ddp][multiproc]") {
  for (auto hook :
       {comm::CommHook::kFp16Compress, comm::CommHook::kBf16Compress}) {
    TempPath out("ddp_hook");
    auto codes = run_world(2, [&](ProcessGroup& group) {
      Mlp model(kShape, 1);
      comm::DdpOptions options;
      options.comm_hook = hook;
      auto g = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
      DistributedDataParallel ddp(g, parameters_of(model), {}, options);
      train(ddp, model, group, 0, 5);
      comm::write_safetensors(out.str() + "." + std::to_string(group.rank()),
                              named(model));
    });
    REQUIRE(codes == std::vector<int>{0, 0});
    const NamedTensors expected = reference(2, 5);
    const NamedTensors a = comm::read_safetensors(out.str() + ".0");
    const NamedTensors b = comm::read_safetensors(out.str() + ".1");
    for (std::size_t p = 0; p < a.size(); ++p) {
      CHECK(bitwise_equal(a[p].second, b[p].second));
      CHECK(relative_difference(a[p].second, expected[p].second) <= 2e-2);
    }
    std::remove((out.str() + ".0").c_str());
    std::remove((out.str() + ".1").c_str());
  }
}

TEST_CASE("buffers follow rank 0's each step", "[ddp][multiproc]") {
  auto codes = run_world(3, [&](ProcessGroup& group) {
    Mlp model(kShape, 1);
    // A running statistic each rank updates on its own.
    Tensor running = Tensor::full({5}, group.rank() * 10, comm::DType::kF32);
    auto g = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DistributedDataParallel ddp(g, parameters_of(model),
                                {{"running", running}});
    for (int step = 0; step < 3; ++step) {
      if (running.data<float>()[0] != step * 1.0f)
        throw std::runtime_error("buffer not rank 0's after step " +
                                 std::to_string(step));
      running.data<float>()[0] += 1 + group.rank();  // ranks drift apart
      ddp.before_forward();                          // and are re-synced
      if (running.data<float>()[0] != step + 1.0f)
        throw std::runtime_error("buffer not broadcast");
      model.forward_backward(batch_of(step, group.rank(), 3), 1.0,
                             [&](std::size_t p) { ddp.mark_grad_ready(p); });
      ddp.finish();
      model.zero_grads();
    }
  });
  CHECK(codes == std::vector<int>{0, 0, 0});
}

namespace {

// Whether `t` holds the same values on every rank of `group`.
bool same_on_every_rank(ProcessGroup& group, const Tensor& t) {
  Tensor most = t.clone();
  Tensor least = t.clone();
  group.all_reduce(most, {.op = comm::ReduceOp::kMax})->wait();
  group.all_reduce(least, {.op = comm::ReduceOp::kMin})->wait();
  return std::memcmp(most.data_ptr(), least.data_ptr(), most.nbytes()) == 0;
}

}  // namespace

TEST_CASE("a step belongs to the no_sync its forward ran in (as in torch)",
          "[ddp][multiproc]") {
  auto codes = run_world(2, [&](ProcessGroup& group) {
    Mlp model(kShape, 1);
    auto g = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DistributedDataParallel ddp(g, parameters_of(model));
    auto backward = [&](int step) {
      model.forward_backward(batch_of(step, group.rank(), 2), 1.0,
                             [&](std::size_t p) { ddp.mark_grad_ready(p); });
    };
    // The forward outside, the backward inside: it communicates.
    ddp.before_forward();
    {
      auto guard = ddp.no_sync();
      backward(0);
      ddp.finish();
    }
    if (!same_on_every_rank(group, model.grads()[0]))
      throw std::runtime_error("a step forwarded outside no_sync was local");
    model.zero_grads();
    // The forward inside, the backward outside: it stays local (the
    // ranks' batches differ, and so do their gradients).
    {
      auto guard = ddp.no_sync();
      ddp.before_forward();
    }
    backward(1);
    ddp.finish();
    if (same_on_every_rank(group, model.grads()[0]))
      throw std::runtime_error("a step forwarded inside no_sync communicated");
    model.zero_grads();
    // Without before_forward(), the NoSync around the backward decides.
    {
      auto guard = ddp.no_sync();
      backward(2);
      ddp.finish();
    }
    if (same_on_every_rank(group, model.grads()[0]))
      throw std::runtime_error("a step inside no_sync communicated");
  });
  CHECK(codes == std::vector<int>{0, 0});
}

TEST_CASE("buffers are broadcast at the forwards torch's DDP broadcasts at",
          "[ddp][multiproc]") {
  auto codes = run_world(2, [&](ProcessGroup& group) {
    Mlp model(kShape, 1);
    Tensor running = Tensor::full({3}, group.rank(), comm::DType::kF32);
    auto g = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DistributedDataParallel ddp(g, parameters_of(model),
                                {{"running", running}});
    int step = 0;
    // Drifts the ranks' buffers apart, runs a forward, and says whether
    // the buffer came back as rank 0's.
    auto forward = [&](bool backward_follows) {
      running.data<float>()[0] = 100.0f + static_cast<float>(group.rank());
      ddp.before_forward(backward_follows);
      return running.data<float>()[0] == 100.0f;
    };
    auto backward = [&] {
      model.forward_backward(batch_of(step++, group.rank(), 2), 1.0,
                             [&](std::size_t p) { ddp.mark_grad_ready(p); });
      ddp.finish();
      model.zero_grads();
    };
    std::vector<bool> broadcast;
    broadcast.push_back(forward(true));  // the first forward
    backward();
    {
      auto guard = ddp.no_sync();
      broadcast.push_back(forward(true));  // after a synchronised one
      backward();
      broadcast.push_back(forward(true));  // after one inside no_sync
      backward();
    }
    broadcast.push_back(forward(true));  // still after one inside no_sync
    backward();
    broadcast.push_back(forward(false));  // after a synchronised one
    broadcast.push_back(forward(false));  // after one without backward
    broadcast.push_back(forward(true));   // the same
    backward();
    broadcast.push_back(forward(true));  // after a synchronised one
    backward();
    const std::vector<bool> expected{true, true,  false, false,
                                     true, false, false, true};
    // Rank 0's own buffer is rank 0's either way.
    if (group.rank() == 1 && broadcast != expected)
      throw std::runtime_error("buffers broadcast at the wrong forwards");
  });
  CHECK(codes == std::vector<int>{0, 0});
}

TEST_CASE("ranks with different buffers fail at construction naming them",
          "[ddp][multiproc]") {
  TempPath messages("ddp_buffers");
  auto codes = run_world(
      2,
      [&](ProcessGroup& group) {
        Mlp model(kShape, 1);
        Tensor running =
            Tensor::zeros({group.rank() == 1 ? 6 : 5}, comm::DType::kF32);
        auto g = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
        DistributedDataParallel ddp(g, parameters_of(model),
                                    {{"running", running}});
      },
      messages.str());
  CHECK(codes == std::vector<int>{10, 10});
  for (int r = 0; r < 2; ++r) {
    const std::string path = messages.str() + "." + std::to_string(r);
    CHECK_THAT(read_text(path),
               Catch::Contains("buffer 0 differs") &&
                   Catch::Contains("rank 0 has buffer 'running' float32 [5]") &&
                   Catch::Contains("rank 1 has buffer 'running' float32 [6]"));
    std::remove(path.c_str());
  }
}

TEST_CASE("float16 gradients are averaged without overflowing their sum",
          "[ddp][multiproc]") {
  // Each rank's gradient is 40,000, which float16 holds; their sum, 80,000,
  // it does not. torch's DDP divides before it sums, and so does libcomm's.
  auto codes = run_world(2, [&](ProcessGroup& group) {
    Tensor weight = Tensor::zeros({4}, comm::DType::kF16);
    Tensor grad = Tensor::full({4}, 40000.0, comm::DType::kF16);
    auto g = std::shared_ptr<ProcessGroup>(&group, [](ProcessGroup*) {});
    DistributedDataParallel ddp(g, {{"w", weight, grad}});
    ddp.before_forward();
    ddp.mark_grad_ready(0);
    ddp.finish();
    const float averaged = static_cast<float>(grad.data<comm::Float16>()[3]);
    if (averaged != 40000.0)
      throw std::runtime_error("averaged to " + std::to_string(averaged));
  });
  CHECK(codes == std::vector<int>{0, 0});
}
