// broadcast: a binomial tree rooted at `root`, pipelined: each rank
// receives from its parent and passes the bytes on to its children as they
// arrive, so a large message crosses the log2(n) levels at once instead of
// one level after another.
//
// Each child also sends its parent an empty message (a header alone) when
// it starts: a confirmation that it is in the same call. Without it two
// ranks that both name themselves the root would only send, and nobody
// would ever notice that they disagree; with it each reads the other's
// message, whose header names another root, and fails with MismatchError.
// The parent reads its children's confirmations after the call
// (recv_confirmation), as its next collective begins, so the root and the
// relays do not wait for their children to arrive: successive broadcasts
// flow down the tree one after another, as an eager MPI broadcast does.
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
      const int parent = real(relative - mask);
      source = tree.recv_parts(parent, {whole}, DType::kU8, ReduceOp::kSum);
      tree.send(parent, nullptr, 0);
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (relative + mask >= size) continue;
    const int child = real(relative + mask);
    if (source < 0) {
      tree.send(child, data, bytes);
    } else {
      tree.relay(child, {whole}, 0, source);
    }
    tree.recv_confirmation(child);
  }
  tree.run();
}

}  // namespace comm::tcp::algorithms
