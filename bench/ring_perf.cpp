// ring_perf: the floor of a small collective over the shared-memory
// transport, with libcomm's own rings and nothing else.
//
// Two processes, pinned to two of the CPUs this one may use, make the
// exchange of a two-rank all_reduce over shared memory: each writes a
// 64-byte header and its payload into its ring to the other
// (comm::shm::Ring::write), then reads the other's header and reduces the
// other's payload into its output where it lies in the ring (peek and
// consume), as tcp::Exchange does. No task, scheduler, step, argument
// check or Work runs around it; each exchange only compares the header's
// sequence number and calls the reduce kernel. So the time of one
// exchange is what the rings' protocol costs on this machine (the cursors
// each end loads and stores, the lines each message moves between the two
// cores) with the reduction, and `all_reduce_perf -np 2` less this is
// what libcomm's call path adds to an all_reduce; a change of the protocol
// is measured here, a change of the path there. Each size's result is
// checked once its exchanges are done. A process that fails closes both
// rings, so that the other fails at once instead of at its timeout.
//
//   ring_perf [-b 1K] [-e 64K] [-f 4] [-n 20000] [-w 1000]
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "backends/shm/ring.h"
#include "bench/harness/cpus.h"
#include "bench/harness/options.h"
#include "libcomm/detail/pause_core.h"
#include "libcomm/reduce_kernels.h"

namespace {

using Clock = std::chrono::steady_clock;

// The capacity of each ring: the transport's default (COMM_SHM_RING_BYTES).
constexpr std::size_t kRingBytes = 256 << 10;
constexpr std::size_t kHeaderBytes = 64;
// How long a process waits for the other before giving up.
constexpr auto kPeerTimeout = std::chrono::seconds(10);

// The two rings, once mapped: fail() closes them.
comm::shm::Ring* rings_to_close[2] = {nullptr, nullptr};

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "ring_perf: %s\n", what.c_str());
  for (comm::shm::Ring* ring : rings_to_close) {
    if (ring != nullptr) ring->close();
  }
  // _exit: the child must not run the exit handlers it inherited.
  std::fflush(stdout);
  ::_exit(1);
}

