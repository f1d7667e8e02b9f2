/*
 * comm.h: the C API of libcomm, for frameworks and languages that link C.
 *
 * The model is NCCL's: opaque handles, one result code per call, buffers
 * described by (pointer, count, dtype). Every function returns a
 * comm_result_t; COMM_SUCCESS is 0 and every failure is non-zero, and on a
 * failure comm_last_error() holds a message that says what was wrong and
 * what to do. No C++ exception ever crosses this boundary.
 *
 * Handles. comm_store_t, comm_group_t and comm_work_t are created by the
 * comm_*_create and comm_init calls and released by their comm_*_free calls.
 * Passing NULL where a handle is expected, a handle of another kind, or a
 * handle that was already freed returns COMM_INVALID_ARGUMENT: libcomm keeps
 * a table of live handles and checks every handle against it. (A freed
 * address that a later create happens to reuse cannot be told apart.)
 *
 * Timeouts are in milliseconds. COMM_DEFAULT_TIMEOUT (-1) means the default:
 * the store's for store calls and the group's for collectives (set by
 * comm_init or comm_group_create, 300 s unless given). Every blocking call is
 * bounded by one; a collective that a dead or stuck peer cannot finish
 * returns COMM_PEER_ERROR or COMM_TIMEOUT naming that rank.
 *
 * Threads. Calls on different handles may run concurrently. As in NCCL and
 * MPI, every rank of a group must issue the group's collectives in the same
 * order; issuing them from several threads at once leaves that order to
 * chance.
 */
#ifndef COMM_COMM_H_
#define COMM_COMM_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <libcomm/version.h>

#if defined(COMM_BUILDING_LIBRARY)
#define COMM_C_API __attribute__((visibility("default")))
#else
#define COMM_C_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* From <dlpack/dlpack.h>; only pointers to it appear here. */
struct DLManagedTensor;

/* The result of every call. The values are part of the ABI. */
typedef enum {
  COMM_SUCCESS = 0,
  /* A bad argument: a NULL or freed handle, an enum value out of range, a
   * count that does not fit, a dtype the op does not take. */
  COMM_INVALID_ARGUMENT = 1,
  /* The call did not finish within its timeout. */
  COMM_TIMEOUT = 2,
  /* A peer rank died, closed its connection or broke the protocol. */
  COMM_PEER_ERROR = 3,
  /* Ranks called different collectives, or one with different arguments. */
  COMM_MISMATCH = 4,
  /* NCCL, CUDA or a backend's own state failed. */
  COMM_BACKEND_ERROR = 5,
  /* A system call failed (comm_last_error() names it and errno's text). */
  COMM_SYSTEM_ERROR = 6,
  /* Well formed, but not in this build or backend: CUDA or NCCL not built
   * in, a bitwise reduction on NCCL. */
  COMM_UNSUPPORTED = 7,
  /* A bug in libcomm; please report it with comm_last_error()'s text. */
  COMM_INTERNAL_ERROR = 8,
} comm_result_t;

/* Element types. The values are part of the ABI. */
typedef enum {
  COMM_FLOAT16 = 0,
  COMM_BFLOAT16 = 1,
  COMM_FLOAT32 = 2,
  COMM_FLOAT64 = 3,
  COMM_INT8 = 4,
  COMM_UINT8 = 5,
  COMM_INT32 = 6,
  COMM_INT64 = 7,
  COMM_BOOL = 8,
} comm_dtype_t;

/* Reductions. COMM_AVG divides the sum by the number of ranks (float16
 * divides each rank's contribution before the sum, so that an average that
 * fits never overflows); the bitwise ones take integer and bool buffers
 * only. The values are part of the ABI. */
typedef enum {
  COMM_SUM = 0,
  COMM_AVG = 1,
  COMM_PROD = 2,
  COMM_MIN = 3,
  COMM_MAX = 4,
  COMM_BAND = 5,
  COMM_BOR = 6,
  COMM_BXOR = 7,
} comm_reduce_op_t;

typedef struct comm_store* comm_store_t;
typedef struct comm_group* comm_group_t;
typedef struct comm_work* comm_work_t;

/* A timeout argument that means "the default" (see the top of this file). */
#define COMM_DEFAULT_TIMEOUT (-1)
/* The device argument of collectives on host memory. A value >= 0 is the
 * ordinal of the CUDA device that holds the buffers. */
