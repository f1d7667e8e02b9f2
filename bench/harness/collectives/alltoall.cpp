// alltoall_perf: rank r sends its block p to rank p and receives rank p's
// block r into its block p. In place, input and output are one buffer.
#include "bench/harness/collective.h"

namespace comm::bench {
namespace {

class AllToAll final : public Collective {
 public:
  const char* name() const override { return "alltoall"; }
  bool size_is_total() const override { return true; }
  double bus_factor(int world) const override {
    return static_cast<double>(world - 1) / world;
  }
  void prepare(Case& c) const override {
    const auto total = static_cast<std::int64_t>(c.count) * c.world;
    Tensor input = zeros_for(c, total);
    fill(input,
         [&](std::size_t i) { return input_value(c.dtype, c.op, c.rank, i); });
    c.inputs = {input};
    c.outputs = {c.in_place ? input : zeros_for(c, total)};
  }
  void start(ProcessGroup& group, Case& c,
             std::vector<std::shared_ptr<Work>>& started) const override {
    started.push_back(
        group.all_to_all(c.outputs[0], c.inputs[0], {.async_op = c.async_op}));
  }
  double expected(const Case& c, std::size_t index) const override {
    const auto from = static_cast<int>(index / c.count);
    return input_value(
        c.dtype, c.op, from,
        static_cast<std::size_t>(c.rank) * c.count + index % c.count);
  }
};

}  // namespace

const Collective& alltoall_collective() {
  static const AllToAll instance;
  return instance;
}

}  // namespace comm::bench
