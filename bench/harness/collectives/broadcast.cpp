// broadcast_perf: the root's buffer reaches every rank. The API works in
// place, so out of place copies the input into the output first.
#include <cmath>

#include "bench/harness/collective.h"

namespace comm::bench {
namespace {

class Broadcast final : public Collective {
 public:
  const char* name() const override { return "broadcast"; }
  bool uses_root() const override { return true; }
  double bus_factor(int) const override { return 1.0; }
  void prepare(Case& c) const override {
    // Non-roots start from zeros, so that a rank the data never reached
    // shows up as wrong.
    prepare_in_place_api(c, [&](std::size_t i) {
      return c.rank == c.root ? input_value(c.dtype, c.op, c.root, i) : 0.0;
    });
  }
  void start(ProcessGroup& group, Case& c,
             std::vector<std::shared_ptr<Work>>& started) const override {
    refill_output(c);
    started.push_back(uses_output(
        c, group.broadcast(c.outputs[0],
                           {.root = c.root, .async_op = c.async_op})));
  }
  double expected(const Case& c, std::size_t index) const override {
    return input_value(c.dtype, c.op, c.root, index);
  }
};

}  // namespace

const Collective& broadcast_collective() {
  static const Broadcast instance;
  return instance;
}

}  // namespace comm::bench
