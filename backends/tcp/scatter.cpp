// scatter: the root sends each rank its part directly, to all at once.
#include <cstring>

#include "backends/tcp/algorithms.h"

namespace comm::tcp::algorithms {

void scatter(CollectiveTransport& ctx, const std::vector<const void*>& inputs,
             void* output, std::size_t bytes, int root) {
  if (ctx.rank() != root) {
    CollectiveStep& from_root = ctx.step();
    from_root.recv(root, output, bytes);
    from_root.run();
    return;
  }
  if (bytes > 0 && inputs[root] != output)
    std::memmove(output, inputs[root], bytes);
  CollectiveStep& to_all = ctx.step();
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer != root) to_all.send(peer, inputs[peer], bytes);
  }
  to_all.run();
}

}  // namespace comm::tcp::algorithms
