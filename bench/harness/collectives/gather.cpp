// gather_perf: the root ends with every rank's block, in rank order. In
// place, the root's input is its own block of the output.
#include <limits>

#include "bench/harness/collective.h"

namespace comm::bench {
namespace {

class Gather final : public Collective {
 public:
  const char* name() const override { return "gather"; }
  bool uses_root() const override { return true; }
  bool size_is_total() const override { return true; }
  double bus_factor(int world) const override {
    return static_cast<double>(world - 1) / world;
  }
  void prepare(Case& c) const override {
    const auto count = static_cast<std::int64_t>(c.count);
    c.outputs.clear();
    Tensor input;
    if (c.rank == c.root) {
      Tensor all = zeros_for(c, count * c.world);
      for (int p = 0; p < c.world; ++p)
        c.outputs.push_back(all.slice(p * count, (p + 1) * count));
      if (c.in_place) input = c.outputs[c.root];
    }
    if (!input.defined()) input = zeros_for(c, count);
    fill(input,
         [&](std::size_t i) { return input_value(c.dtype, c.op, c.rank, i); });
    c.inputs = {input};
  }
  void start(ProcessGroup& group, Case& c,
             std::vector<std::shared_ptr<Work>>& started) const override {
    started.push_back(group.gather(c.outputs, c.inputs[0],
                                   {.root = c.root, .async_op = c.async_op}));
  }
  double expected(const Case& c, std::size_t index) const override {
    return input_value(c.dtype, c.op, static_cast<int>(index / c.count),
                       index % c.count);
  }
};

}  // namespace

const Collective& gather_collective() {
  static const Gather instance;
  return instance;
}

}  // namespace comm::bench
