#include "bench/harness/launch.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include "bench/harness/runner.h"
#include "libcomm/cuda.h"
#include "libcomm/detail/socket.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/distributed/rendezvous.h"
#include "libcomm/error.h"
#include "libcomm/logging.h"
#include "libcomm/param.h"
#include "libcomm/reduce_kernels.h"
#include "store/hash_store.h"
#include "store/tcp_store.h"
#include "store/tcp_store_server.h"

namespace comm::bench {
namespace {

std::optional<std::string> env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int env_int(const char* name) {
  const std::string text = *env(name);
  try {
    std::size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size() && value >= 0) return value;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(std::string(name) + " is '" + text +
                        "', not a non-negative integer; a launcher sets it, "
                        "so fix it or unset it");
}

std::string job_store_path(const std::string& job) {
  const std::string dir = env("TMPDIR").value_or("/tmp");
  return dir + "/libcomm-bench-" + job;
}

Device device_for(const Options& options, int local_rank) {
  if (options.device == "cpu") return Device::cpu();
  const int count = cuda_device_count();
  if (count <= 0) {
    // --backend nccl asks for --device cuda unless told otherwise.
    throw InvalidArgument(
        std::string(options.backend == "nccl"
                        ? "--backend nccl runs on CUDA devices, but none is "
                          "visible"
                        : "--device cuda: no CUDA device is visible") +
        std::string(built_with_cuda() ? ""
                                      : " (libcomm was built without CUDA)"));
  }
  return Device::cuda(local_rank % count);
}

// The backend spec of the harness's group. The harness's own traffic (who
// runs where, the combined times, the count of wrong values, peak RSS)
// travels in host tensors, which NCCL does not take: "nccl" gets TCP beside
// it for them, as a c10d program asks for "cpu:gloo,cuda:nccl". The timed
// operations are on the device's tensors and go to NCCL alone.
std::string group_backend(const Options& options) {
  return options.backend == "nccl" ? "cpu:tcp,cuda:nccl" : options.backend;
}

// One rank's run on an established store. Returns its exit status.
int run_rank(const Collective& collective, const Options& options,
             const std::string& program, std::shared_ptr<Store> store, int rank,
             int world, int local_rank) {
  // A rendezvous names the rank in the log lines; ranks that -np started
  // share its store without one.
  if (world > 1) set_log_rank(rank);
  const Device device = device_for(options, local_rank);
  ProcessGroup group(std::move(store), rank, world, group_backend(options),
                     options.timeout);
  Report report = run_benchmark(collective, options, group, device, stdout);
  if (rank == 0 && !options.json_path.empty()) {
    write_json(options.json_path, program, collective, options, world, report);
  }
  group.barrier()->wait();
  group.shutdown();
  return report.wrong == 0 ? 0 : 1;
}

// Pins this process to the `rank`-th CPU of those it may use, when the
// options ask for it: ranks left to the scheduler are often placed on one
// CPU, because loopback TCP wakes a receiver on its sender's CPU, and then
// take turns instead of running side by side.
void bind_rank(const Options& options, int rank, int ranks) {
  if (options.binding == Options::Binding::kNone) return;
  cpu_set_t usable;
  CPU_ZERO(&usable);
  if (sched_getaffinity(0, sizeof(usable), &usable) != 0) return;
  const int count = CPU_COUNT(&usable);
  if (options.binding == Options::Binding::kAuto && ranks > count) return;
  int seen = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &usable) || seen++ != rank % count) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) {
      throw SystemError(errno, "--bind-to core: sched_setaffinity");
    }
    return;
  }
}

int report_failure(const std::string& program, int rank, const char* what) {
  std::fprintf(stderr, "%s: rank %d: %s\n", program.c_str(), rank, what);
  return 1;
}

