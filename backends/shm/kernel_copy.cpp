#include "backends/shm/kernel_copy.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "libcomm/detail/log.h"
#include "libcomm/enum_param.h"

namespace comm::shm {
namespace {

const EnumParam kKernelCopy{
    "COMM_SHM_KERNEL_COPY",
    {"auto", "fast", "slow"},
    "auto",
    "whether the kernel copies between processes of this host "
    "(process_vm_readv) fast enough that ranks read each other's buffers "
    "in more collectives (at two ranks) and from smaller sizes (at three "
    "or more): auto times it against memcpy once per process; fast and "
    "slow decide without timing"};

constexpr std::size_t kProbeBytes = 256 << 10;
constexpr int kTries = 5;

// The kernel's copy's speed as a percentage of memcpy's, or 0 where the
// kernel refuses it.
int measure_percent() {
  using Clock = std::chrono::steady_clock;
  std::vector<std::uint8_t> source(kProbeBytes, 1);
  std::vector<std::uint8_t> target(kProbeBytes, 0);
  Clock::duration best_memcpy = Clock::duration::max();
  Clock::duration best_kernel = Clock::duration::max();
  const pid_t self = ::getpid();
  // The empty asm statements keep the compiler from moving the copies
  // across the clock reads: memcpy's effects are otherwise invisible to
  // them.
  for (int t = 0; t < kTries; ++t) {
    const auto start = Clock::now();
    asm volatile("" ::: "memory");
    std::memcpy(target.data(), source.data(), kProbeBytes);
    asm volatile("" ::: "memory");
    const auto copied = Clock::now();
    const iovec local{target.data(), kProbeBytes};
    const iovec remote{source.data(), kProbeBytes};
    const ssize_t n = ::process_vm_readv(self, &local, 1, &remote, 1, 0);
    const auto read = Clock::now();
    if (n != static_cast<ssize_t>(kProbeBytes)) return 0;
    best_memcpy = std::min(best_memcpy, copied - start);
    best_kernel = std::min(best_kernel, read - copied);
  }
  if (best_kernel.count() <= 0) return 100;
  return static_cast<int>(std::min<std::int64_t>(
      1000, 100 * best_memcpy.count() / best_kernel.count()));
}

}  // namespace

bool kernel_copy_keeps_up_here() {
  const std::string& word = kKernelCopy.get();
  if (word == "fast") return true;
  if (word == "slow") return false;
  static const int percent = [] {
    const int measured = measure_percent();
    COMM_LOG_DEBUG(
        "shared memory: process_vm_readv copies at {}% of memcpy's speed "
        "here ({}% or more counts as keeping up)",
        measured, kKeepsUpPercent);
    return measured;
  }();
  return percent >= kKeepsUpPercent;
}

}  // namespace comm::shm
