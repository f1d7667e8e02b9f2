// sendrecv_perf: each rank sends its buffer to the next rank and receives
// the previous rank's, both at once (isend and irecv), as nccl-tests'
// sendrecv does. There is no in-place form: a buffer cannot be sent and
// received into at the same time. With one rank, the rank is its own
// neighbour and the "transfer" is a local copy.
#include "bench/harness/collective.h"

namespace comm::bench {
namespace {

class SendRecv final : public Collective {
 public:
  const char* name() const override { return "sendrecv"; }
  bool has_in_place() const override { return false; }
  double bus_factor(int) const override { return 1.0; }
  void prepare(Case& c) const override {
    c.inputs = {filled(c, [&](std::size_t i) {
      return input_value(c.dtype, c.op, c.rank, i);
    })};
    c.outputs = {zeros_for(c, c.inputs[0].numel())};
  }
  void start(ProcessGroup& group, Case& c,
             std::vector<std::shared_ptr<Work>>& started) const override {
    if (c.world == 1) {
      c.outputs[0].copy_(c.inputs[0]);
      return;
    }
    const int next = (c.rank + 1) % c.world;
    const int previous = (c.rank + c.world - 1) % c.world;
    // Even ranks send first and odd ranks receive first, so that a backend
    // whose sends and receives each wait for their match (NCCL's, issued
    // one by one) cannot deadlock around the ring.
    if (c.rank % 2 == 0) {
      started.push_back(group.isend(c.inputs[0], next));
      started.push_back(group.irecv(c.outputs[0], previous));
      return;
    }
    started.push_back(group.irecv(c.outputs[0], previous));
    started.push_back(group.isend(c.inputs[0], next));
  }
  double expected(const Case& c, std::size_t index) const override {
    return input_value(c.dtype, c.op, (c.rank + c.world - 1) % c.world, index);
  }
};

}  // namespace

const Collective& sendrecv_collective() {
  static const SendRecv instance;
  return instance;
}

}  // namespace comm::bench
