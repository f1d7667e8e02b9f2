// The options of each operation, one struct per collective as in Gloo. A
// timeout of kDefaultTimeout means the group's timeout (set when the group
// was created); every operation is bounded by one.
//
// A collective's `async_op` is c10d's asyncOp: false promises that the
// caller waits for the returned Work at once, on the calling thread (as
// torch.distributed does for async_op=False, and the C API's blocking
// form). A backend may then run the collective on that thread before the
// call returns, and return its Work completed; nothing else changes (the
// order of calls, the errors, which wait() still rethrows). A backend may
// also ignore it. True, the default, promises nothing. A caller that says
// false and then does not wait at once loses nothing but the overlap: the
// call may have blocked until it was done.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "libcomm/reduce_op.h"

namespace comm {

using OpTimeout = std::chrono::milliseconds;
inline constexpr OpTimeout kDefaultTimeout{-1};

// The source of a receive that takes a message from whichever rank sends
// first.
inline constexpr int kAnySource = -1;

struct BroadcastOptions {
  int root = 0;
  OpTimeout timeout = kDefaultTimeout;
  bool async_op = true;
};

struct ReduceOptions {
  int root = 0;
  ReduceOp op = ReduceOp::kSum;
  OpTimeout timeout = kDefaultTimeout;
  bool async_op = true;
};

struct AllReduceOptions {
  ReduceOp op = ReduceOp::kSum;
  OpTimeout timeout = kDefaultTimeout;
  bool async_op = true;
};

struct ScatterOptions {
  int root = 0;
  OpTimeout timeout = kDefaultTimeout;
  bool async_op = true;
};

struct GatherOptions {
  int root = 0;
  OpTimeout timeout = kDefaultTimeout;
  bool async_op = true;
};

struct AllGatherOptions {
  OpTimeout timeout = kDefaultTimeout;
  bool async_op = true;
};

struct ReduceScatterOptions {
  ReduceOp op = ReduceOp::kSum;
  OpTimeout timeout = kDefaultTimeout;
  bool async_op = true;
};

struct AllToAllOptions {
  // Rows (along dimension 0) this rank sends to and receives from each rank.
  // Empty: equal splits, size(0) / world_size rows each.
  std::vector<std::int64_t> input_split_sizes;
  std::vector<std::int64_t> output_split_sizes;
  OpTimeout timeout = kDefaultTimeout;
  bool async_op = true;
};

struct BarrierOptions {
  OpTimeout timeout = kDefaultTimeout;
  bool async_op = true;
};

struct SendOptions {
  int tag = 0;
  OpTimeout timeout = kDefaultTimeout;
};

struct RecvOptions {
  // Receives only a message sent with this tag; messages with other tags
  // wait for receives that name them.
  int tag = 0;
  OpTimeout timeout = kDefaultTimeout;
};

}  // namespace comm
