// all_gather_perf: every rank ends with every rank's block, in rank order.
// In place, each rank's input is its own block of the output.
#include "bench/harness/collective.h"

namespace comm::bench {
namespace {

class AllGather final : public Collective {
 public:
  const char* name() const override { return "all_gather"; }
  bool size_is_total() const override { return true; }
  double bus_factor(int world) const override {
    return static_cast<double>(world - 1) / world;
  }
  void prepare(Case& c) const override {
    const auto count = static_cast<std::int64_t>(c.count);
    Tensor output = zeros_for(c, count * c.world);
    Tensor input = c.in_place
                       ? output.slice(c.rank * count, (c.rank + 1) * count)
                       : zeros_for(c, count);
    fill(input,
         [&](std::size_t i) { return input_value(c.dtype, c.op, c.rank, i); });
    c.inputs = {input};
    c.outputs = {output};
  }
  void start(ProcessGroup& group, Case& c,
             std::vector<std::shared_ptr<Work>>& started) const override {
    started.push_back(group.all_gather_into(c.outputs[0], c.inputs[0],
                                            {.async_op = c.async_op}));
  }
  double expected(const Case& c, std::size_t index) const override {
    return input_value(c.dtype, c.op, static_cast<int>(index / c.count),
                       index % c.count);
  }
};

}  // namespace

const Collective& all_gather_collective() {
  static const AllGather instance;
  return instance;
}

}  // namespace comm::bench
