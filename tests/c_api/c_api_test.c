/*
 * The C API from C11: handles, result codes and messages, stores, and every
 * collective across real processes (forked ranks meeting in a FileStore).
 *
 * Usage: c_api_test [WORLD_SIZE]   (default 3)
 *
 * Each check that fails prints the file, line, the call's result and
 * comm_last_error(), and the process exits 1; the parent exits 1 when any
 * rank did. Every process is bounded by alarm().
 */
#define _POSIX_C_SOURCE 200809L

#include <comm/comm.h>
#include <dlpack/dlpack.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static int rank_for_messages = -1;

#define CHECK(condition)                                                     \
  do {                                                                       \
    if (!(condition)) {                                                      \
      fprintf(stderr, "[rank %d] %s:%d: CHECK(%s) failed; last error: %s\n", \
              rank_for_messages, __FILE__, __LINE__, #condition,             \
              comm_last_error());                                            \
      exit(1);                                                               \
    }                                                                        \
  } while (0)

/* The call must return `expected`. */
#define EXPECT_RESULT(expected, call)                                     \
  do {                                                                    \
    comm_result_t result_ = (call);                                       \
    if (result_ != (expected)) {                                          \
      fprintf(stderr,                                                     \
              "[rank %d] %s:%d: %s returned %d (%s), expected %s; "       \
              "last error: %s\n",                                         \
              rank_for_messages, __FILE__, __LINE__, #call, (int)result_, \
              comm_result_string(result_), #expected, comm_last_error()); \
      exit(1);                                                            \
    }                                                                     \
  } while (0)

#define OK(call) EXPECT_RESULT(COMM_SUCCESS, call)

static int contains(const char* text, const char* part) {
  return strstr(text, part) != NULL;
}

/* ---- Without peers ------------------------------------------------------ */

static void test_results_and_version(void) {
  CHECK(comm_version() == COMM_VERSION_CODE);
  const char* seen[9];
  for (int code = COMM_SUCCESS; code <= COMM_INTERNAL_ERROR; ++code) {
    seen[code] = comm_result_string((comm_result_t)code);
    CHECK(seen[code] != NULL && seen[code][0] != '\0');
    for (int earlier = 0; earlier < code; ++earlier) {
      CHECK(strcmp(seen[earlier], seen[code]) != 0);
    }
  }
  CHECK(strcmp(comm_result_string((comm_result_t)99), "unknown result code") ==
        0);
}

/* The whole dump of comm_config_dump, read back through a temporary file. */
static void dump_config(char* text, size_t size) {
  FILE* file = tmpfile();
  CHECK(file != NULL);
  OK(comm_config_dump(file));
  rewind(file);
  const size_t length = fread(text, 1, size - 1, file);
  text[length] = '\0';
  fclose(file);
}

/* In a child, whose environment and cached knobs the other tests never see:
 * the dump lists the knobs with their values and sources, hides the store
 * token, and a malformed TCP knob fails group creation by name. */
static void test_config_dump(void) {
  const pid_t child = fork();
  CHECK(child >= 0);
  if (child == 0) {
    EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_config_dump(NULL));
    CHECK(unsetenv("COMM_LOG_LEVEL") == 0);
    CHECK(unsetenv("COMM_TCP_LOCAL_SNDBUF_BYTES") == 0);
    CHECK(setenv("COMM_STORE_TOKEN", "do-not-print-me", 1) == 0);
    CHECK(setenv("COMM_TCP_SPIN_US", "7", 1) == 0);
    CHECK(setenv("COMM_TCP_CHUNK_BYTES", "64Ki", 1) == 0);
    static char text[65536];
    dump_config(text, sizeof text);
    CHECK(contains(text, "COMM_TCP_SPIN_US = 7 (from the environment)"));
    CHECK(contains(text, "COMM_TCP_LOCAL_SNDBUF_BYTES = 262144 (default)"));
    CHECK(contains(text, "COMM_LOG_LEVEL = warn (default)"));
    CHECK(contains(text, "COMM_STORE_TOKEN = set (from the environment)"));
    CHECK(!contains(text, "do-not-print-me"));
    CHECK(contains(text,
                   "COMM_TCP_CHUNK_BYTES = (invalid) "
                   "COMM_TCP_CHUNK_BYTES='64Ki' is not an integer"));

    comm_store_t store = NULL;
    comm_group_t group = NULL;
    OK(comm_store_create_hash(COMM_DEFAULT_TIMEOUT, &store));
    EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                  comm_group_create(store, 0, 1, "tcp", 10000, &group));
    CHECK(contains(comm_last_error(), "COMM_TCP_CHUNK_BYTES='64Ki'"));
    OK(comm_store_free(store));
    _exit(0);
  }
  int status = 0;
  CHECK(waitpid(child, &status, 0) == child);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

