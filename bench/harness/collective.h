// What a *_perf binary measures: one collective, described by a subclass of
// Collective (one per file in collectives/, as Gloo keeps one algorithm per
// file). The harness (runner.h) owns everything else: sizes, timing, the
// cross-rank check, the table and the JSON.
//
// Sizes follow nccl-tests: for all_reduce, broadcast, reduce and sendrecv
// the size is one rank's buffer; for all_gather, reduce_scatter, gather,
// scatter and alltoall it is the whole buffer of `world` blocks, so each
// rank's block is size / world.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "libcomm/device.h"
#include "libcomm/distributed/process_group.h"
#include "libcomm/dtype.h"
#include "libcomm/reduce_op.h"
#include "libcomm/tensor.h"

namespace comm::bench {

// One measured configuration, and the buffers prepare() made for it.
struct Case {
  int rank = 0;
  int world = 1;
  DType dtype = DType::kF32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  // Elements per rank (nccl-tests' "count").
  std::size_t count = 0;
  bool in_place = false;
  Device device = Device::cpu();
  // Whether the buffers are shared host memory (-R 1).
  bool shared_host = false;
  // The options' async_op: false in a blocking run (-z 1), whose runner
  // waits for each operation as soon as start() returns.
  bool async_op = true;

  // Set by prepare(): what the operation reads and what it writes. In place,
  // an output shares memory with an input.
  std::vector<Tensor> inputs;
  std::vector<Tensor> outputs;
  // Out of place, for calls whose API works in place (all_reduce,
  // broadcast, reduce): the untouched input that start() copies into the
  // output before each run.
  Tensor source;
  // The operation last started on the output that refill_output() rewrites.
  // Several operations may be in flight (non-blocking runs), and the backend
  // may still read or write that output, so a refill waits for it first.
  std::shared_ptr<Work> output_user;
};

class Collective {
 public:
  virtual ~Collective() = default;
  // "all_reduce"; the binary is <name>_perf.
  virtual const char* name() const = 0;
  virtual bool uses_op() const { return false; }
  virtual bool uses_root() const { return false; }
  // Whether the size is the whole buffer of world blocks (see above).
  virtual bool size_is_total() const { return false; }
  // Whether the API offers an in-place form (sendrecv does not).
  virtual bool has_in_place() const { return true; }
  // nccl-tests' busbw = algbw x bus_factor(world).
  virtual double bus_factor(int world) const = 0;

  // Allocates c.inputs and c.outputs on c.device and fills the inputs with
  // input_value() for this rank.
  virtual void prepare(Case& c) const = 0;
  // Issues the operation once. Out of place with c.source set, first copies
  // c.source into the output (the copy, and the wait for the operation
  // before it to release the output, are part of what a caller pays).
  // Appends every Work it started to `started`; the run is over when all
  // complete. The caller reuses one list, so that issuing costs no
  // allocation of the harness's own beside the library's.
  virtual void start(ProcessGroup& group, Case& c,
                     std::vector<std::shared_ptr<Work>>& started) const = 0;
  // The value output element `index` (over the outputs laid end to end)
  // must hold after one run on freshly prepared buffers, or NaN when this
  // rank's outputs are not checked (reduce's non-roots).
  virtual double expected(const Case& c, std::size_t index) const = 0;

  // Elements per rank for a size in bytes.
  std::size_t count_for(std::int64_t bytes, DType dtype, int world) const;
  // The bytes a row reports for that count (the size rounded down to whole
  // elements and blocks).
  std::int64_t bytes_for(std::size_t count, DType dtype, int world) const;
};

// The collective a binary is named after: "all_reduce" for all_reduce_perf.
// Throws InvalidArgument listing the names for an unknown one.
const Collective& find_collective(const std::string& name);
std::vector<std::string> collective_names();

// The value rank `rank` contributes at element `index`: small integers, so
// that sums and products are exact in every dtype whatever order an
// algorithm reduces in (products use 1 and 2 only; bool uses 0 and 1).
double input_value(DType dtype, ReduceOp op, int rank, std::size_t index);
// `op` over every rank's input_value at `index`, as the dtype computes it
// (AVG divides by the world size; integers wrap as the dtype does).
double reduced_value(DType dtype, ReduceOp op, int world, std::size_t index);

// A tensor of `count` zeros for case `c`: on its device, in shared host
// memory where it asks for that.
Tensor zeros_for(const Case& c, std::int64_t count);

// Sets element i of `t` (any device) to value(i), through a host copy only
// for CUDA tensors.
void fill(Tensor& t, const std::function<double(std::size_t)>& value);
void fill(Tensor& t, const std::vector<double>& values);
// A tensor of c.count elements for case `c` (zeros_for) holding value(i).
Tensor filled(const Case& c, const std::function<double(std::size_t)>& value);
// The elements of `t` (any device) as doubles.
std::vector<double> values_of(const Tensor& t);

// prepare() for the calls whose API works in place (all_reduce, broadcast,
// reduce): one input of c.count elements holding value(i). In place it is
// the output too; out of place it becomes c.source, and the output a zeroed
// tensor that refill_output() fills from it before each run.
void prepare_in_place_api(Case& c,
                          const std::function<double(std::size_t)>& value);
// Out of place, copies c.source into the output once the operation that
// last used the output (c.output_user) is done with it; in place, does
// nothing. The caller stores the operation it then starts with
// uses_output().
void refill_output(Case& c);
// Records `work` as the operation that uses c's output, and returns it.
std::shared_ptr<Work> uses_output(Case& c, std::shared_ptr<Work> work);

// Counts the elements of c.outputs that differ from expected(): exactly for
// integers, within two units in the last place for floating types.
std::int64_t count_wrong(const Collective& collective, const Case& c);

}  // namespace comm::bench