// -np: forks the ranks, then hosts their store. Forking comes first, so the
// children start from a process with one thread.
int spawn_ranks(const Collective& collective, const Options& options,
                const std::string& program) {
  const std::uint16_t port = detail::free_loopback_port();
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int rank = 0; rank < options.spawn; ++rank) {
    const pid_t pid = fork();
    if (pid < 0) {
      for (pid_t child : children) kill(child, SIGKILL);
      throw SystemError(errno, "fork");
    }
    if (pid == 0) {
      // A rank must not outlive the process that started it.
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      int code = 1;
      try {
        bind_rank(options, rank, options.spawn);
        TCPStoreOptions store_options;
        store_options.host = "127.0.0.1";
        store_options.port = port;
        store_options.timeout = options.timeout;
        auto store = std::make_shared<TCPStore>(store_options);
        join_ranks(*store, rank, options.spawn, options.timeout);
        code = run_rank(collective, options, program, store, rank,
                        options.spawn, rank);
      } catch (const std::exception& e) {
        code = report_failure(program, rank, e.what());
      }
      std::fflush(nullptr);
      _exit(code);
    }
    children.push_back(pid);
  }
  std::optional<TCPStoreServer> server;
  try {
    server.emplace(TCPStoreServerOptions{.host = "127.0.0.1", .port = port});
  } catch (const std::exception& e) {
    for (pid_t child : children) kill(child, SIGKILL);
    for (pid_t child : children) waitpid(child, nullptr, 0);
    std::fprintf(stderr, "%s: could not host the ranks' store: %s\n",
                 program.c_str(), e.what());
    return 1;
  }
  return wait_for_ranks(children, program, kRankExitGrace, stderr);
}

// What can only be checked once the collective and the world size are
// known: an op the dtype lacks, a root outside the group.
void check_case_options(const Collective& collective, const Options& options,
                        int world) {
  if (collective.uses_op()) {
    for (DType dtype : options.dtypes) {
      for (ReduceOp op : options.ops) {
        try {
          check_reduce_op(op, dtype);
        } catch (const InvalidArgument& e) {
          throw UsageError(std::string("-d/-o: ") + e.what());
        }
      }
    }
  }
  if (collective.uses_root() && !options.all_roots && options.root >= world) {
    throw UsageError("-r " + std::to_string(options.root) +
                     " is not a rank of the " + std::to_string(world) +
                     "-rank group");
  }
}

}  // namespace

int wait_for_ranks(const std::vector<pid_t>& ranks, const std::string& program,
                   std::chrono::milliseconds grace, std::FILE* log) {
  using Clock = std::chrono::steady_clock;
  std::vector<bool> ended(ranks.size(), false);
  std::size_t running = ranks.size();
  int status_code = 0;
  std::size_t first_failed = 0;
  // Set at the first failure: when the ranks still running are killed.
  std::optional<Clock::time_point> kill_at;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, kill_at ? WNOHANG : 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;  // no child left to wait for
    }
    if (pid == 0) {
      // After a failure: a short sleep between polls, bounded by kill_at.
      if (Clock::now() < *kill_at) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      for (std::size_t rank = 0; rank < ranks.size(); ++rank) {
        if (ended[rank]) continue;
        // SIGKILL ends a stopped process too.
        kill(ranks[rank], SIGKILL);
        while (waitpid(ranks[rank], nullptr, 0) < 0 && errno == EINTR) {
        }
        ended[rank] = true;
        --running;
        std::fprintf(log,
                     "%s: rank %zu had not ended %.1f s after rank %zu "
                     "failed; killed it (SIGKILL)\n",
                     program.c_str(), rank,
                     std::chrono::duration<double>(grace).count(),
                     first_failed);
      }
      break;
    }
    const auto found = std::find(ranks.begin(), ranks.end(), pid);
    if (found == ranks.end()) continue;  // not a rank of this job
    const auto rank = static_cast<std::size_t>(found - ranks.begin());
    ended[rank] = true;
    --running;
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (ok || status_code != 0) continue;
    status_code = 1;
    first_failed = rank;
    if (WIFSIGNALED(status)) {
      std::fprintf(log, "%s: rank %zu was killed by signal %d (%s)\n",
                   program.c_str(), rank, WTERMSIG(status),
                   strsignal(WTERMSIG(status)));
    }
    for (std::size_t other = 0; other < ranks.size(); ++other) {
      if (!ended[other]) kill(ranks[other], SIGTERM);
    }
    kill_at = Clock::now() + grace;
  }
  std::fflush(log);
  return status_code;
}