static void test_bad_handles_and_enums(void) {
  int value = 0;
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_group_rank(NULL, &value));
  CHECK(contains(comm_last_error(), "comm_group_rank") &&
        contains(comm_last_error(), "NULL"));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_store_set(NULL, "k", "v", 1));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_work_wait(NULL, 0));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_store_create_hash(-1, NULL));

  comm_store_t store = NULL;
  OK(comm_store_create_hash(COMM_DEFAULT_TIMEOUT, &store));
  /* A handle of another kind is refused, not reinterpreted. */
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_group_rank((comm_group_t)(void*)store, &value));
  CHECK(contains(comm_last_error(), "not a live comm_group_t"));
  /* A group of one on the hash store, for the enum checks. */
  comm_group_t group = NULL;
  OK(comm_group_create(store, 0, 1, "tcp", 10000, &group));
  float data[4] = {1, 2, 3, 4};
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_all_reduce(data, data, 4, (comm_dtype_t)99, COMM_SUM,
                                group, COMM_CPU, NULL, NULL));
  CHECK(contains(comm_last_error(), "dtype 99"));
  EXPECT_RESULT(
      COMM_INVALID_ARGUMENT,
      comm_all_reduce(data, data, 4, COMM_FLOAT32, (comm_reduce_op_t)42, group,
                      COMM_CPU, NULL, NULL));
  CHECK(contains(comm_last_error(), "op 42"));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_all_reduce(data, data, 4, COMM_FLOAT32, COMM_BAND, group,
                                COMM_CPU, NULL, NULL));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_all_reduce(NULL, data, 4, COMM_FLOAT32, COMM_SUM, group,
                                COMM_CPU, NULL, NULL));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_all_reduce(data, data, 4, COMM_FLOAT32, COMM_SUM, group,
                                COMM_CPU, (void*)data, NULL));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_all_reduce(data, data, 4, COMM_FLOAT32, COMM_SUM, group,
                                -7, NULL, NULL));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_broadcast(data, data, 4, COMM_FLOAT32, 5, group, COMM_CPU,
                               NULL, NULL));
  CHECK(data[0] == 1 && data[3] == 4); /* nothing was touched */
  comm_group_t none = NULL;
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_group_new(group, &(int){0}, 0, &none));
  CHECK(contains(comm_last_error(), "`count` >= 1 ranks (got 0)"));
  /* A backend that does not exist, and NCCL where it is not built or host
   * memory is all there is. */
  comm_group_t other = NULL;
  comm_result_t missing =
      comm_group_create(store, 0, 1, "carrier-pigeon", 1000, &other);
  CHECK(missing == COMM_INVALID_ARGUMENT &&
        contains(comm_last_error(), "carrier-pigeon"));
  if (comm_group_create(store, 0, 1, "nccl", 1000, &other) == COMM_SUCCESS) {
    OK(comm_group_free(other)); /* built with NCCL, and a GPU is here */
  } else {
    CHECK(contains(comm_last_error(), "built without the NCCL backend") ||
          contains(comm_last_error(),
                   "needs a CUDA device, and this "
                   "process sees none"));
  }

  /* Freed handles are refused. */
  comm_work_t work = NULL;
  OK(comm_barrier(group, &work));
  OK(comm_work_wait(work, 10000));
  OK(comm_work_free(work));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_work_wait(work, 0));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_work_free(work));
  OK(comm_group_free(group));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_group_size(group, &value));
  CHECK(contains(comm_last_error(), "freed"));
  OK(comm_store_free(store));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_store_add(store, "k", 1, NULL));
}

