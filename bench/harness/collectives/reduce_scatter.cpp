// reduce_scatter_perf: rank r ends with block r of the reduction of every
// rank's world blocks. In place, the output is the rank's own input block.
#include "bench/harness/collective.h"

namespace comm::bench {
namespace {

class ReduceScatter final : public Collective {
 public:
  const char* name() const override { return "reduce_scatter"; }
  bool uses_op() const override { return true; }
  bool size_is_total() const override { return true; }
  double bus_factor(int world) const override {
    return static_cast<double>(world - 1) / world;
  }
  void prepare(Case& c) const override {
    const auto count = static_cast<std::int64_t>(c.count);
    Tensor all = zeros_for(c, count * c.world);
    fill(all,
         [&](std::size_t i) { return input_value(c.dtype, c.op, c.rank, i); });
    c.inputs.clear();
    for (int p = 0; p < c.world; ++p)
      c.inputs.push_back(all.slice(p * count, (p + 1) * count));
    c.outputs = {c.in_place ? c.inputs[c.rank] : zeros_for(c, count)};
  }
  void start(ProcessGroup& group, Case& c,
             std::vector<std::shared_ptr<Work>>& started) const override {
    started.push_back(group.reduce_scatter(
        c.outputs[0], c.inputs, {.op = c.op, .async_op = c.async_op}));
  }
  double expected(const Case& c, std::size_t index) const override {
    return reduced_value(c.dtype, c.op, c.world,
                         static_cast<std::size_t>(c.rank) * c.count + index);
  }
};

}  // namespace

const Collective& reduce_scatter_collective() {
  static const ReduceScatter instance;
  return instance;
}

}  // namespace comm::bench