Placement detect_placement(const Options& options) {
  Placement p;
  std::optional<std::string> job;
  bool single_host = false;
  if (env("RANK") && env("WORLD_SIZE")) {
    p.launcher = "env";
    p.rank = env_int("RANK");
    p.world = env_int("WORLD_SIZE");
    p.local_rank = env("LOCAL_RANK") ? env_int("LOCAL_RANK") : p.rank;
    p.init_method = "env://";
  } else if (env("OMPI_COMM_WORLD_RANK") && env("OMPI_COMM_WORLD_SIZE")) {
    p.launcher = "mpirun";
    p.rank = env_int("OMPI_COMM_WORLD_RANK");
    p.world = env_int("OMPI_COMM_WORLD_SIZE");
    p.local_rank = env("OMPI_COMM_WORLD_LOCAL_RANK")
                       ? env_int("OMPI_COMM_WORLD_LOCAL_RANK")
                       : p.rank;
    single_host = env("OMPI_COMM_WORLD_LOCAL_SIZE") &&
                  env_int("OMPI_COMM_WORLD_LOCAL_SIZE") == p.world;
    job = env("OMPI_MCA_ess_base_jobid");
  } else if (env("SLURM_STEP_ID") && env("SLURM_PROCID") &&
             env("SLURM_NTASKS")) {
    p.launcher = "srun";
    p.rank = env_int("SLURM_PROCID");
    p.world = env_int("SLURM_NTASKS");
    p.local_rank = env("SLURM_LOCALID") ? env_int("SLURM_LOCALID") : p.rank;
    single_host = env("SLURM_NNODES") && env_int("SLURM_NNODES") == 1;
    if (env("SLURM_JOB_ID"))
      job = *env("SLURM_JOB_ID") + "." + *env("SLURM_STEP_ID");
  }
  if (p.launcher == "single" && options.spawn == 0 &&
      (env("RANK") || env("WORLD_SIZE"))) {
    throw InvalidArgument(
        std::string(env("RANK") ? "RANK is set but WORLD_SIZE is not"
                                : "WORLD_SIZE is set but RANK is not") +
        ": set both, as commrun and torchrun do, or neither to run one rank "
        "here (or -np N for N local ranks)");
  }
  if (p.launcher != "single" && options.spawn > 0) {
    const std::string launcher =
        p.launcher == "env"      ? "commrun or torchrun (RANK is set)"
        : p.launcher == "mpirun" ? "mpirun (OMPI_COMM_WORLD_RANK is set)"
                                 : "srun (SLURM_PROCID is set)";
    throw UsageError(
        "-np starts local ranks itself, but this process runs "
        "under " +
        launcher + ", which started " + std::to_string(p.world) +
        " rank(s) already; drop -np");
  }
  if (options.spawn > 0) {
    p.launcher = "spawn";
    p.world = options.spawn;
    return p;
  }
  if (p.launcher == "mpirun" || p.launcher == "srun") {
    if (env("MASTER_ADDR") && env("MASTER_PORT")) {
      p.init_method =
          "tcp://" + *env("MASTER_ADDR") + ":" + *env("MASTER_PORT");
    } else if (single_host && job) {
      p.init_method = "file://" + job_store_path(*job);
    } else {
      throw UsageError("under " + p.launcher +
                       " across hosts, export MASTER_ADDR and MASTER_PORT "
                       "(a host and free port of rank 0) so that the ranks "
                       "can meet");
    }
  }
  return p;
}

int bench_main(const Collective& collective, int argc, char** argv) {
  const std::string program = std::string(collective.name()) + "_perf";
  Options options;
  Placement placement;
  try {
    options =
        parse_options(program, std::vector<std::string>(argv + 1, argv + argc));
    placement = detect_placement(options);
    // The knobs the ranks read as they start, read here, so that a bad
    // value fails before any rank does (or goes unnoticed where -np's
    // ranks make their own rendezvous).
    read_params("COMM_RDZV_");
    check_case_options(collective, options, placement.world);
    // Rank 0 writes it; -np's ranks run beside the process that starts
    // them.
    if (!options.json_path.empty() && placement.rank == 0) {
      check_output_path("-J", options.json_path);
    }
  } catch (const HelpRequested& help) {
    std::fputs(help.what(), stdout);
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "%s: %s\nRun '%s --help' for the options.\n",
                 program.c_str(), e.what(), program.c_str());
    return 2;
  } catch (const InvalidArgument& e) {
    // The environment, not the command line.
    std::fprintf(stderr, "%s: %s\n", program.c_str(), e.what());
    return 2;
  }
  try {
    if (placement.launcher == "spawn") {
      return spawn_ranks(collective, options, program);
    }
    if (placement.launcher == "single") {
      return run_rank(collective, options, program,
                      std::make_shared<HashStore>(), 0, 1, 0);
    }
    RendezvousResult joined = rendezvous(placement.init_method, placement.rank,
                                         placement.world, options.timeout);
    return run_rank(collective, options, program, joined.store, joined.rank,
                    joined.world_size, placement.local_rank);
  } catch (const std::exception& e) {
    return report_failure(program, placement.rank, e.what());
  }
}

}  // namespace comm::bench