void pin(int cpu) {
  try {
    comm::bench::pin_to_cpu(cpu);
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

// Waits, pausing the core, until `ready()` holds; fails once `a` or `b`
// is closed (the other process failed), or after kPeerTimeout. Both are
// looked at, and the clock read, only every 4096 looks, so that a wait
// that ends at once (most of them) costs the floor nothing.
template <typename Ready>
void spin_until(const comm::shm::Ring& a, const comm::shm::Ring& b,
                Ready ready) {
  Clock::time_point give_up;
  for (unsigned looks = 1; !ready(); ++looks) {
    comm::detail::pause_core();
    if (looks % 4096 != 0) continue;
    if (a.closed() || b.closed()) fail("the other process failed");
    const auto now = Clock::now();
    if (looks == 4096) {
      give_up = now + kPeerTimeout;
    } else if (now > give_up) {
      fail("the other process made no progress for " +
           std::to_string(kPeerTimeout.count()) + " s");
    }
  }
}

// One rank's side of `iterations` exchanges of `bytes` (float32 sum):
// returns the seconds the timed ones took.
double exchange(comm::shm::Ring& out, comm::shm::Ring& in, float* input,
                float* output, std::size_t bytes, int warmup, int iterations) {
  std::uint8_t header[kHeaderBytes] = {};
  std::uint8_t peer_header[kHeaderBytes];
  Clock::time_point start;
  for (int i = -warmup; i < iterations; ++i) {
    if (i == 0) start = Clock::now();
    std::memcpy(header, &i, sizeof(i));
    iovec parts[2] = {{header, kHeaderBytes}, {input, bytes}};
    int next_part = 0;  // the first part not yet wholly written
    // Bounded by spin_until: every round writes bytes or waits for room.
    while (next_part < 2) {
      const std::size_t wrote = out.write(parts + next_part, 2 - next_part);
      std::size_t left = wrote;
      while (next_part < 2 && left >= parts[next_part].iov_len) {
        left -= parts[next_part].iov_len;
        ++next_part;
      }
      if (next_part < 2) {
        parts[next_part].iov_base =
            static_cast<std::uint8_t*>(parts[next_part].iov_base) + left;
        parts[next_part].iov_len -= left;
      }
      if (wrote == 0) spin_until(out, in, [&] { return out.writable(); });
    }
    std::size_t got = 0;
    while (got < kHeaderBytes) {
      spin_until(out, in, [&] { return in.readable(); });
      const iovec into{peer_header + got, kHeaderBytes - got};
      got += in.read(&into, 1);
    }
    if (std::memcmp(peer_header, &i, sizeof(i)) != 0) {
      fail("a message arrived out of order");
    }
    std::size_t done = 0;
    while (done < bytes) {
      spin_until(out, in, [&] { return in.readable(); });
      const auto ready = in.peek();
      // Every message is whole elements, and so is the ring: no element
      // straddles the ring's end.
      const std::size_t take = std::min(ready.size(), bytes - done) / 4 * 4;
      if (take == 0) fail("an element straddles the end of the ring");
      comm::reduce_pair_into(comm::ReduceOp::kSum, comm::DType::kF32,
                             output + done / 4, input + done / 4, ready.data(),
                             take / 4);
      in.consume(take);
      done += take;
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ring_perf: two processes exchange a two-rank all_reduce's messages "
      "over libcomm's shared-memory rings, with nothing around them; us per "
      "exchange"};
  std::string min_text = "1K", max_text = "64K";
  int factor = 4, iterations = 20000, warmup = 1000;
  app.add_option("-b,--minbytes", min_text, "smallest size (default 1K)");
  app.add_option("-e,--maxbytes", max_text, "largest size (default 64K)");
  app.add_option("-f,--stepfactor", factor,
                 "multiplication factor between sizes (default 4)")
      ->check(CLI::Range(2, 1 << 10));
  app.add_option("-n,--iters", iterations,
                 "timed exchanges per size (default 20000)")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("-w,--warmup_iters", warmup,
                 "exchanges before the timed ones (default 1000)")
      ->check(CLI::Range(0, 1 << 24));
  std::int64_t min_bytes = 0, max_bytes = 0;
  try {
    app.parse(argc, argv);
    min_bytes = comm::bench::parse_size("-b", min_text);
    max_bytes = comm::bench::parse_size("-e", max_text);
    // Each process writes its whole message before it reads the other's,
    // so a message must fit in a ring with room to spare: a quarter of it.
    if (min_bytes <= 0 || min_bytes % 4 != 0 || max_bytes % 4 != 0 ||
        min_bytes > max_bytes ||
        max_bytes > static_cast<std::int64_t>(kRingBytes / 4)) {
      throw comm::bench::UsageError(
          "-b " + min_text + " and -e " + max_text +
          " must be multiples of 4 bytes, the first no larger than the "
          "second, the second at most " +
          std::to_string(kRingBytes / 4 / 1024) + "K (a quarter of a ring)");
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const comm::bench::UsageError& e) {
    std::fprintf(stderr, "ring_perf: %s\n", e.what());
    return 2;
  }
  std::vector<int> cpus;
  try {
    cpus = comm::bench::usable_cpus(2);
  } catch (const std::exception& e) {
    fail(e.what());
  }

  // Two rings, one each way, in memory both processes map: zeroed, as a
  // new ring must be.
  const std::size_t footprint = comm::shm::ring_footprint(kRingBytes);
  void* shared = ::mmap(nullptr, 2 * footprint, PROT_READ | PROT_WRITE,
                        MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (shared == MAP_FAILED) fail(std::string("mmap: ") + strerror(errno));
  auto* base = static_cast<std::uint8_t*>(shared);
  // No doorbells: neither end ever sleeps, so neither is ever rung.
  comm::shm::Ring zero_to_one(base, kRingBytes, -1);
  comm::shm::Ring one_to_zero(base + footprint, kRingBytes, -1);

  std::printf("# CPUs %d and %d, rings of %zu KiB; us per exchange\n", cpus[0],
              cpus[1], kRingBytes / 1024);
  std::printf("%12s %12s\n", "bytes", "time");
  std::fflush(stdout);
  rings_to_close[0] = &zero_to_one;
  rings_to_close[1] = &one_to_zero;
  const pid_t child = ::fork();
  if (child < 0) fail(std::string("fork: ") + strerror(errno));
  const int rank = child == 0 ? 1 : 0;
  pin(cpus[static_cast<std::size_t>(rank)]);
  comm::shm::Ring& out = rank == 0 ? zero_to_one : one_to_zero;
  comm::shm::Ring& in = rank == 0 ? one_to_zero : zero_to_one;
  std::vector<float> input(static_cast<std::size_t>(max_bytes) / 4);
  std::vector<float> output(input.size());
  for (std::size_t i = 0; i < input.size(); ++i) {
    input[i] = static_cast<float>((i % 1000) * (rank + 1));
  }
  for (std::int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    const auto size = static_cast<std::size_t>(bytes);
    const double seconds = exchange(out, in, input.data(), output.data(), size,
                                    warmup, iterations);
    // Both ranks hold input(rank 0) + input(rank 1) = 3 * (i % 1000).
    for (std::size_t i = 0; i < size / 4; ++i) {
      if (output[i] != static_cast<float>(3 * (i % 1000))) {
        fail("rank " + std::to_string(rank) + " got a wrong sum at element " +
             std::to_string(i) + " of " + std::to_string(size / 4));
      }
    }
    if (rank == 0) {
      std::printf("%12lld %12.2f\n", static_cast<long long>(bytes),
                  seconds * 1e6 / iterations);
      std::fflush(stdout);
    }
  }
  if (rank == 1) ::_exit(0);
  // Bounded: the child needs nothing more from this process, and fails
  // within its own timeout.
  int status = 0;
  pid_t reaped;
  do {
    reaped = ::waitpid(child, &status, 0);
  } while (reaped < 0 && errno == EINTR);
  if (reaped != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fail("the other process failed");
  }
  return 0;
}
