// copy_perf: memcpy against comm::detail::copy_bytes, by the distance from
// source to destination modulo 4 KiB.
//
// Each size is copied from the start of a page to `distance` bytes past the
// start of another, the two functions alternating, and the table prints
// each one's median rate and their ratio. On CPUs whose `rep movsb` crawls
// when the destination lies 1 to 31 bytes past the source (see
// libcomm/detail/copy_bytes.h), memcpy's column drops there by an order of
// magnitude and copy_bytes' does not; elsewhere the two are one memcpy.
//
//   copy_perf [-n ITERATIONS]
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "libcomm/detail/copy_bytes.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kPage = 4096;
constexpr std::size_t kLargest = 1 << 20;

double median(std::vector<double> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Seconds one copy took.
template <typename Copy>
double timed(Copy copy, void* to, const void* from, std::size_t bytes) {
  const auto start = Clock::now();
  copy(to, from, bytes);
  // Keeps the compiler from dropping or merging copies no one reads.
  asm volatile("" : : "r"(to) : "memory");
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Page-aligned memory of `bytes`, written once so that its pages are in.
std::uint8_t* pages(std::size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("copy_perf: mmap");
    std::exit(1);
  }
  std::memset(p, 1, bytes);
  return static_cast<std::uint8_t*>(p);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200;
  if (argc == 3 && std::string(argv[1]) == "-n" && std::atoi(argv[2]) > 0) {
    iterations = std::atoi(argv[2]);
  } else if (argc != 1) {
    std::fprintf(stderr, "usage: %s [-n ITERATIONS] (default 200)\n", argv[0]);
    return 2;
  }
  std::uint8_t* source = pages(kLargest + kPage);
  std::uint8_t* destination = pages(kLargest + 2 * kPage);
  const auto copy_bytes = [](void* to, const void* from, std::size_t n) {
    comm::detail::copy_bytes(to, from, n);
  };
  const auto libc_memcpy = [](void* to, const void* from, std::size_t n) {
    std::memcpy(to, from, n);
  };

  std::printf("# median of %d copies each, alternating\n", iterations);
  std::printf("%10s %9s %12s %12s %8s\n", "bytes", "distance", "memcpy_GB/s",
              "copy_GB/s", "ratio");
  for (std::size_t bytes : {std::size_t{4} << 10, std::size_t{32} << 10,
                            std::size_t{256} << 10, kLargest}) {
    for (std::size_t distance : {0, 8, 16, 24, 40, 64, 4088}) {
      std::uint8_t* to = destination + kPage + distance;
      std::vector<double> libc, ours;
      for (int i = 0; i < iterations; ++i) {
        libc.push_back(timed(libc_memcpy, to, source, bytes));
        ours.push_back(timed(copy_bytes, to, source, bytes));
      }
      const double libc_rate = static_cast<double>(bytes) / median(libc);
      const double our_rate = static_cast<double>(bytes) / median(ours);
      std::printf("%10zu %9zu %12.1f %12.1f %8.2f\n", bytes, distance,
                  libc_rate / 1e9, our_rate / 1e9, our_rate / libc_rate);
    }
  }
  return 0;
}
