// The command line of the *_perf binaries: nccl-tests' flags, plus how many
// local ranks to start and which backend and device to use.
//
// Sizes take nccl-tests' suffixes (K, M, G: powers of 1024). Every value is
// checked here, so that a bad flag is a usage error naming the flag and the
// value, never a failed run later.
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "libcomm/dtype.h"
#include "libcomm/reduce_op.h"

namespace comm::bench {

// How each rank's time combines into the one the table shows (-a).
enum class Average { kRank0 = 0, kMean = 1, kMin = 2, kMax = 3 };

struct Options {
  std::int64_t min_bytes = 32 << 20;       // -b
  std::int64_t max_bytes = 32 << 20;       // -e
  std::int64_t step_bytes = 1 << 20;       // -i, used when step_factor is 0
  std::int64_t step_factor = 0;            // -f; 0: add step_bytes instead
  int iterations = 20;                     // -n
  std::int64_t iteration_bytes = 0;        // see iterations_for; 0: off
  int warmup = 5;                          // -w
  int check = 1;                           // -c: checked runs per case; 0: none
  std::vector<DType> dtypes{DType::kF32};  // -d (or "all")
  std::vector<ReduceOp> ops{ReduceOp::kSum};  // -o (or "all")
  int root = 0;                               // -r
  bool all_roots = false;                     // -r all
  Average average = Average::kMean;           // -a
  bool blocking = false;                      // -z
  // --fresh-inputs: before each operation (and outside its time), each
  // rank stores to every cache line of its inputs, as a training step
  // writes the gradients it then reduces, so that no rank finds a peer's
  // input still in its own cache from the operation before, and the ranks
  // meet in a barrier. Host memory and -z 1 only.
  bool fresh_inputs = false;
  // -R 1: the buffers are shared host memory (Tensor::shared_host_zeros),
  // which the ranks of one host read directly, as nccl-tests' -R registers
  // its buffers with NCCL. Host memory only.
  bool shared_host = false;
  std::string json_path;        // -J
  std::string backend = "tcp";  // --backend
  std::string device;           // --device; empty: cuda for nccl, cpu otherwise
  int spawn = 0;                // -np: local ranks to start; 0: see launch.h
  // --bind-to, for -np ranks: kCore pins rank r to usable CPU r mod their
  // number; kAuto does so when the ranks fit the CPUs, as mpirun does by
  // default. kCore is the default because ranks that sleep while they wait
  // are not spread evenly by the kernel's load balancer when they outnumber
  // the CPUs, so unbound runs vary with where the ranks land.
  enum class Binding { kAuto, kCore, kNone } binding = Binding::kCore;
  std::chrono::seconds timeout{300};  // --timeout, per operation

  // The sizes to run, from min_bytes to max_bytes; at most `limit` of them
  // (the first ones), so that a range too fine to run is refused without
  // making its whole list.
  std::vector<std::int64_t> sizes(
      std::size_t limit = std::numeric_limits<std::size_t>::max()) const;
  // Timed iterations at `size`: -n, or with --iteration-bytes B, B / size
  // but at least 3 and at most -n, as the loops of bench/peers count
  // theirs (64 MiB / size, 3 to 20000), so that one sweep can match them.
  int iterations_for(std::int64_t size) const;
};

// A bad command line; what() says which flag and why.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// --help or --print-config was asked for; what() is the text to print on
// stdout before exiting with status 0.
struct HelpRequested : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses argv[1..] (`program` names the binary in the help text). Throws
// UsageError or HelpRequested.
Options parse_options(const std::string& program,
                      const std::vector<std::string>& args);

// Throws UsageError naming `flag` unless a file can be written at `path`:
// a directory, a missing directory or a file this user may not write is
// refused; a pipe, a device or a symbolic link is left to the writer. A
// file that was not there is made and removed again; one that was is left
// as it was. So that a sweep does not run to its end only to fail there,
// the process that will write it checks before it starts.
void check_output_path(const std::string& flag, const std::string& path);

// "32M" -> 33554432. Throws UsageError naming `flag` for anything that is
// not a non-negative integer with an optional K, M or G suffix.
std::int64_t parse_size(const std::string& flag, const std::string& text);

}  // namespace comm::bench
