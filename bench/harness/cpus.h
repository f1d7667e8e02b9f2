// The CPUs a two-process bench (peer_copy_perf, ring_perf) runs on: two of
// those this process may use, one per process, so that what it times is
// the traffic between two cores and not the scheduler's choices.
#pragma once

#include <cstddef>
#include <vector>

namespace comm::bench {

// The first `count` CPUs in this process's affinity mask, in ascending
// order. Throws UsageError when the mask holds fewer (a taskset or a
// cgroup narrower than the bench needs), and std::system_error when the
// mask cannot be read.
std::vector<int> usable_cpus(std::size_t count);

// Pins the calling process to `cpu` alone. Throws std::system_error when
// the kernel refuses.
void pin_to_cpu(int cpu);

}  // namespace comm::bench
