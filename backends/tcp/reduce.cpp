// reduce: a binomial tree towards `root`, each rank reducing its children's
// data into its own buffer (in chunks, with O(chunk) scratch) before
// sending the result to its parent.
#include "backends/tcp/algorithms.h"

namespace comm::tcp::algorithms {

void reduce(CollectiveTransport& ctx, void* data, std::size_t count,
            DType dtype, ReduceOp op, int root) {
  const int size = ctx.size();
  if (size == 1) return;
  const std::size_t bytes = count * dtype_size(dtype);
  const int relative = (ctx.rank() - root + size) % size;
  auto real = [&](int r) { return (r + root) % size; };
  for (int mask = 1; mask < size; mask <<= 1) {
    if (relative & mask) {
      CollectiveStep& to_parent = ctx.step();
      to_parent.send(real(relative & ~mask), data, bytes);
      to_parent.run();
      return;
    }
    if (relative + mask < size) {
      CollectiveStep& from_child = ctx.step();
      from_child.recv_reduce(real(relative + mask), data, bytes, dtype, op);
      from_child.run();
    }
  }
}

}  // namespace comm::tcp::algorithms