#define COMM_CPU (-1)
/* The source of a receive that takes a message from whichever rank sends
 * first; comm_work_source or the source argument of comm_recv tells which. */
#define COMM_ANY_SOURCE (-1)

/* ---- Errors and version ------------------------------------------------ */

/* A short, static description of `result` ("timeout"); never NULL. */
COMM_C_API const char* comm_result_string(comm_result_t result);

/* The full message of the last call on this thread that failed; "" when none
 * has. The text stays valid until the next failing call on this thread. */
COMM_C_API const char* comm_last_error(void);

/* COMM_VERSION_CODE of the library that is linked, which may be newer than
 * the header a program was compiled with. */
COMM_C_API int comm_version(void);

/* ---- Configuration ------------------------------------------------------ */

/* Writes every COMM_* environment variable libcomm reads to `stream`, as
 * text for people: per variable a line "NAME = value (source)", then its
 * accepted values and default, then its meaning, each indented. The source
 * says whether the value came from the environment or is the default; a
 * secret (COMM_STORE_TOKEN) shows only "set" or "unset", and a malformed
 * value shows the error that using it will raise. Reading the variables here
 * fixes their values for the life of the process, as any first use does.
 * Returns COMM_INVALID_ARGUMENT for a NULL stream and COMM_SYSTEM_ERROR when
 * the stream refuses the text. */
COMM_C_API comm_result_t comm_config_dump(FILE* stream);

/* ---- Stores: the key-value store ranks meet through -------------------- */

/* Hosts a TCPStore server on host:port (port 0 picks a free one; see
 * comm_store_port) and connects to it. */
COMM_C_API comm_result_t comm_store_create_tcp(const char* host, int port,
                                               int64_t timeout_ms,
                                               comm_store_t* store);
/* Connects to the TCPStore server at host:port, retrying until the timeout
 * so that ranks may start in any order. */
COMM_C_API comm_result_t comm_store_connect_tcp(const char* host, int port,
                                                int64_t timeout_ms,
                                                comm_store_t* store);
/* Opens (creating it if needed) the FileStore at `path`. */
COMM_C_API comm_result_t comm_store_create_file(const char* path,
                                                int64_t timeout_ms,
                                                comm_store_t* store);
/* An in-process store, for ranks that are threads of one process. */
COMM_C_API comm_result_t comm_store_create_hash(int64_t timeout_ms,
                                                comm_store_t* store);
/* A view of `base` that puts `prefix` before every key. The new store keeps
 * `base` alive; freeing either handle does not affect the other. */
COMM_C_API comm_result_t comm_store_create_prefix(const char* prefix,
                                                  comm_store_t base,
                                                  comm_store_t* store);
/* The port of a TCP store (the one picked when it was created with port 0).
 * COMM_INVALID_ARGUMENT for other stores. */
COMM_C_API comm_result_t comm_store_port(comm_store_t store, int* port);

/* Sets `key` to the `size` bytes at `value` (value may be NULL when size is
 * 0), waking every waiter on it. */
COMM_C_API comm_result_t comm_store_set(comm_store_t store, const char* key,
                                        const void* value, size_t size);
/* Waits until `key` is set, then copies its value into `buffer` and sets
 * *size to its length. When the value is longer than `capacity` nothing is
 * copied, *size still says how long it is, and the result is
 * COMM_INVALID_ARGUMENT: call again with a larger buffer. */
COMM_C_API comm_result_t comm_store_get(comm_store_t store, const char* key,
                                        void* buffer, size_t capacity,
                                        size_t* size, int64_t timeout_ms);
/* Adds `delta` to the integer under `key` (missing counts as 0) atomically;
 * *value, when not NULL, receives the sum. */
COMM_C_API comm_result_t comm_store_add(comm_store_t store, const char* key,
                                        int64_t delta, int64_t* value);
/* Waits until each of the `count` keys is set. */
COMM_C_API comm_result_t comm_store_wait(comm_store_t store,
                                         const char* const* keys, size_t count,
                                         int64_t timeout_ms);
/* Removes `key`; *deleted, when not NULL, says whether it was there. */
COMM_C_API comm_result_t comm_store_delete(comm_store_t store, const char* key,
                                           int* deleted);
