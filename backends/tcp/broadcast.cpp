// broadcast: a binomial tree rooted at `root`: log2(n) rounds, each rank
// receiving once from its parent and then sending to its children.
#include "backends/tcp/collective_context.h"

namespace comm::tcp {

void broadcast(CollectiveContext& ctx, void* data, std::size_t bytes,
               int root) {
  const int size = ctx.size();
  if (size == 1) return;
  const int relative = (ctx.rank() - root + size) % size;
  auto real = [&](int r) { return (r + root) % size; };
  int mask = 1;
  while (mask < size) {
    if (relative & mask) {
      Exchange from_parent = ctx.step();
      from_parent.recv(real(relative - mask), data, bytes);
      ctx.run(from_parent);
      break;
    }
    mask <<= 1;
  }
  Exchange to_children = ctx.step();
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (relative + mask < size)
      to_children.send(real(relative + mask), data, bytes);
  }
  ctx.run(to_children);
}

}  // namespace comm::tcp
