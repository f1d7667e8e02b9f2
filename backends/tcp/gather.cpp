// gather: every rank sends straight to the root, which receives from all
// at once.
#include <cstring>

#include "backends/tcp/algorithms.h"

namespace comm::tcp::algorithms {

void gather(CollectiveTransport& ctx, const void* input,
            const std::vector<void*>& outputs, std::size_t bytes, int root) {
  if (ctx.rank() != root) {
    CollectiveStep& to_root = ctx.step();
    to_root.send(root, input, bytes);
    to_root.run();
    return;
  }
  if (bytes > 0 && outputs[root] != input)
    std::memmove(outputs[root], input, bytes);
  CollectiveStep& from_all = ctx.step();
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer != root) from_all.recv(peer, outputs[peer], bytes);
  }
  from_all.run();
}

}  // namespace comm::tcp::algorithms
