// The measuring loop every *_perf binary shares, and its two outputs: the
// nccl-tests table (rank 0, stdout) and the JSON file of -J.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "bench/harness/collective.h"
#include "bench/harness/options.h"
#include "libcomm/distributed/process_group.h"

namespace comm::bench {

struct Measurement {
  double time_us = 0;       // per operation, combined across ranks per -a
  double algbw = 0;         // GB/s
  double busbw = 0;         // GB/s
  std::int64_t wrong = -1;  // summed over ranks; -1 when not checked
};

struct Row {
  std::int64_t bytes = 0;
  std::size_t count = 0;
  DType dtype = DType::kF32;
  std::optional<ReduceOp> op;  // for the collectives that reduce
  int root = -1;               // -1 for the collectives without one
  Measurement out_of_place;
  std::optional<Measurement> in_place;
};

struct Report {
  std::vector<Row> rows;
  // Every rank's peak resident set (getrusage), in bytes.
  std::vector<std::int64_t> peak_rss_bytes;
  double avg_busbw = 0;
  std::int64_t wrong = 0;  // over every checked row
};

// nccl-tests' bandwidths, in GB/s, for `bytes` (a row's size) moved in
// `seconds`: algbw = bytes / seconds, busbw = algbw x bus_factor(world).
std::pair<double, double> bandwidths(const Collective& collective,
                                     std::int64_t bytes, double seconds,
                                     int world);

// Stores every cache line of the `bytes` bytes at `data` back unchanged,
// the last byte included: afterwards the lines are modified in this CPU's
// cache alone, as freshly computed data is, and a peer that reads them
// cannot find them in its own cache. `data` may be null when `bytes` is 0.
void rewrite_lines(void* data, std::size_t bytes);

// Runs every size, dtype, op and root of `options` on `group`. Every rank
// calls it; rank 0 prints the table to `out` when it is not null. Throws
// what the operations throw.
Report run_benchmark(const Collective& collective, const Options& options,
                     ProcessGroup& group, Device device, std::FILE* out);

// Writes `report` as JSON to `path`. Throws SystemError when the file
// cannot be written.
void write_json(const std::string& path, const std::string& program,
                const Collective& collective, const Options& options, int world,
                const Report& report);

}  // namespace comm::bench
