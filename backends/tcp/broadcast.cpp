// broadcast: a binomial tree rooted at `root`, pipelined: each rank
// receives from its parent and passes the bytes on to its children as they
// arrive, so a large message crosses the log2(n) levels at once instead of
// one level after another.
#include "backends/tcp/algorithms.h"

namespace comm::tcp::algorithms {

void broadcast(CollectiveTransport& ctx, void* data, std::size_t bytes,
               int root) {
  const int size = ctx.size();
  if (size == 1) return;
  const int relative = (ctx.rank() - root + size) % size;
  auto real = [&](int r) { return (r + root) % size; };
  const CollectiveStep::Part whole{static_cast<std::uint8_t*>(data), bytes};
  CollectiveStep& tree = ctx.step();
  // The root has everything at once; any other rank relays what its parent
  // sends.
  int source = -1;
  int mask = 1;
  while (mask < size) {
    if (relative & mask) {
      source = tree.recv_parts(real(relative - mask), {whole}, DType::kU8,
                               ReduceOp::kSum);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (relative + mask >= size) continue;
    if (source < 0) {
      tree.send(real(relative + mask), data, bytes);
    } else {
      tree.relay(real(relative + mask), {whole}, 0, source);
    }
  }
  tree.run();
}

}  // namespace comm::tcp::algorithms
