// comm::DistributedSampler: each rank's share of a dataset, as
// torch.utils.data.DistributedSampler decides it. The sampler talks to no
// one, so every rank's sampler is built here in one thread.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "libcomm/distributed/distributed_sampler.h"
#include "libcomm/error.h"

using comm::DistributedSampler;

TEST_CASE("every rank gets ceil(N / world) indices and together they cover N",
          "[sampler]") {
  for (int world : {1, 2, 3, 4}) {
    for (std::size_t n : {0, 1, 7, 12, 100}) {
      std::vector<std::size_t> seen;
      for (int r = 0; r < world; ++r) {
        DistributedSampler sampler(n, r, world, {.seed = 5});
        sampler.set_epoch(3);
        const auto mine = sampler.indices();
        CHECK(mine.size() == (n + world - 1) / world);
        CHECK(sampler.num_samples() == mine.size());
        CHECK(mine == sampler.indices());  // deterministic
        for (std::size_t i : mine) CHECK(i < n);
        seen.insert(seen.end(), mine.begin(), mine.end());
      }
      std::sort(seen.begin(), seen.end());
      for (std::size_t i = 0; i < n; ++i) {
        CHECK(std::binary_search(seen.begin(), seen.end(), i));
      }
      // Disjoint when the world divides n; padding repeats indices only
      // when it does not.
      if (n % world == 0) {
        CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
      }
    }
  }
}

TEST_CASE("drop_last gives floor(N / world) distinct indices per rank",
          "[sampler]") {
  for (int world : {1, 2, 3, 4}) {
    for (std::size_t n : {0, 1, 7, 12, 100}) {
      std::vector<std::size_t> seen;
      for (int r = 0; r < world; ++r) {
        DistributedSampler dropping(n, r, world,
                                    {.seed = 5, .drop_last = true});
        const auto mine = dropping.indices();
        CHECK(mine.size() == n / world);
        seen.insert(seen.end(), mine.begin(), mine.end());
      }
      std::sort(seen.begin(), seen.end());
      CHECK(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
    }
  }
}

TEST_CASE(
    "without shuffle, rank r takes r, r + world, ... padded from the "
    "start",
    "[sampler]") {
  DistributedSampler rank1(7, 1, 3, {.shuffle = false});
  CHECK(rank1.indices() == std::vector<std::size_t>{1, 4, 0});
  DistributedSampler rank2(7, 2, 3, {.shuffle = false});
  CHECK(rank2.indices() == std::vector<std::size_t>{2, 5, 1});
}

TEST_CASE("the shuffle depends on the epoch and the seed and on nothing else",
          "[sampler]") {
  DistributedSampler a(100, 0, 2), b(100, 0, 2);
  CHECK(a.indices() == b.indices());
  b.set_epoch(1);
  CHECK(b.epoch() == 1);
  CHECK(a.indices() != b.indices());
  DistributedSampler other_seed(100, 0, 2, {.seed = 1});
  CHECK(a.indices() != other_seed.indices());
  // A shuffled epoch is still a permutation of the dataset.
  DistributedSampler whole(100, 0, 1, {.seed = 9});
  auto all = whole.indices();
  std::sort(all.begin(), all.end());
  for (std::size_t i = 0; i < all.size(); ++i) CHECK(all[i] == i);
}

TEST_CASE("the order is torch's for the same seed and epoch", "[sampler]") {
  // torch.utils.data.distributed.DistributedSampler(range(10), 3, r,
  // seed=5) after set_epoch(3), printed by torch 1.13; the torch suite
  // (test_torch_parity.py) compares many more cases with torch itself.
  const std::vector<std::vector<std::size_t>> torchs = {
      {3, 1, 4, 9}, {5, 2, 7, 3}, {0, 6, 8, 5}};
  for (int r = 0; r < 3; ++r) {
    DistributedSampler sampler(10, r, 3, {.seed = 5});
    sampler.set_epoch(3);
    CHECK(sampler.indices() == torchs[static_cast<std::size_t>(r)]);
  }
  // The generator takes the low 32 bits of seed + epoch, as torch's does.
  DistributedSampler dropping(10, 1, 4,
                              {.seed = (1ULL << 40) + 7, .drop_last = true});
  dropping.set_epoch(1);
  CHECK(dropping.indices() == std::vector<std::size_t>{5, 6});
}

TEST_CASE("a rank outside [0, world) or an empty world is refused",
          "[sampler]") {
  CHECK_THROWS_AS(DistributedSampler(10, 2, 2), comm::InvalidArgument);
  CHECK_THROWS_AS(DistributedSampler(10, -1, 2), comm::InvalidArgument);
  CHECK_THROWS_AS(DistributedSampler(10, 0, 0), comm::InvalidArgument);
}