static void test_stores(void) {
  comm_store_t server = NULL;
  comm_store_t client = NULL;
  int port = 0;
  OK(comm_store_create_tcp("127.0.0.1", 0, 10000, &server));
  OK(comm_store_port(server, &port));
  CHECK(port > 0 && port < 65536);
  OK(comm_store_connect_tcp("127.0.0.1", port, 10000, &client));

  OK(comm_store_set(server, "greeting", "hello", 5));
  char buffer[16];
  size_t size = 0;
  OK(comm_store_get(client, "greeting", buffer, sizeof buffer, &size, 1000));
  CHECK(size == 5 && memcmp(buffer, "hello", 5) == 0);
  /* Too small a buffer: nothing copied, the size reported. */
  memset(buffer, 'x', sizeof buffer);
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_store_get(client, "greeting", buffer, 2, &size, 1000));
  CHECK(size == 5 && buffer[0] == 'x');
  EXPECT_RESULT(COMM_TIMEOUT, comm_store_get(client, "absent", buffer,
                                             sizeof buffer, &size, 50));
  CHECK(contains(comm_last_error(), "absent"));

  int64_t sum = 0;
  OK(comm_store_add(client, "counter", 5, &sum));
  OK(comm_store_add(server, "counter", -2, &sum));
  CHECK(sum == 3);
  const char* keys[] = {"greeting", "counter"};
  OK(comm_store_wait(client, keys, 2, 1000));
  const char* missing_keys[] = {"greeting", "never"};
  EXPECT_RESULT(COMM_TIMEOUT, comm_store_wait(client, missing_keys, 2, 50));

  comm_store_t prefixed = NULL;
  OK(comm_store_create_prefix("job7", client, &prefixed));
  OK(comm_store_set(prefixed, "x", "1", 1));
  OK(comm_store_get(server, "job7/x", buffer, sizeof buffer, &size, 1000));
  CHECK(size == 1 && buffer[0] == '1');
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_store_port(prefixed, &port));

  int deleted = -1;
  OK(comm_store_delete(client, "greeting", &deleted));
  CHECK(deleted == 1);
  OK(comm_store_delete(client, "greeting", &deleted));
  CHECK(deleted == 0);

  OK(comm_store_free(prefixed));
  OK(comm_store_free(client));
  OK(comm_store_free(server));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_store_connect_tcp("127.0.0.1", 0, 10, &client));
}

/* ---- Across ranks ------------------------------------------------------- */

/* What rank r contributes at position i: distinct per rank and position. */
static float value_of(int r, int i) { return (float)(100 * r + i); }

/* Two threads free one handle at once: one frees it, the other is told it
 * is no longer live; nothing is freed twice. */
struct free_race {
  comm_store_t store;
  pthread_barrier_t* start;
  comm_result_t result;
};

static void* free_store_at_once(void* argument) {
  struct free_race* race = argument;
  pthread_barrier_wait(race->start);
  race->result = comm_store_free(race->store);
  return NULL;
}

static void test_concurrent_free(void) {
  for (int round = 0; round < 200; ++round) {
    comm_store_t store = NULL;
    OK(comm_store_create_hash(1000, &store));
    pthread_barrier_t start;
    CHECK(pthread_barrier_init(&start, NULL, 2) == 0);
    struct free_race races[2] = {{store, &start, COMM_INTERNAL_ERROR},
                                 {store, &start, COMM_INTERNAL_ERROR}};
    pthread_t threads[2];
    for (int t = 0; t < 2; ++t)
      CHECK(pthread_create(&threads[t], NULL, free_store_at_once, &races[t]) ==
            0);
    for (int t = 0; t < 2; ++t) CHECK(pthread_join(threads[t], NULL) == 0);
    pthread_barrier_destroy(&start);
    const int freed =
        (races[0].result == COMM_SUCCESS) + (races[1].result == COMM_SUCCESS);
    const int refused = (races[0].result == COMM_INVALID_ARGUMENT) +
                        (races[1].result == COMM_INVALID_ARGUMENT);
    CHECK(freed == 1 && refused == 1);
  }
}

