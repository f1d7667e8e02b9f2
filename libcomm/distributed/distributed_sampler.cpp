#include "libcomm/distributed/distributed_sampler.h"

#include <numeric>
#include <random>
#include <string>

#include "libcomm/error.h"

namespace comm {

DistributedSampler::DistributedSampler(std::size_t dataset_size, int rank,
                                       int world,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size),
      rank_(rank),
      world_(world),
      options_(options) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw InvalidArgument("DistributedSampler: rank " + std::to_string(rank) +
                          " is outside [0, " + std::to_string(world) + ")");
  }
  const auto w = static_cast<std::size_t>(world);
  num_samples_ =
      options.drop_last ? dataset_size / w : (dataset_size + w - 1) / w;
}

std::vector<std::size_t> DistributedSampler::indices() const {
  std::vector<std::size_t> order(dataset_size_);
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (options_.shuffle) {
    // torch.randperm(N) under torch.Generator().manual_seed(seed + epoch):
    // a 32-bit Mersenne Twister seeded with the low 32 bits of the sum
    // (std::mt19937's output is fixed by the C++ standard), and a
    // Fisher-Yates pass from the front that swaps index i with i plus the
    // next output modulo N - i. torch 1.13 orders every dataset so; later
    // releases keep this order for datasets of fewer than 2^32 / 20
    // samples and order larger ones otherwise.
    std::mt19937 engine(static_cast<std::uint32_t>(options_.seed + epoch_));
    const std::size_t n = order.size();
    for (std::size_t i = 0; i + 1 < n; ++i) {
      std::swap(order[i], order[i + engine() % (n - i)]);
    }
  }
  const std::size_t total = num_samples_ * static_cast<std::size_t>(world_);
  // Pad by repeating from the start (bounded: each round adds at least one
  // index while there are any), or cut for drop_last.
  if (!order.empty()) {
    const std::size_t original = order.size();
    for (std::size_t i = 0; order.size() < total; ++i)
      order.push_back(order[i % original]);
  }
  order.resize(total);
  std::vector<std::size_t> mine;
  mine.reserve(num_samples_);
  for (std::size_t i = static_cast<std::size_t>(rank_); i < total;
       i += static_cast<std::size_t>(world_)) {
    mine.push_back(order[i]);
  }
  return mine;
}

}  // namespace comm
