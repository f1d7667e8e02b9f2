// ddp_trainer: trains the example MLP (examples/mlp.h) with SGD and
// momentum, data-parallel through DistributedDataParallel, and prints the
// loss each epoch. Run it alone (one rank) or under a launcher:
//
//   build/tools/commrun --nproc-per-node 4 build/examples/ddp_trainer --epochs
//   5
//
// Each rank trains on its DistributedSampler share of the synthetic
// dataset; rank 0 prints the loss averaged over all ranks, and with
// --checkpoint writes the parameters and the optimizer's momentum buffers
// as safetensors at the end, with the count of epochs trained in its
// metadata; --resume reads such a file first and goes on from that epoch
// (numbering, and the sampler's shuffle, continue).
#include <charconv>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "examples/mlp.h"
#include "libcomm/distributed/ddp/checkpoint.h"
#include "libcomm/distributed/ddp/distributed_data_parallel.h"
#include "libcomm/distributed/distributed_sampler.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/error.h"
#include "store/hash_store.h"

namespace {

struct Config {
  int epochs = 5;
  std::size_t dataset = 4096;
  std::size_t batch = 32;
  double lr = 0.05;
  double momentum = 0.9;
  int hidden = 64;
  std::string backend = "tcp";
  std::string checkpoint;
  std::string resume;
};

comm::NamedTensors optimizer_state(comm::examples::Mlp& model) {
  comm::NamedTensors state;
  for (std::size_t p = 0; p < model.params().size(); ++p)
    state.emplace_back("optimizer." + model.names()[p] + ".momentum_buffer",
                       model.momenta()[p]);
  return state;
}

// The epochs a checkpoint's run had trained: its "epochs" metadata, 0
// where it has none (a file written by another program).
int epochs_trained(const std::map<std::string, std::string>& metadata,
                   const std::string& path) {
  const auto found = metadata.find("epochs");
  if (found == metadata.end()) return 0;
  int epochs = 0;
  const std::string& text = found->second;
  const auto [end, error] =
      std::from_chars(text.data(), text.data() + text.size(), epochs);
  if (error != std::errc() || end != text.data() + text.size() || epochs < 0 ||
      epochs > 1'000'000'000) {
    throw comm::InvalidArgument(path + ": its \"epochs\" metadata is '" + text +
                                "', not a count of epochs");
  }
  return epochs;
}

int train(const Config& config) {
  // Under commrun or torchrun, env:// says who is who; alone, one rank.
  // Either of RANK and WORLD_SIZE takes env://, which says what is missing.
  std::shared_ptr<comm::ProcessGroup> group =
      std::getenv("RANK") != nullptr || std::getenv("WORLD_SIZE") != nullptr
          ? comm::init_process_group(config.backend, "env://")
          : std::make_shared<comm::ProcessGroup>(
                std::make_shared<comm::HashStore>(), 0, 1, config.backend);
  const int rank = group->rank();
  const int world = group->size();

  comm::examples::Mlp model({16, config.hidden, 4}, 1 + rank);
  int first_epoch = 0;
  if (!config.resume.empty()) {
    comm::NamedTensors targets;
    for (std::size_t p = 0; p < model.params().size(); ++p)
      targets.emplace_back(model.names()[p], model.params()[p]);
    for (auto& s : optimizer_state(model)) targets.push_back(s);
    std::map<std::string, std::string> metadata;
    comm::restore(
        comm::read_safetensors(config.resume, comm::Device::cpu(), &metadata),
        targets);
    first_epoch = epochs_trained(metadata, config.resume);
  }
  std::vector<comm::Parameter> params;
  for (std::size_t p = 0; p < model.params().size(); ++p)
    params.push_back({model.names()[p], model.params()[p], model.grads()[p]});
  comm::DistributedDataParallel ddp(group, params);

  comm::DistributedSampler sampler(config.dataset, rank, world, {.seed = 7});
  const int last_epoch = first_epoch + config.epochs;
  for (int epoch = first_epoch; epoch < last_epoch; ++epoch) {
    sampler.set_epoch(static_cast<std::uint64_t>(epoch));
    const auto mine = sampler.indices();
    double loss_sum = 0;
    std::size_t batches = 0;
    for (std::size_t start = 0; start + config.batch <= mine.size();
         start += config.batch) {
      std::vector<std::size_t> batch(
          mine.begin() + static_cast<std::ptrdiff_t>(start),
          mine.begin() + static_cast<std::ptrdiff_t>(start + config.batch));
      ddp.before_forward();
      loss_sum += model.forward_backward(
          batch, 1.0, [&](std::size_t p) { ddp.mark_grad_ready(p); });
      ddp.finish();
      model.sgd_step(config.lr, config.momentum);
      model.zero_grads();
      ++batches;
    }
    comm::Tensor loss = comm::Tensor::full(
        {1}, batches ? loss_sum / static_cast<double>(batches) : 0.0,
        comm::DType::kF64);
    group->all_reduce(loss, {.op = comm::ReduceOp::kAvg})->wait();
    if (rank == 0) {
      std::printf("epoch %d: loss %.6f (%d ranks x %zu batches of %zu)\n",
                  epoch, loss.data<double>()[0], world, batches, config.batch);
      std::fflush(stdout);
    }
  }
  if (!config.checkpoint.empty()) {
    comm::NamedTensors everything = ddp.state();
    for (auto& s : optimizer_state(model)) everything.push_back(s);
    comm::save_checkpoint(*group, config.checkpoint, everything,
                          {{"epochs", std::to_string(last_epoch)}});
    if (rank == 0)
      std::printf("checkpoint written to %s\n", config.checkpoint.c_str());
  }
  group->shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config config;
  CLI::App app{
      "ddp_trainer: the example MLP trained data-parallel with libcomm"};
  app.add_option("--epochs", config.epochs, "passes over the dataset")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--dataset", config.dataset, "synthetic samples")
      ->check(CLI::Range(1, 1 << 28))
      ->capture_default_str();
  app.add_option("--batch", config.batch, "samples per rank per step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--lr", config.lr, "learning rate")->capture_default_str();
  app.add_option("--momentum", config.momentum, "SGD momentum")
      ->capture_default_str();
  app.add_option("--hidden", config.hidden, "hidden units")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--backend", config.backend, "tcp (host tensors)")
      ->capture_default_str();
  app.add_option("--checkpoint", config.checkpoint,
                 "write parameters and optimizer state here at the end");
  app.add_option("--resume", config.resume, "start from this checkpoint");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return train(config);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_trainer: %s\n", e.what());
    return 1;
  }
}