static void test_collectives(comm_group_t group, int rank, int size) {
  enum { kCount = 7 };
  float send[kCount];
  float recv[kCount * 8];
  for (int i = 0; i < kCount; ++i) send[i] = value_of(rank, i);

  /* all_reduce, out of place and in place. */
  OK(comm_all_reduce(send, recv, kCount, COMM_FLOAT32, COMM_SUM, group,
                     COMM_CPU, NULL, NULL));
  for (int i = 0; i < kCount; ++i) {
    float expected = 0;
    for (int r = 0; r < size; ++r) expected += value_of(r, i);
    CHECK(recv[i] == expected);
    CHECK(send[i] == value_of(rank, i)); /* the input is left alone */
  }
  int32_t ints[3] = {rank, -rank, 7};
  OK(comm_all_reduce(ints, ints, 3, COMM_INT32, COMM_MAX, group, COMM_CPU, NULL,
                     NULL));
  CHECK(ints[0] == size - 1 && ints[1] == 0 && ints[2] == 7);

  /* broadcast from the last rank; sendbuf may be NULL off the root. */
  const int root = size - 1;
  memset(recv, 0, sizeof recv);
  OK(comm_broadcast(rank == root ? send : NULL, recv, kCount, COMM_FLOAT32,
                    root, group, COMM_CPU, NULL, NULL));
  for (int i = 0; i < kCount; ++i) CHECK(recv[i] == value_of(root, i));

  /* reduce to rank 0; recvbuf may be NULL elsewhere. */
  memset(recv, 0, sizeof recv);
  OK(comm_reduce(send, rank == 0 ? recv : NULL, kCount, COMM_FLOAT32, COMM_PROD,
                 0, group, COMM_CPU, NULL, NULL));
  if (rank == 0) {
    for (int i = 0; i < kCount; ++i) {
      float expected = 1;
      for (int r = 0; r < size; ++r) expected *= value_of(r, i);
      CHECK(recv[i] == expected);
    }
  }
  for (int i = 0; i < kCount; ++i) CHECK(send[i] == value_of(rank, i));

  /* As in NCCL and MPI, only the root's recvbuf changes: the others'
   * recvbuf and every sendbuf, in place or not, keep what they held. */
  for (int i = 0; i < kCount; ++i) recv[i] = -1.0f;
  OK(comm_reduce(send, recv, kCount, COMM_FLOAT32, COMM_SUM, 0, group, COMM_CPU,
                 NULL, NULL));
  for (int i = 0; i < kCount; ++i) {
    float sum = 0;
    for (int r = 0; r < size; ++r) sum += value_of(r, i);
    CHECK(recv[i] == (rank == 0 ? sum : -1.0f));
    CHECK(send[i] == value_of(rank, i));
  }
  for (int i = 0; i < kCount; ++i) recv[i] = value_of(rank, i);
  OK(comm_reduce(recv, recv, kCount, COMM_FLOAT32, COMM_MAX, 0, group, COMM_CPU,
                 NULL, NULL));
  for (int i = 0; i < kCount; ++i) {
    float max = value_of(0, i);
    for (int r = 1; r < size; ++r) {
      if (value_of(r, i) > max) max = value_of(r, i);
    }
    CHECK(recv[i] == (rank == 0 ? max : value_of(rank, i)));
  }

  /* all_gather, out of place and in place (sendbuf is this rank's block). */
  OK(comm_all_gather(send, recv, kCount, COMM_FLOAT32, group, COMM_CPU, NULL,
                     NULL));
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < kCount; ++i)
      CHECK(recv[r * kCount + i] == value_of(r, i));
  }
  memset(recv, 0, sizeof recv);
  memcpy(recv + rank * kCount, send, sizeof send);
  OK(comm_all_gather(recv + rank * kCount, recv, kCount, COMM_FLOAT32, group,
                     COMM_CPU, NULL, NULL));
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < kCount; ++i)
      CHECK(recv[r * kCount + i] == value_of(r, i));
  }

  /* reduce_scatter: block b of every rank's input, summed, lands on rank b. */
  float blocks[kCount * 8];
  for (int b = 0; b < size; ++b) {
    for (int i = 0; i < kCount; ++i)
      blocks[b * kCount + i] = value_of(rank, b + i);
  }
  OK(comm_reduce_scatter(blocks, recv, kCount, COMM_FLOAT32, COMM_SUM, group,
                         COMM_CPU, NULL, NULL));
  for (int i = 0; i < kCount; ++i) {
    float expected = 0;
    for (int r = 0; r < size; ++r) expected += value_of(r, rank + i);
    CHECK(recv[i] == expected);
  }

  /* In place, as NCCL allows: recvbuf is this rank's block of sendbuf. */
  float in_place[kCount * 8];
  memcpy(in_place, blocks, sizeof blocks);
  OK(comm_reduce_scatter(in_place, in_place + rank * kCount, kCount,
                         COMM_FLOAT32, COMM_SUM, group, COMM_CPU, NULL, NULL));
  for (int i = 0; i < kCount; ++i)
    CHECK(in_place[rank * kCount + i] == recv[i]);

  /* gather to the root, scatter from it. */
  memset(recv, 0, sizeof recv);
  OK(comm_gather(send, rank == root ? recv : NULL, kCount, COMM_FLOAT32, root,
                 group, COMM_CPU, NULL, NULL));
  if (rank == root) {
    for (int r = 0; r < size; ++r) {
      for (int i = 0; i < kCount; ++i)
        CHECK(recv[r * kCount + i] == value_of(r, i));
    }
  }
  float piece[kCount];
  OK(comm_scatter(rank == root ? blocks : NULL, piece, kCount, COMM_FLOAT32,
                  root, group, COMM_CPU, NULL, NULL));
  for (int i = 0; i < kCount; ++i) CHECK(piece[i] == value_of(root, rank + i));

  /* all_to_all: block j of rank i goes to block i of rank j. */
  OK(comm_all_to_all(blocks, recv, kCount, COMM_FLOAT32, group, COMM_CPU, NULL,
                     NULL));
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < kCount; ++i)
      CHECK(recv[r * kCount + i] == value_of(r, rank + i));
  }

  /* all_to_allv: rank i sends i + j + 1 elements to rank j, all equal to
   * 10 * i + j. */
  size_t sendcounts[8], recvcounts[8];
  int64_t vsend[64], vrecv[64];
  size_t at = 0;
  for (int j = 0; j < size; ++j) {
    sendcounts[j] = (size_t)(rank + j + 1);
    recvcounts[j] = (size_t)(j + rank + 1);
    for (size_t k = 0; k < sendcounts[j]; ++k) vsend[at++] = 10 * rank + j;
  }
  OK(comm_all_to_allv(vsend, sendcounts, vrecv, recvcounts, COMM_INT64, group,
                      COMM_CPU, NULL, NULL));
  at = 0;
  for (int i = 0; i < size; ++i) {
    for (size_t k = 0; k < recvcounts[i]; ++k)
      CHECK(vrecv[at++] == 10 * i + rank);
  }

  OK(comm_barrier(group, NULL));
}

