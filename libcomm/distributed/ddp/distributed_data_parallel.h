// comm::DistributedDataParallel: data-parallel training's gradient
// averaging, for a trainer that computes its own gradients (as c10d's DDP
// does for PyTorch's autograd).
//
// The trainer registers its parameters (each a tensor and its gradient) and
// buffers. Each step it calls before_forward(), runs its forward and
// backward, and calls mark_grad_ready(i) as soon as parameter i's gradient
// is final; then finish() before the optimizer step. Gradients are packed
// into buckets in reverse registration order (the order a backward produces
// them): a first bucket of first_bucket_mb, then buckets of up to
// bucket_cap_mb, one dtype and device per bucket. A bucket's all_reduce
// starts, asynchronously, as soon as its last gradient is marked, so
// communication overlaps the rest of the backward; buckets start in bucket
// order on every rank, so the ranks' collectives always match. finish()
// waits for every bucket and leaves each gradient averaged over the ranks.
//
// With gradient_as_bucket_view the gradients are views into the buckets
// (no copies): write gradients through grad(i), which then aliases the
// bucket. Otherwise the trainer's own gradient tensors are copied in at
// mark_grad_ready and the averages copied back at finish.
//
// Contract: every rank registers the same parameters (names, shapes,
// dtypes) in the same order, marks the same set of gradients each step
// (or sets find_unused_parameters), and calls the same methods in the same
// order. Construction checks the first and broadcasts rank 0's parameters
// and buffers; a parameter never marked by finish() is an error naming
// every such parameter, unless find_unused_parameters, where it is reduced
// as zeros.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "libcomm/distributed/process_group.h"
#include "libcomm/export.h"
#include "libcomm/tensor.h"

namespace comm {

// A trainable tensor and its gradient (same shape, dtype and device).
struct Parameter {
  std::string name;
  Tensor data;
  Tensor grad;
};

// State that is not trained but must agree across ranks (running
// statistics, say); rank 0's is broadcast.
struct Buffer {
  std::string name;
  Tensor data;
};

// What reduces a bucket. kAllReduce sums in the gradients' dtype;
// kFp16Compress and kBf16Compress divide by the world size, convert to
// float16 or bfloat16, sum, and convert back: half the bytes on the wire,
// at half precision (as c10d's fp16_compress_hook and bf16_compress_hook).
enum class CommHook { kAllReduce, kFp16Compress, kBf16Compress };

struct DdpOptions {
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  bool gradient_as_bucket_view = false;
  bool find_unused_parameters = false;
  bool broadcast_buffers = true;
  CommHook comm_hook = CommHook::kAllReduce;
  // Whether the host buckets that the all_reduces send lie in shared host
  // memory (libcomm/shared_host_memory.h), one block for them all, where
  // the ranks of one host read each other's buckets directly with a plain
  // copy. The group keeps them there only where every rank asks for it,
  // has every bucket on the host and could allocate the block; otherwise
  // every rank's buckets are ordinary memory, since ranks that differ would
  // fail each all_reduce with a MismatchError. A process forked after
  // construction shares these buckets with its parent rather than copying
  // them on write: with gradient_as_bucket_view, a child that writes a
  // gradient writes the parent's.
  bool shared_host_buckets = true;
};

class COMM_API DistributedDataParallel {
 public:
  // Checks that every rank registered the same parameters (names, shapes,
  // dtypes, in order; InvalidArgument naming the first difference and the
  // ranks that differ, on every rank), then broadcasts rank 0's parameters
  // and buffers. Every rank of `group` calls it.
  DistributedDataParallel(std::shared_ptr<ProcessGroup> group,
                          std::vector<Parameter> parameters,
                          std::vector<Buffer> buffers = {},
                          DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  const std::vector<Parameter>& parameters() const { return parameters_; }
  std::size_t index_of(const std::string& name) const;
  // Parameter i's gradient: a view into its bucket with
  // gradient_as_bucket_view, else the tensor the trainer registered.
  Tensor& grad(std::size_t index);
  Tensor& grad(const std::string& name) { return grad(index_of(name)); }

  // Starts a forward, as torch's DDP does at the start of its forward:
  // - broadcasts rank 0's buffers (with broadcast_buffers) on the first
  //   forward, and after a forward whose backward communicated, not after
  //   one inside a NoSync or one that no backward followed;
  // - where `backward_follows` (a training forward, with autograd on),
  //   decides whether this step's backward communicates: not inside a
  //   NoSync. A step without before_forward() is decided at its first
  //   mark_grad_ready() or finish().
  void before_forward(bool backward_follows = true);
  // Parameter i's gradient for this step is final.
  void mark_grad_ready(std::size_t index);
  void mark_grad_ready(const std::string& name) {
    mark_grad_ready(index_of(name));
  }
  // Waits for every bucket; afterwards every gradient holds the average
  // over the ranks. Throws what a collective threw, or InvalidArgument
  // naming the parameters never marked (without find_unused_parameters).
  void finish();

  // While a NoSync lives, steps communicate nothing: the trainer's
  // gradients accumulate locally, and the first step after it reduces the
  // accumulated sum (gradient accumulation). A step belongs to the NoSync
  // its before_forward() ran in (see there).
  class COMM_API NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp);
    ~NoSync();
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
    bool previous_;
  };
  NoSync no_sync() { return NoSync(*this); }

  // How the last synchronized step went, for tests and benchmarks: per
  // bucket (in launch order), how many gradients had been marked when its
  // all_reduce started.
  const std::vector<std::size_t>& marked_at_launch() const {
    return marked_at_launch_;
  }
  std::size_t bucket_count() const;
  // The parameter indices of bucket b, in the order they sit in it.
  std::vector<std::size_t> bucket_parameters(std::size_t b) const;

  // Parameters by name (no wrapper prefix), for checkpoints.
  std::vector<std::pair<std::string, Tensor>> state() const;

 private:
  struct Bucket;
  // Throws InvalidArgument naming the first parameter or buffer that
  // differs across ranks. Returns whether every rank `shares_host_buckets`.
  bool check_same_parameters(bool shares_host_buckets);
  // Lays the parameters out in buckets, allocating nothing.
  void plan_buckets();
  // The tensor a bucket's all_reduce sends: its gradients' dtype, or the
  // compression hook's.
  DType sent_dtype(const Bucket& bucket) const;
  // One block of shared host memory for every bucket's sent tensor, where
  // the option asks for it, the group has peers and every bucket is on the
  // host; undefined otherwise, and where the kernel refuses (logged).
  Tensor shared_host_block() const;
  // Allocates the buckets, their sent tensors in `shared_block` when it is
  // defined, and makes the gradients views into them where the option asks.
  void allocate_buckets(const Tensor& shared_block);
  void launch_ready_buckets();
  void launch(Bucket& bucket);
  void reset_step();

  std::shared_ptr<ProcessGroup> group_;
  std::vector<Parameter> parameters_;
  std::vector<Buffer> buffers_;
  DdpOptions options_;
  std::unordered_map<std::string, std::size_t> by_name_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  // Per parameter: its bucket and its element offset there.
  std::vector<std::size_t> bucket_of_;
  std::vector<std::size_t> offset_of_;
  std::vector<bool> marked_;
  std::size_t marked_count_ = 0;
  std::size_t next_launch_ = 0;
  bool no_sync_ = false;
  // Whether this step's backward communicates, once decided; reset by
  // finish().
  std::optional<bool> sync_step_;
  // Whether the next forward broadcasts the buffers.
  bool buffers_due_ = true;
  std::vector<std::size_t> marked_at_launch_;
  bool syncs_this_step();
};

}  // namespace comm