/* Releases the handle. A TCP store that hosts the server stops it. Groups
 * created on the store keep what they need alive. */
COMM_C_API comm_result_t comm_store_free(comm_store_t store);

/* ---- Groups ------------------------------------------------------------ */

/* Rendezvous and the default group of all ranks, as torch.distributed's
 * init_process_group: `backend` is "tcp", "nccl" or a device map such as
 * "cpu:tcp,cuda:nccl"; `init_method` is "env://" (MASTER_ADDR, MASTER_PORT,
 * RANK, WORLD_SIZE; NULL means it), "tcp://HOST:PORT" or "file:///PATH".
 * `rank` and `world_size` override the URL and the environment when >= 0.
 * `timeout_ms` bounds the set-up and becomes the group's default timeout. */
COMM_C_API comm_result_t comm_init(const char* backend, const char* init_method,
                                   int rank, int world_size, int64_t timeout_ms,
                                   comm_group_t* group);
/* A group of `size` ranks on a store the caller already has. Every rank
 * calls it at about the same time with the same backend. */
COMM_C_API comm_result_t comm_group_create(comm_store_t store, int rank,
                                           int size, const char* backend,
                                           int64_t timeout_ms,
                                           comm_group_t* group);
COMM_C_API comm_result_t comm_group_rank(comm_group_t group, int* rank);
COMM_C_API comm_result_t comm_group_size(comm_group_t group, int* size);
/* A subgroup of the `count` (at least 1) ranks listed (numbered in
 * `group`). Every rank of `group` calls it, in the same order as its other
 * comm_group_new calls. A rank outside the list gets *subgroup = NULL and
 * COMM_SUCCESS. */
COMM_C_API comm_result_t comm_group_new(comm_group_t group, const int* ranks,
                                        int count, comm_group_t* subgroup);
/* Shuts the group down (pending operations fail with an error saying so,
 * connections close) and releases the handle. Work handles of the group
 * stay valid until they are freed. */
COMM_C_API comm_result_t comm_group_free(comm_group_t group);

/* ---- Shared host memory ------------------------------------------------- *
 *
 * Host memory that the other ranks of this host may map, as NCCL's
 * ncclMemAlloc gives memory its peers can register. A collective whose
 * ranks are all on one host, and whose every rank passes buffers from here
 * (device COMM_CPU), reads the peers' buffers through mappings with a
 * plain copy, from COMM_SHM_DIRECT_SHARED_THRESHOLD_BYTES on: far faster
 * than through the rings from 64 KiB up. Every rank must pass such buffers
 * or none: a rank that passes ordinary memory where its peers pass shared
 * memory fails the call with COMM_MISMATCH. Each block holds a descriptor
 * of this process until it is freed.
 */

/* Allocates `size` bytes (whole pages; one for 0) of zeroed shared host
 * memory into *ptr. COMM_INVALID_ARGUMENT for a NULL ptr, and
 * COMM_SYSTEM_ERROR when the kernel refuses the memory or a descriptor. */
COMM_C_API comm_result_t comm_mem_alloc(void** ptr, size_t size);
/* Frees what comm_mem_alloc gave; COMM_INVALID_ARGUMENT, freeing nothing,
 * for any other pointer (NULL included) or one freed already. The buffer
 * must not be in use by a collective. */
COMM_C_API comm_result_t comm_mem_free(void* ptr);

/* ---- Collectives on buffers -------------------------------------------- *
 *
 * Buffers are contiguous arrays of `dtype` on the host (device COMM_CPU) or
 * on CUDA device `device`. `stream` is the CUDA stream (a cudaStream_t) the
 * operation is ordered after, and, for the NCCL backend, the stream that
 * waits for it; NULL means the current one. It must be NULL for COMM_CPU.
 *
 * `work` chooses between the blocking and the asynchronous form. NULL: the
 * call returns when the operation is done with the buffers (for NCCL, when
 * `stream` is ordered after it). Not NULL: the call returns at once with a
 * handle in *work (see comm_work_wait); the buffers must stay valid and
 * untouched until the work completes. Errors in the arguments are returned
 * by the call itself either way.
 *
 * sendbuf may equal recvbuf wherever both have the same size (in place), as
 * in NCCL. Counts are in elements.
 */