static void test_point_to_point(comm_group_t group, int rank, int size) {
  if (size < 2) return; /* a rank does not send to itself */
  /* A ring: everyone sends to the right with tag 3, from any source. */
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  double out[5], in[5];
  for (int i = 0; i < 5; ++i) out[i] = rank + i / 10.0;
  comm_work_t sent = NULL, received = NULL;
  OK(comm_recv(in, 5, COMM_FLOAT64, COMM_ANY_SOURCE, 3, group, COMM_CPU, NULL,
               NULL, &received));
  OK(comm_send(out, 5, COMM_FLOAT64, right, 3, group, COMM_CPU, NULL, &sent));
  OK(comm_work_wait(received, 10000));
  int source = -2;
  OK(comm_work_source(received, &source));
  CHECK(source == left);
  for (int i = 0; i < 5; ++i) CHECK(in[i] == left + i / 10.0);
  OK(comm_work_wait(sent, 10000));
  OK(comm_work_free(sent));
  OK(comm_work_free(received));

  /* Blocking forms with a named source. */
  if (rank == 0) {
    OK(comm_send(out, 5, COMM_FLOAT64, 1, 9, group, COMM_CPU, NULL, NULL));
  } else if (rank == 1) {
    source = -2;
    OK(comm_recv(in, 5, COMM_FLOAT64, 0, 9, group, COMM_CPU, NULL, &source,
                 NULL));
    CHECK(source == 0 && in[4] == 0.4);
  }
}

static void test_async(comm_group_t group, int rank, int size) {
  /* Several operations in flight, completed in the order issued. */
  enum { kInFlight = 8 };
  int64_t data[kInFlight][16];
  comm_work_t works[kInFlight];
  for (int w = 0; w < kInFlight; ++w) {
    for (int i = 0; i < 16; ++i) data[w][i] = w * rank + i;
    OK(comm_all_reduce(data[w], data[w], 16, COMM_INT64, COMM_SUM, group,
                       COMM_CPU, NULL, &works[w]));
  }
  for (int w = kInFlight - 1; w >= 0; --w) {
    OK(comm_work_wait(works[w], 10000));
    int done = 0;
    OK(comm_work_test(works[w], &done));
    CHECK(done == 1);
    OK(comm_work_free(works[w]));
    for (int i = 0; i < 16; ++i) {
      CHECK(data[w][i] ==
            (int64_t)w * size * (size - 1) / 2 + (int64_t)i * size);
    }
  }
  if (size < 2) return;
  /* A receive nobody has sent to yet: the bounded wait times out, test says
   * not done, and the handle can be freed while the receive is pending. */
  /* Static: the receive completes after this function returns, and its
   * buffer must outlive it even though the handle is freed first. */
  static int32_t late = 0;
  comm_work_t pending = NULL;
  OK(comm_recv(&late, 1, COMM_INT32, (rank + 1) % size, 77, group, COMM_CPU,
               NULL, NULL, &pending));
  EXPECT_RESULT(COMM_TIMEOUT, comm_work_wait(pending, 20));
  CHECK(contains(comm_last_error(), "recv"));
  int done = 1;
  OK(comm_work_test(pending, &done));
  CHECK(done == 0);
  OK(comm_barrier(group, NULL)); /* every rank saw its receive pending */
  OK(comm_work_free(pending));
  int32_t wake = 1;
  OK(comm_send(&wake, 1, COMM_INT32, (rank + size - 1) % size, 77, group,
               COMM_CPU, NULL, NULL));
  OK(comm_barrier(group, NULL));
}

