// How the ranks of a *_perf run find each other, and the main() every
// binary shares.
//
// In order of precedence:
//   -np N           this process starts N ranks on this host (fork) and
//                   hosts their store itself: a TCPStore server on
//                   loopback. No launcher and no external service needed.
//   RANK, WORLD_SIZE (commrun, torchrun): env:// (MASTER_ADDR, MASTER_PORT).
//   OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK (mpirun), or SLURM_PROCID,
//   SLURM_NTASKS, SLURM_LOCALID inside an srun step: the store is
//                   tcp://MASTER_ADDR:MASTER_PORT when both are set, else,
//                   when every rank runs on this host, a FileStore under
//                   $TMPDIR named after the job.
//   none of these   one rank.
#pragma once

#include <string>

#include "bench/harness/collective.h"
#include "bench/harness/options.h"

namespace comm::bench {

struct Placement {
  int rank = 0;
  int world = 1;
  int local_rank = 0;
  // "spawn" (-np), "env" (commrun), "mpirun", "srun" or "single".
  std::string launcher = "single";
  // How the store is reached, for every launcher but "spawn" and "single".
  std::string init_method;
};

// Reads the environment as described above. Throws UsageError when -np is
// combined with a launcher, or when a multi-host MPI or Slurm job lacks
// MASTER_ADDR and MASTER_PORT.
Placement detect_placement(const Options& options);

// The whole program: parses argv, starts or joins the ranks, runs, prints
// and writes JSON. Returns the exit status: 0, 1 when a result was wrong or
// a rank failed, 2 for a bad command line.
int bench_main(const Collective& collective, int argc, char** argv);

}  // namespace comm::bench
