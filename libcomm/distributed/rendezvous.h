// comm::rendezvous: how the ranks of a job find each other, as in
// torch.distributed's init_method.
//
//   env://                        MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
//                                 (and LOCAL_RANK, LOCAL_WORLD_SIZE if set;
//                                 COMM_RDZV_TIMEOUT, in seconds, replaces
//                                 `timeout` when set, as commrun's
//                                 --rdzv-timeout does)
//   tcp://HOST:PORT?rank=R&world_size=W
//   file:///PATH?rank=R&world_size=W
//
// A rank or world size passed as an argument (>= 0) wins over the URL and the
// environment. With env:// and tcp:// rank 0 hosts the TCPStore server on
// HOST (so a loopback address stays on loopback) and the other ranks connect
// to it; with file:// every rank opens the same FileStore.
//
// rendezvous returns once all world_size ranks have joined. It fails with
// InvalidArgument when a value is missing or malformed (naming the variable
// and the value seen), when two processes claim the same rank (both fail,
// each naming the other), or when ranks disagree on the world size; and with
// TimeoutError naming the ranks that did not arrive in time.
#pragma once

#include <memory>
#include <string>

#include "libcomm/export.h"
#include "store/store.h"

namespace comm {

struct RendezvousResult {
  std::shared_ptr<Store> store;
  int rank = 0;
  int world_size = 1;
  // From LOCAL_RANK and LOCAL_WORLD_SIZE under env://; -1 when not given.
  int local_rank = -1;
  int local_world_size = -1;
};

COMM_API RendezvousResult
rendezvous(const std::string& init_method, int rank = -1, int world_size = -1,
           Store::Duration timeout = Store::kDefaultTimeout);

// The join step alone, on a store the caller already has: each rank claims
// its rank and waits for the others. rendezvous() calls it; tests and
// launchers that build their own store call it directly.
COMM_API void join_ranks(Store& store, int rank, int world_size,
                         Store::Duration timeout);

}  // namespace comm
