// Every *_perf binary: the shared harness, run on the collective the build
// names (COMM_BENCH_COLLECTIVE, e.g. "all_reduce" for all_reduce_perf).
#include "bench/harness/collective.h"
#include "bench/harness/launch.h"

int main(int argc, char** argv) {
  return comm::bench::bench_main(
      comm::bench::find_collective(COMM_BENCH_COLLECTIVE), argc, argv);
}