static DLManagedTensor dl_of(void* data, int64_t* shape, int ndim, uint8_t code,
                             uint8_t bits) {
  DLManagedTensor managed;
  memset(&managed, 0, sizeof managed);
  managed.dl_tensor.data = data;
  managed.dl_tensor.device.device_type = kDLCPU;
  managed.dl_tensor.ndim = ndim;
  managed.dl_tensor.dtype.code = code;
  managed.dl_tensor.dtype.bits = bits;
  managed.dl_tensor.dtype.lanes = 1;
  managed.dl_tensor.shape = shape;
  return managed;
}

static void test_dlpack(comm_group_t group, int rank, int size) {
  float matrix[2][3];
  for (int i = 0; i < 6; ++i) matrix[i / 3][i % 3] = value_of(rank, i);
  int64_t shape[2] = {2, 3};
  DLManagedTensor tensor = dl_of(matrix, shape, 2, kDLFloat, 32);
  OK(comm_all_reduce_dlpack(&tensor, COMM_MAX, group, NULL, NULL));
  for (int i = 0; i < 6; ++i)
    CHECK(matrix[i / 3][i % 3] == value_of(size - 1, i));

  /* all_gather into [size * 2, 3]. */
  float gathered[8 * 2][3];
  int64_t gathered_shape[2] = {2 * size, 3};
  for (int i = 0; i < 6; ++i) matrix[i / 3][i % 3] = value_of(rank, i);
  DLManagedTensor input = dl_of(matrix, shape, 2, kDLFloat, 32);
  DLManagedTensor output = dl_of(gathered, gathered_shape, 2, kDLFloat, 32);
  comm_work_t work = NULL;
  OK(comm_all_gather_dlpack(&output, &input, group, NULL, &work));
  OK(comm_work_wait(work, COMM_DEFAULT_TIMEOUT));
  OK(comm_work_free(work));
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < 6; ++i)
      CHECK(gathered[r * 2 + i / 3][i % 3] == value_of(r, i));
  }

  /* reduce_scatter back: each rank gets size times the sum of block rank. */
  OK(comm_reduce_scatter_dlpack(&input, &output, COMM_SUM, group, NULL, NULL));
  for (int i = 0; i < 6; ++i) {
    CHECK(matrix[i / 3][i % 3] == (float)size * value_of(rank, i));
  }

  /* broadcast, reduce, gather, scatter, all_to_all and send/recv. */
  int32_t word[2] = {rank, rank};
  int64_t word_shape[1] = {2};
  DLManagedTensor w = dl_of(word, word_shape, 1, kDLInt, 32);
  OK(comm_broadcast_dlpack(&w, 1 % size, group, NULL, NULL));
  CHECK(word[0] == 1 % size && word[1] == 1 % size);
  word[0] = rank + 1;
  word[1] = 1;
  OK(comm_reduce_dlpack(&w, COMM_SUM, 0, group, NULL, NULL));
  if (rank == 0) CHECK(word[0] == size * (size + 1) / 2 && word[1] == size);

  int32_t all[16];
  int64_t all_shape[1] = {2 * size};
  DLManagedTensor many = dl_of(all, all_shape, 1, kDLInt, 32);
  word[0] = rank;
  word[1] = -rank;
  OK(comm_gather_dlpack(rank == 0 ? &many : NULL, &w, 0, group, NULL, NULL));
  if (rank == 0) {
    for (int r = 0; r < size; ++r)
      CHECK(all[2 * r] == r && all[2 * r + 1] == -r);
    for (int r = 0; r < size; ++r) all[2 * r] = all[2 * r + 1] = 5 * r;
  }
  OK(comm_scatter_dlpack(&w, rank == 0 ? &many : NULL, 0, group, NULL, NULL));
  CHECK(word[0] == 5 * rank && word[1] == 5 * rank);

  int32_t exchanged[16];
  for (int j = 0; j < 2 * size; ++j) all[j] = 1000 * rank + j / 2;
  DLManagedTensor out_many = dl_of(exchanged, all_shape, 1, kDLInt, 32);
  OK(comm_all_to_all_dlpack(&out_many, &many, group, NULL, NULL));
  for (int r = 0; r < size; ++r) CHECK(exchanged[2 * r] == 1000 * r + rank);

  if (size >= 2 && rank < 2) {
    word[0] = 42 + rank;
    if (rank == 0) {
      OK(comm_send_dlpack(&w, 1, 5, group, NULL, NULL));
    } else {
      int source = -2;
      OK(comm_recv_dlpack(&w, COMM_ANY_SOURCE, 5, group, NULL, &source, NULL));
      CHECK(source == 0 && word[0] == 42);
    }
  }

  /* Strided tensors are refused, and the data stays as it was. */
  int64_t strides[2] = {1, 2};
  DLManagedTensor strided = dl_of(matrix, shape, 2, kDLFloat, 32);
  strided.dl_tensor.strides = strides;
  const float before = matrix[0][1];
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_all_reduce_dlpack(&strided, COMM_SUM, group, NULL, NULL));
  CHECK(contains(comm_last_error(), "contiguous"));
  CHECK(matrix[0][1] == before);
  DLManagedTensor complex_valued = dl_of(matrix, shape, 2, kDLComplex, 64);
  EXPECT_RESULT(
      COMM_INVALID_ARGUMENT,
      comm_all_reduce_dlpack(&complex_valued, COMM_SUM, group, NULL, NULL));
  OK(comm_barrier(group, NULL));
}

