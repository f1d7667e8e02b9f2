// all_gather: a ring; in step s each rank passes on the block it received
// in step s - 1, so n - 1 steps fill every rank's n blocks.
#include "backends/tcp/collective_context.h"

namespace comm::tcp {

void all_gather(CollectiveContext& ctx, const std::vector<void*>& blocks,
                std::size_t bytes) {
  const int size = ctx.size();
  const int rank = ctx.rank();
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  for (int s = 0; s < size - 1; ++s) {
    const int out = (rank - s + size) % size;
    const int in = (rank - s - 1 + 2 * size) % size;
    Exchange step = ctx.step();
    step.send(right, blocks[out], bytes);
    step.recv(left, blocks[in], bytes);
    ctx.run(step);
  }
}

}  // namespace comm::tcp