/* Every rank ends with the reduction of every rank's sendbuf in recvbuf. */
COMM_C_API comm_result_t comm_all_reduce(const void* sendbuf, void* recvbuf,
                                         size_t count, comm_dtype_t dtype,
                                         comm_reduce_op_t op,
                                         comm_group_t group, int device,
                                         void* stream, comm_work_t* work);
/* The root's sendbuf arrives in every rank's recvbuf. sendbuf is read on
 * the root only and may be NULL elsewhere. */
COMM_C_API comm_result_t comm_broadcast(const void* sendbuf, void* recvbuf,
                                        size_t count, comm_dtype_t dtype,
                                        int root, comm_group_t group,
                                        int device, void* stream,
                                        comm_work_t* work);
/* The reduction arrives in the root's recvbuf. The other ranks' recvbuf is
 * neither read nor written and may be NULL, and no rank's sendbuf is
 * written (unless it is the root's recvbuf: in place). */
COMM_C_API comm_result_t comm_reduce(const void* sendbuf, void* recvbuf,
                                     size_t count, comm_dtype_t dtype,
                                     comm_reduce_op_t op, int root,
                                     comm_group_t group, int device,
                                     void* stream, comm_work_t* work);
/* recvbuf holds size * sendcount elements: rank r's sendbuf at r *
 * sendcount. In place when sendbuf == recvbuf + rank * sendcount. */
COMM_C_API comm_result_t comm_all_gather(const void* sendbuf, void* recvbuf,
                                         size_t sendcount, comm_dtype_t dtype,
                                         comm_group_t group, int device,
                                         void* stream, comm_work_t* work);
/* sendbuf holds size * recvcount elements; rank r receives the reduction of
 * every rank's block r. */
COMM_C_API comm_result_t comm_reduce_scatter(const void* sendbuf, void* recvbuf,
                                             size_t recvcount,
                                             comm_dtype_t dtype,
                                             comm_reduce_op_t op,
                                             comm_group_t group, int device,
                                             void* stream, comm_work_t* work);
/* The root's recvbuf (size * sendcount elements; NULL elsewhere) receives
 * rank r's sendbuf at r * sendcount. */
COMM_C_API comm_result_t comm_gather(const void* sendbuf, void* recvbuf,
                                     size_t sendcount, comm_dtype_t dtype,
                                     int root, comm_group_t group, int device,
                                     void* stream, comm_work_t* work);
/* Rank r receives block r of the root's sendbuf (size * recvcount
 * elements; NULL elsewhere). */
COMM_C_API comm_result_t comm_scatter(const void* sendbuf, void* recvbuf,
                                      size_t recvcount, comm_dtype_t dtype,
                                      int root, comm_group_t group, int device,
                                      void* stream, comm_work_t* work);
/* Both buffers hold size * count elements; block j of this rank's sendbuf
 * goes to rank j, and block i of recvbuf comes from rank i. */
COMM_C_API comm_result_t comm_all_to_all(const void* sendbuf, void* recvbuf,
                                         size_t count, comm_dtype_t dtype,
                                         comm_group_t group, int device,
                                         void* stream, comm_work_t* work);
/* Uneven all_to_all: sendcounts[j] elements go to rank j, taken from
 * sendbuf in rank order, and recvcounts[i] elements come from rank i, stored
 * in rank order. Both arrays have size entries, and each rank's sendcounts[j]
 * must equal rank j's recvcounts[this rank]. */
COMM_C_API comm_result_t comm_all_to_allv(
    const void* sendbuf, const size_t* sendcounts, void* recvbuf,
    const size_t* recvcounts, comm_dtype_t dtype, comm_group_t group,
    int device, void* stream, comm_work_t* work);
/* Returns when every rank has entered it (blocking form). */
COMM_C_API comm_result_t comm_barrier(comm_group_t group, comm_work_t* work);
/* Sends `count` elements to rank `peer`, matched by `tag` with a receive. */
COMM_C_API comm_result_t comm_send(const void* buf, size_t count,
                                   comm_dtype_t dtype, int peer, int tag,
                                   comm_group_t group, int device, void* stream,
                                   comm_work_t* work);
/* Receives `count` elements from rank `peer` (or COMM_ANY_SOURCE) sent
 * with `tag`. In the blocking form *source, when not NULL, receives the
 * sender's rank; in the asynchronous form comm_work_source tells it. */
