// all_reduce_perf: every rank ends with the reduction of every rank's
// buffer. Out of place runs all_reduce_into, as nccl-tests runs
// ncclAllReduce with two buffers.
#include "bench/harness/collective.h"

namespace comm::bench {
namespace {

class AllReduce final : public Collective {
 public:
  const char* name() const override { return "all_reduce"; }
  bool uses_op() const override { return true; }
  double bus_factor(int world) const override {
    return 2.0 * (world - 1) / world;
  }
  void prepare(Case& c) const override {
    prepare_in_place_api(c, [&](std::size_t i) {
      return input_value(c.dtype, c.op, c.rank, i);
    });
  }
  void start(ProcessGroup& group, Case& c,
             std::vector<std::shared_ptr<Work>>& started) const override {
    if (c.source.defined()) {
      started.push_back(group.all_reduce_into(
          c.outputs[0], c.source, {.op = c.op, .async_op = c.async_op}));
      return;
    }
    started.push_back(
        group.all_reduce(c.outputs[0], {.op = c.op, .async_op = c.async_op}));
  }
  double expected(const Case& c, std::size_t index) const override {
    return reduced_value(c.dtype, c.op, c.world, index);
  }
};

}  // namespace

const Collective& all_reduce_collective() {
  static const AllReduce instance;
  return instance;
}

}  // namespace comm::bench