/* Counts whose products or sums do not fit a size_t are refused before
 * anything moves, on every rank alike, and the group stays usable. */
static void test_counts_that_overflow(comm_group_t group, int size) {
  int64_t send[8] = {0}, recv[8] = {0};
  size_t counts[8];
  size_t ones[8];
  for (int r = 0; r < size; ++r) {
    counts[r] = r == 0 ? SIZE_MAX : 2; /* wraps to 1 + 2 (size - 2) */
    ones[r] = 1;
  }
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_all_to_allv(send, counts, recv, ones, COMM_INT64, group,
                                 COMM_CPU, NULL, NULL));
  CHECK(contains(comm_last_error(), size > 1 ? "sendcounts" : "too large"));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_all_to_allv(send, ones, recv, counts, COMM_INT64, group,
                                 COMM_CPU, NULL, NULL));
  if (size > 1) {
    const size_t wraps = SIZE_MAX / (size_t)size + 1;
    EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                  comm_all_gather(send, recv, wraps, COMM_INT64, group,
                                  COMM_CPU, NULL, NULL));
    CHECK(contains(comm_last_error(), "too large") ||
          contains(comm_last_error(), "overflows"));
    EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                  comm_all_to_all(send, recv, wraps, COMM_INT64, group,
                                  COMM_CPU, NULL, NULL));
    EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                  comm_reduce_scatter(send, recv, wraps, COMM_INT64, COMM_SUM,
                                      group, COMM_CPU, NULL, NULL));
  }
  for (int r = 0; r < 8; ++r) CHECK(recv[r] == 0);
  int64_t one = 1;
  OK(comm_all_reduce(&one, &one, 1, COMM_INT64, COMM_SUM, group, COMM_CPU, NULL,
                     NULL));
  CHECK(one == size);
}

/* A device that does not exist is an argument error on every rank before
 * anything moves; it does not fail the group. */
static void test_device_that_does_not_exist(comm_group_t group, int size) {
  float data[4] = {1, 2, 3, 4};
  EXPECT_RESULT(COMM_INVALID_ARGUMENT,
                comm_all_reduce(data, data, 4, COMM_FLOAT32, COMM_SUM, group,
                                99, NULL, NULL));
  CHECK(contains(comm_last_error(), "cuda:99"));
  CHECK(data[0] == 1 && data[3] == 4);
  OK(comm_all_reduce(data, data, 4, COMM_FLOAT32, COMM_SUM, group, COMM_CPU,
                     NULL, NULL));
  CHECK(data[0] == (float)size && data[3] == 4.0f * (float)size);
}

static void test_subgroup(comm_group_t group, int rank, int size) {
  /* The even ranks. */
  int evens[8], count = 0;
  for (int r = 0; r < size; r += 2) evens[count++] = r;
  comm_group_t sub = NULL;
  OK(comm_group_new(group, evens, count, &sub));
  if (rank % 2 != 0) {
    CHECK(sub == NULL);
    return;
  }
  int sub_rank = -1, sub_size = -1;
  OK(comm_group_rank(sub, &sub_rank));
  OK(comm_group_size(sub, &sub_size));
  CHECK(sub_rank == rank / 2 && sub_size == count);
  int64_t one = 1;
  OK(comm_all_reduce(&one, &one, 1, COMM_INT64, COMM_SUM, sub, COMM_CPU, NULL,
                     NULL));
  CHECK(one == count);
  OK(comm_group_free(sub));
}

/* Collectives on shared host memory (comm_mem_alloc), large enough that
 * the ranks read each other's buffers through mappings; a non-root's
 * buffers keep what they held after a reduce. */
