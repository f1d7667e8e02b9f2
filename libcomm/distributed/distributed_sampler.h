// comm::DistributedSampler: which samples of a dataset each rank trains on,
// as torch.utils.data.DistributedSampler decides it.
//
// Every rank builds the same permutation of [0, dataset_size) from (seed,
// epoch), so ranks agree without talking. It is torch's, so that a trainer
// moved from torch's sampler sees its samples in the same order. Each rank
// then takes every world-th index starting at its rank: ceil(N / world)
// indices, the permutation padded by repeating its first indices (or, with
// drop_last, cut to floor(N / world) per rank). The ranks' indices are
// disjoint when world divides N.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "libcomm/export.h"

namespace comm {

struct DistributedSamplerOptions {
  bool shuffle = true;
  std::uint64_t seed = 0;
  bool drop_last = false;
};

class COMM_API DistributedSampler {
 public:
  // Throws InvalidArgument for a rank outside [0, world) or world < 1.
  DistributedSampler(std::size_t dataset_size, int rank, int world,
                     DistributedSamplerOptions options = {});

  // A new shuffle per epoch; call it before indices() each epoch.
  void set_epoch(std::uint64_t epoch) { epoch_ = epoch; }
  std::uint64_t epoch() const { return epoch_; }

  // Indices per rank (every rank gets the same number).
  std::size_t num_samples() const { return num_samples_; }
  // This rank's indices for the current epoch.
  std::vector<std::size_t> indices() const;

 private:
  std::size_t dataset_size_;
  int rank_;
  int world_;
  DistributedSamplerOptions options_;
  std::uint64_t epoch_ = 0;
  std::size_t num_samples_;
};

}  // namespace comm
