// peer_copy_perf: how fast one process copies another's memory on this
// host, the way the shared-memory transport's direct algorithms do
// (backends/tcp/single_copy.h), so that the COMM_SHM_DIRECT_*_THRESHOLD_BYTES
// defaults can be checked on a new machine without running a collective.
//
// Two processes, pinned to two of the CPUs this one may use: the owner of
// a buffer and its peer. For each size it times, per copy of the whole
// buffer:
//   get: the peer reads the owner's buffer (process_vm_readv), as a direct
//        algorithm's reader does;
//   put: the owner writes its buffer into the peer's (process_vm_writev);
// each with the owner's buffer reused from one copy to the next (as a
// benchmark loop's inputs are) and freshly written before each copy (as a
// trainer's gradients are: the lines are then modified in the owner's
// cache). The two processes take turns through pipes, so only the copy is
// timed.
#include <poll.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "bench/harness/cpus.h"
#include "bench/harness/options.h"
#include "bench/harness/runner.h"

namespace {

using Clock = std::chrono::steady_clock;

// How long a process waits for the other's turn before giving up.
constexpr int kTurnTimeoutMs = 10000;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "peer_copy_perf: %s\n", what.c_str());
  std::exit(1);
}

// Writes one byte to `fd`, the other process's cue.
void cue(int fd) {
  const char byte = 0;
  if (::write(fd, &byte, 1) != 1)
    fail(std::string("write: ") + strerror(errno));
}

// Waits at most kTurnTimeoutMs for a byte on `fd`.
void await(int fd) {
  pollfd entry{fd, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&entry, 1, kTurnTimeoutMs);
  } while (ready < 0 && errno == EINTR);
  if (ready <= 0) fail("the other process did not take its turn within 10 s");
  char byte;
  if (::read(fd, &byte, 1) != 1) fail("the other process ended early");
}