static void test_shared_memory(comm_group_t group, int rank, int size) {
  enum { kCount = 20000 }; /* 80 000 bytes, above the shared threshold */
  float* send = NULL;
  float* recv = NULL;
  OK(comm_mem_alloc((void**)&send, kCount * sizeof(float)));
  OK(comm_mem_alloc((void**)&recv, (size_t)size * kCount * sizeof(float)));
  CHECK(send != NULL && recv != NULL && recv[0] == 0.0f);
  for (int i = 0; i < kCount; ++i) send[i] = value_of(rank, i % 97);

  OK(comm_all_reduce(send, recv, kCount, COMM_FLOAT32, COMM_SUM, group,
                     COMM_CPU, NULL, NULL));
  for (int i = 0; i < kCount; ++i) {
    float expected = 0;
    for (int r = 0; r < size; ++r) expected += value_of(r, i % 97);
    CHECK(recv[i] == expected);
  }
  for (int i = 0; i < kCount; ++i) recv[i] = -1.0f;
  OK(comm_reduce(send, recv, kCount, COMM_FLOAT32, COMM_MAX, 0, group, COMM_CPU,
                 NULL, NULL));
  for (int i = 0; i < kCount; ++i) {
    CHECK(recv[i] == (rank == 0 ? value_of(size - 1, i % 97) : -1.0f));
    CHECK(send[i] == value_of(rank, i % 97));
  }
  OK(comm_all_gather(send, recv, kCount, COMM_FLOAT32, group, COMM_CPU, NULL,
                     NULL));
  for (int r = 0; r < size; ++r) {
    for (int i = 0; i < kCount; ++i) {
      CHECK(recv[r * kCount + i] == value_of(r, i % 97));
    }
  }
  OK(comm_mem_free(send));
  OK(comm_mem_free(recv));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_mem_free(recv));
  CHECK(contains(comm_last_error(), "comm_mem_alloc") ||
        contains(comm_last_error(), "allocate_shared_host"));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_mem_free(NULL));
  EXPECT_RESULT(COMM_INVALID_ARGUMENT, comm_mem_alloc(NULL, 8));
}

static void test_mismatch(comm_group_t group, int rank) {
  /* Rank 0 reduces int32, the others float32: everyone is told. */
  int32_t data[4] = {0, 0, 0, 0};
  comm_result_t result =
      comm_all_reduce(data, data, 4, rank == 0 ? COMM_INT32 : COMM_FLOAT32,
                      COMM_SUM, group, COMM_CPU, NULL, NULL);
  if (result != COMM_MISMATCH) {
    fprintf(stderr, "[rank %d] mismatch: got %s: %s\n", rank,
            comm_result_string(result), comm_last_error());
    exit(1);
  }
  CHECK(contains(comm_last_error(), "int32") &&
        contains(comm_last_error(), "float32"));
}

static int run_rank(const char* store_path, int rank, int size) {
  rank_for_messages = rank;
  alarm(120);
  /* The default group through comm_init and a file:// URL. */
  char url[512];
  snprintf(url, sizeof url, "file://%s?rank=%d&world_size=%d", store_path, rank,
           size);
  comm_group_t group = NULL;
  OK(comm_init("tcp", url, -1, -1, 30000, &group));
  int got_rank = -1, got_size = -1;
  OK(comm_group_rank(group, &got_rank));
  OK(comm_group_size(group, &got_size));
  CHECK(got_rank == rank && got_size == size);

  test_collectives(group, rank, size);
  test_point_to_point(group, rank, size);
  test_async(group, rank, size);
  test_dlpack(group, rank, size);
  test_subgroup(group, rank, size);
  test_counts_that_overflow(group, size);
  test_device_that_does_not_exist(group, size);
  test_shared_memory(group, rank, size);
  OK(comm_barrier(group, NULL));
  if (size > 1) test_mismatch(group, rank);
  OK(comm_group_free(group));
  return 0;
}

int main(int argc, char** argv) {
  const int size = argc > 1 ? atoi(argv[1]) : 3;
  if (size < 1 || size > 8) {
    fprintf(stderr, "usage: c_api_test [WORLD_SIZE 1-8]\n");
    return 2;
  }
  alarm(180);
  char store_path[] = "/tmp/comm_c_api_test_XXXXXX";
  const int fd = mkstemp(store_path);
  CHECK(fd >= 0);
  close(fd);
  unlink(store_path);

  /* The ranks are forked first, while this process has no threads yet. */
  pid_t children[8];
  for (int r = 0; r < size; ++r) {
    children[r] = fork();
    CHECK(children[r] >= 0);
    if (children[r] == 0) _exit(run_rank(store_path, r, size));
  }

  test_results_and_version();
  test_config_dump();
  test_bad_handles_and_enums();
  test_stores();
  test_concurrent_free();

  int failed = 0;
  for (int r = 0; r < size; ++r) {
    int status = 0;
    CHECK(waitpid(children[r], &status, 0) == children[r]);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d failed (%s %d)\n", r,
              WIFEXITED(status) ? "exit status" : "signal",
              WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
      failed = 1;
    }
  }
  unlink(store_path);
  if (!failed) printf("c_api_test: %d ranks passed\n", size);
  return failed;
}
