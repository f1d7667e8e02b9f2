// reduce_perf: the root ends with the reduction of every rank's buffer;
// only the root's result is checked. The API works in place, so out of
// place copies the input into the output first.
#include <limits>

#include "bench/harness/collective.h"

namespace comm::bench {
namespace {

class Reduce final : public Collective {
 public:
  const char* name() const override { return "reduce"; }
  bool uses_op() const override { return true; }
  bool uses_root() const override { return true; }
  double bus_factor(int) const override { return 1.0; }
  void prepare(Case& c) const override {
    prepare_in_place_api(c, [&](std::size_t i) {
      return input_value(c.dtype, c.op, c.rank, i);
    });
  }
  void start(ProcessGroup& group, Case& c,
             std::vector<std::shared_ptr<Work>>& started) const override {
    refill_output(c);
    started.push_back(uses_output(
        c, group.reduce(c.outputs[0],
                        {.root = c.root, .op = c.op, .async_op = c.async_op})));
  }
  double expected(const Case& c, std::size_t index) const override {
    if (c.rank != c.root) return std::numeric_limits<double>::quiet_NaN();
    return reduced_value(c.dtype, c.op, c.world, index);
  }
};

}  // namespace

const Collective& reduce_collective() {
  static const Reduce instance;
  return instance;
}

}  // namespace comm::bench
