/* The Open MPI side of bench/compare.py: times each collective the libcomm
 * bench binaries have, float32 (sum where it reduces), root 0, blocking,
 * over the sizes and iteration counts compare.py gives ours, and prints
 * "collective bytes time_us" on rank 0, the time being the slowest rank's
 * mean per call (all_reduce_perf -a 3).
 *
 * Sizes are counted as nccl-tests and the *_perf binaries count them: one
 * rank's buffer for all_reduce, broadcast and reduce; the whole buffer of n
 * blocks for all_gather, reduce_scatter, alltoall, gather and scatter.
 *
 *   mpicc -O2 bench/peers/mpi_collectives.c -o mpi_collectives
 *   mpirun -np N ./mpi_collectives [--fresh-inputs] [COLLECTIVE...]
 *
 * With no collective it runs every one, in the order of kCollectives.
 * --fresh-inputs stores to every cache line of what each rank's call reads
 * of its input before each call, then meets the other ranks in a barrier,
 * both outside the call's time, as the *_perf binaries' --fresh-inputs
 * does. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  kAllReduce,
  kAllGather,
  kBroadcast,
  kReduce,
  kReduceScatter,
  kAllToAll,
  kGather,
  kScatter,
  kCount
};

static const char* const kCollectives[kCount] = {
    "all_reduce",     "all_gather", "broadcast", "reduce",
    "reduce_scatter", "alltoall",   "gather",    "scatter"};

static const long kMinBytes = 1024;
static const long kMaxBytes = 64L << 20;
static const int kWarmup = 2;

/* The iteration count of compare.py's --iteration-bytes: 64 MiB / size,
 * between 3 and 20000. */
static int iterations_for(long bytes) {
  long iterations = kMaxBytes / bytes;
  if (iterations < 3) iterations = 3;
  if (iterations > 20000) iterations = 20000;
  return (int)iterations;
}

static void run_once(int collective, float* in, float* out, long total,
                     long block) {
  switch (collective) {
    case kAllReduce:
      MPI_Allreduce(in, out, (int)total, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      break;
    case kAllGather:
      MPI_Allgather(in, (int)block, MPI_FLOAT, out, (int)block, MPI_FLOAT,
                    MPI_COMM_WORLD);
      break;
    case kBroadcast:
      MPI_Bcast(in, (int)total, MPI_FLOAT, 0, MPI_COMM_WORLD);
      break;
    case kReduce:
      MPI_Reduce(in, out, (int)total, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
      break;
    case kReduceScatter:
      MPI_Reduce_scatter_block(in, out, (int)block, MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
      break;
    case kAllToAll:
      MPI_Alltoall(in, (int)block, MPI_FLOAT, out, (int)block, MPI_FLOAT,
                   MPI_COMM_WORLD);
      break;
    case kGather:
      MPI_Gather(in, (int)block, MPI_FLOAT, out, (int)block, MPI_FLOAT, 0,
                 MPI_COMM_WORLD);
      break;
    case kScatter:
      MPI_Scatter(in, (int)block, MPI_FLOAT, out, (int)block, MPI_FLOAT, 0,
                  MPI_COMM_WORLD);
      break;
  }
}

/* Stores every cache line of `bytes` at `data` back unchanged, so that the
 * lines are this rank's alone (modified in its cache), as freshly computed
 * data is. */
static void rewrite(void* data, long bytes) {
  volatile unsigned char* line = (volatile unsigned char*)data;
  if (bytes <= 0) return;
  for (long at = 0; at < bytes; at += 64) line[at] = line[at];
  /* A buffer that starts inside a line ends inside one the stride skips. */
  line[bytes - 1] = line[bytes - 1];
}

/* The bytes of its input that a rank's call reads: one block for a
 * gathering call, the root's n blocks for scatter, all of it otherwise. */
static long input_bytes(int collective, int rank, long total, long block) {
  switch (collective) {
    case kAllGather:
    case kGather: return block * (long)sizeof(float);
    case kScatter: return rank == 0 ? total * (long)sizeof(float) : 0;
    default: return total * (long)sizeof(float);
  }
}

/* Whether the size counts the whole buffer of n blocks (see above). */
static int size_is_total(int collective) {
  return collective != kAllReduce && collective != kBroadcast &&
         collective != kReduce;
}

static void measure(int collective, int rank, int world, int fresh_inputs) {
  for (long bytes = kMinBytes; bytes <= kMaxBytes; bytes *= 4) {
    /* One rank's elements, and a block's where the size is n blocks. */
    const long total = bytes / (long)sizeof(float);
    const long block = total / world;
    /* A gathering output and a scattering input hold n blocks; so does the
     * input of reduce_scatter and alltoall. */
    if (size_is_total(collective) && block == 0) continue;
    const long elements = total;
    float* in = malloc((size_t)elements * sizeof(float));
    float* out = malloc((size_t)elements * sizeof(float));
    if (!in || !out) {
      fprintf(stderr, "rank %d: out of memory for %ld bytes\n", rank, bytes);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    for (long i = 0; i < elements; i++) in[i] = out[i] = 1.0f;
    const int iterations = iterations_for(bytes);
    double start = 0;
    double rewriting = 0; /* seconds in rewrite(), left out of the calls' */
    for (int i = -kWarmup; i < iterations; i++) {
      if (i == 0) {
        MPI_Barrier(MPI_COMM_WORLD);
        start = MPI_Wtime();
      }
      if (fresh_inputs) {
        const double began = MPI_Wtime();
        rewrite(in, input_bytes(collective, rank, total, block));
        /* No rank's call starts while another still rewrites. */
        MPI_Barrier(MPI_COMM_WORLD);
        if (i >= 0) rewriting += MPI_Wtime() - began;
      }
      run_once(collective, in, out, total, block);
    }
    const double mean = (MPI_Wtime() - start - rewriting) / iterations;
    double slowest = 0;
    MPI_Reduce(&mean, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0)
      printf("%s %ld %.2f\n", kCollectives[collective], bytes, slowest * 1e6);
    free(in);
    free(out);
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  int fresh_inputs = 0;
  int first = 1;
  if (argc > 1 && strcmp(argv[1], "--fresh-inputs") == 0) {
    fresh_inputs = 1;
    first = 2;
  }
  for (int a = first; a < argc; a++) {
    int known = 0;
    for (int c = 0; c < kCount; c++)
      known |= strcmp(argv[a], kCollectives[c]) == 0;
    if (!known) {
      if (rank == 0)
        fprintf(stderr, "mpi_collectives: unknown collective '%s'\n", argv[a]);
      MPI_Finalize();
      return 2;
    }
  }
  for (int c = 0; c < kCount; c++) {
    int wanted = argc == first;
    for (int a = first; a < argc; a++)
      wanted |= strcmp(argv[a], kCollectives[c]) == 0;
    if (wanted) measure(c, rank, world, fresh_inputs);
  }
  MPI_Finalize();
  return 0;
}
