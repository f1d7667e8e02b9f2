#include "libcomm/distributed/distributed_sampler.h"

#include <numeric>
#include <string>

#include "libcomm/error.h"

namespace comm {
namespace {

// SplitMix64: a small, fully specified generator, so that the permutation
// is the same on every platform and standard library (std::shuffle's is
// not specified).
std::uint64_t next(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

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
    // Fisher-Yates, seeded by (seed, epoch).
    std::uint64_t state = options_.seed * 0x100000001b3ULL ^ epoch_;
    for (std::size_t i = order.size(); i > 1; --i) {
      const std::size_t j = next(state) % i;
      std::swap(order[i - 1], order[j]);
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