COMM_C_API comm_result_t comm_recv(void* buf, size_t count, comm_dtype_t dtype,
                                   int peer, int tag, comm_group_t group,
                                   int device, void* stream, int* source,
                                   comm_work_t* work);

/* ---- Collectives on DLPack tensors ------------------------------------- *
 *
 * The same operations on DLPack tensors (numpy, PyTorch, JAX and CuPy all
 * export them). The tensors are borrowed: libcomm reads their DLTensor
 * during the call, never calls their deleters, and uses their memory until
 * the operation completes, as with buffers. The device comes from each
 * tensor; tensors must be contiguous. Shapes follow torch.distributed: the
 * gathered or scattered side is one tensor whose first dimension is size
 * times the other side's.
 */

COMM_C_API comm_result_t comm_all_reduce_dlpack(struct DLManagedTensor* tensor,
                                                comm_reduce_op_t op,
                                                comm_group_t group,
                                                void* stream,
                                                comm_work_t* work);
COMM_C_API comm_result_t comm_broadcast_dlpack(struct DLManagedTensor* tensor,
                                               int root, comm_group_t group,
                                               void* stream, comm_work_t* work);
COMM_C_API comm_result_t comm_reduce_dlpack(struct DLManagedTensor* tensor,
                                            comm_reduce_op_t op, int root,
                                            comm_group_t group, void* stream,
                                            comm_work_t* work);
COMM_C_API comm_result_t comm_all_gather_dlpack(struct DLManagedTensor* output,
                                                struct DLManagedTensor* input,
                                                comm_group_t group,
                                                void* stream,
                                                comm_work_t* work);
COMM_C_API comm_result_t comm_reduce_scatter_dlpack(
    struct DLManagedTensor* output, struct DLManagedTensor* input,
    comm_reduce_op_t op, comm_group_t group, void* stream, comm_work_t* work);
/* `output` is read on the root only and may be NULL elsewhere. */
COMM_C_API comm_result_t comm_gather_dlpack(struct DLManagedTensor* output,
                                            struct DLManagedTensor* input,
                                            int root, comm_group_t group,
                                            void* stream, comm_work_t* work);
/* `input` is read on the root only and may be NULL elsewhere. */
COMM_C_API comm_result_t comm_scatter_dlpack(struct DLManagedTensor* output,
                                             struct DLManagedTensor* input,
                                             int root, comm_group_t group,
                                             void* stream, comm_work_t* work);
COMM_C_API comm_result_t comm_all_to_all_dlpack(struct DLManagedTensor* output,
                                                struct DLManagedTensor* input,
                                                comm_group_t group,
                                                void* stream,
                                                comm_work_t* work);
COMM_C_API comm_result_t comm_send_dlpack(struct DLManagedTensor* tensor,
                                          int peer, int tag, comm_group_t group,
                                          void* stream, comm_work_t* work);
COMM_C_API comm_result_t comm_recv_dlpack(struct DLManagedTensor* tensor,
                                          int peer, int tag, comm_group_t group,
                                          void* stream, int* source,
                                          comm_work_t* work);

/* ---- Work handles ------------------------------------------------------ */

/* Waits for the operation, at most `timeout_ms`, and returns its result, or
 * COMM_TIMEOUT when it is still running after timeout_ms (it goes on; wait
 * again or free the handle). With COMM_DEFAULT_TIMEOUT it waits as long as
 * the operation's own timeout allows; on the NCCL backend it then orders the
 * calling thread's current CUDA stream after the operation and returns
 * without blocking, as the blocking form of a collective does. */
COMM_C_API comm_result_t comm_work_wait(comm_work_t work, int64_t timeout_ms);
/* Never blocks: *done is 1 when the operation has completed, else 0. The
 * result is the operation's once done, COMM_SUCCESS before. */
COMM_C_API comm_result_t comm_work_test(comm_work_t work, int* done);
/* The sender of a completed receive from COMM_ANY_SOURCE, else -1. */
COMM_C_API comm_result_t comm_work_source(comm_work_t work, int* source);
/* Releases the handle. An operation still running goes on to completion
 * (its group keeps it); only the handle is gone, so the operation's buffers
 * must stay valid until it completes all the same. */
COMM_C_API comm_result_t comm_work_free(comm_work_t work);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* COMM_COMM_H_ */
