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

#include <sys/types.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

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
// MASTER_ADDR and MASTER_PORT; InvalidArgument when a launcher's variable
// is not a number, or only one of RANK and WORLD_SIZE is set (a half-set
// environment would otherwise run one rank alone, and say nothing).
Placement detect_placement(const Options& options);

// How long -np waits for the other ranks to end, once one failed and it
// asked them to (SIGTERM), before it kills those left with SIGKILL: a rank
// that is stopped (SIGSTOP, a debugger) or ignores SIGTERM would otherwise
// be waited for forever. A rank ends within milliseconds of a SIGTERM it
// does not ignore.
inline constexpr std::chrono::milliseconds kRankExitGrace{5000};

// -np's wait for its rank processes (`ranks`, their pids in rank order),
// which reaps every one of them. The first rank that fails (a non-zero exit
// status, a signal) makes it send SIGTERM to every rank still running, which
// would otherwise wait for the failed one until their timeouts; those that
// have not ended `grace` later are killed with SIGKILL. A first failure by a
// signal, and each rank it killed, are named on `log`, after `program`.
// Returns 0 when every rank exited with 0, else 1.
int wait_for_ranks(const std::vector<pid_t>& ranks, const std::string& program,
                   std::chrono::milliseconds grace, std::FILE* log);

// The whole program: parses argv, starts or joins the ranks, runs, prints
// and writes JSON. Returns the exit status: 0, 1 when a result was wrong or
// a rank failed, 2 for a bad command line or launcher environment.
int bench_main(const Collective& collective, int argc, char** argv);

}  // namespace comm::bench