void pin(int cpu) {
  try {
    comm::bench::pin_to_cpu(cpu);
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

// process_vm_readv and process_vm_writev share this signature.
using PeerCopy = ssize_t (*)(pid_t, const iovec*, unsigned long, const iovec*,
                             unsigned long, unsigned long);

// Copies `bytes` between `local` in this process and `remote` in `pid`
// with `copy` (named `name` in an error) and returns the seconds it took.
double timed_copy(PeerCopy copy, const char* name, pid_t pid, void* local,
                  void* remote, std::size_t bytes) {
  const iovec local_span{local, bytes};
  const iovec remote_span{remote, bytes};
  const auto start = Clock::now();
  if (copy(pid, &local_span, 1, &remote_span, 1, 0) !=
      static_cast<ssize_t>(bytes)) {
    fail(std::string(name) + ": " + strerror(errno));
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The mean seconds of one copy of `bytes` for each of the four cases, in
// the order get reused, get fresh, put reused, put fresh.
std::vector<double> measure(std::size_t bytes, int iterations, int owner_cpu,
                            int peer_cpu) {
  // Allocated before the fork, so that each buffer has the same address
  // in both processes.
  auto* source = static_cast<std::uint8_t*>(std::aligned_alloc(4096, bytes));
  auto* target = static_cast<std::uint8_t*>(std::aligned_alloc(4096, bytes));
  if (source == nullptr || target == nullptr) fail("out of memory");
  std::memset(source, 1, bytes);
  std::memset(target, 2, bytes);
  int to_peer[2], to_owner[2], results[2];
  if (::pipe(to_peer) != 0 || ::pipe(to_owner) != 0 || ::pipe(results) != 0) {
    fail("pipe");
  }
  const pid_t owner = ::getpid();
  const pid_t peer = ::fork();
  if (peer < 0) fail("fork");
  if (peer == 0) {
    pin(peer_cpu);
    double got[2] = {0, 0};
    for (int fresh = 0; fresh < 2; ++fresh) {
      for (int i = 0; i < iterations; ++i) {
        await(to_peer[0]);
        got[fresh] += timed_copy(::process_vm_readv, "process_vm_readv", owner,
                                 target, source, bytes);
        cue(to_owner[1]);
      }
    }
    if (::write(results[1], got, sizeof(got)) != sizeof(got)) fail("write");
    // Stays until the owner has written into its buffer.
    await(to_peer[0]);
    std::_Exit(0);
  }
  pin(owner_cpu);
  std::vector<double> mean(4, 0.0);
  for (int fresh = 0; fresh < 2; ++fresh) {
    for (int i = 0; i < iterations; ++i) {
      if (fresh) comm::bench::rewrite_lines(source, bytes);
      cue(to_peer[1]);
      await(to_owner[0]);
    }
  }
  for (int fresh = 0; fresh < 2; ++fresh) {
    for (int i = 0; i < iterations; ++i) {
      if (fresh) comm::bench::rewrite_lines(source, bytes);
      mean[2 + fresh] += timed_copy(::process_vm_writev, "process_vm_writev",
                                    peer, source, target, bytes);
    }
  }
  cue(to_peer[1]);
  double got[2];
  pollfd entry{results[0], POLLIN, 0};
  if (::poll(&entry, 1, kTurnTimeoutMs) != 1 ||
      ::read(results[0], got, sizeof(got)) != sizeof(got)) {
    fail("the peer process did not report its times");
  }
  int status = 0;
  ::waitpid(peer, &status, 0);
  mean[0] = got[0];
  mean[1] = got[1];
  for (double& m : mean) m /= iterations;
  for (int fd : {to_peer[0], to_peer[1], to_owner[0], to_owner[1], results[0],
                 results[1]}) {
    ::close(fd);
  }
  std::free(source);
  std::free(target);
  return mean;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "peer_copy_perf: the time of one process's copy of another's buffer "
      "(process_vm_readv by the reader, process_vm_writev by the owner), "
      "with the owner's buffer reused and freshly written"};
  std::string min_text = "64K", max_text = "16M";
  int factor = 4, iterations = 100;
  app.add_option("-b,--minbytes", min_text, "smallest size (default 64K)");
  app.add_option("-e,--maxbytes", max_text, "largest size (default 16M)");
  app.add_option("-f,--stepfactor", factor,
                 "multiplication factor between sizes (default 4)")
      ->check(CLI::Range(2, 1 << 10));
  app.add_option("-n,--iters", iterations, "copies per case (default 100)")
      ->check(CLI::Range(1, 1 << 20));
  std::int64_t min_bytes = 0, max_bytes = 0;
  try {
    app.parse(argc, argv);
    min_bytes = comm::bench::parse_size("-b", min_text);
    max_bytes = comm::bench::parse_size("-e", max_text);
    if (min_bytes == 0 || min_bytes > max_bytes) {
      throw comm::bench::UsageError(
          "-b " + min_text + " must be positive and at most -e " + max_text);
    }
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const comm::bench::UsageError& e) {
    std::fprintf(stderr, "peer_copy_perf: %s\n", e.what());
    return 2;
  }
  std::vector<int> cpus;
  try {
    cpus = comm::bench::usable_cpus(2);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  std::printf("# owner on CPU %d, peer on CPU %d; us per copy (GB/s)\n",
              cpus[0], cpus[1]);
  std::printf("%12s %20s %20s %20s %20s\n", "bytes", "get reused", "get fresh",
              "put reused", "put fresh");
  for (std::int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= factor) {
    const auto size = static_cast<std::size_t>(bytes);
    const std::vector<double> mean =
        measure(size, iterations, cpus[0], cpus[1]);
    std::printf("%12lld", static_cast<long long>(bytes));
    for (double seconds : mean) {
      char cell[32];
      std::snprintf(cell, sizeof(cell), "%.1f (%.2f)", seconds * 1e6,
                    static_cast<double>(size) / seconds / 1e9);
      std::printf(" %20s", cell);
    }
    std::printf("\n");
  }
  return 0;
}
