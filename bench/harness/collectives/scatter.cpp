// scatter_perf: rank r ends with the root's block r. In place, the root's
// output is its own block of the input.
#include "bench/harness/collective.h"

namespace comm::bench {
namespace {

class Scatter final : public Collective {
 public:
  const char* name() const override { return "scatter"; }
  bool uses_root() const override { return true; }
  bool size_is_total() const override { return true; }
  double bus_factor(int world) const override {
    return static_cast<double>(world - 1) / world;
  }
  void prepare(Case& c) const override {
    const auto count = static_cast<std::int64_t>(c.count);
    c.inputs.clear();
    Tensor output;
    if (c.rank == c.root) {
      // Block p holds what rank p must end with.
      Tensor all = zeros_for(c, count * c.world);
      fill(all, [&](std::size_t i) {
        return input_value(c.dtype, c.op, static_cast<int>(i / c.count),
                           i % c.count);
      });
      for (int p = 0; p < c.world; ++p)
        c.inputs.push_back(all.slice(p * count, (p + 1) * count));
      if (c.in_place) output = c.inputs[c.root];
    }
    if (!output.defined()) output = zeros_for(c, count);
    c.outputs = {output};
  }
  void start(ProcessGroup& group, Case& c,
             std::vector<std::shared_ptr<Work>>& started) const override {
    started.push_back(group.scatter(c.outputs[0], c.inputs,
                                    {.root = c.root, .async_op = c.async_op}));
  }
  double expected(const Case& c, std::size_t index) const override {
    return input_value(c.dtype, c.op, c.rank, index);
  }
};

}  // namespace

const Collective& scatter_collective() {
  static const Scatter instance;
  return instance;
}

}  // namespace comm::bench
