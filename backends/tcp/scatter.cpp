// scatter: the root sends each rank its part directly, to all at once.
#include <cstring>

#include "backends/tcp/collective_context.h"

namespace comm::tcp {

void scatter(CollectiveContext& ctx, const std::vector<const void*>& inputs,
             void* output, std::size_t bytes, int root) {
  if (ctx.rank() != root) {
    Exchange from_root = ctx.step();
    from_root.recv(root, output, bytes);
    ctx.run(from_root);
    return;
  }
  if (bytes > 0 && inputs[root] != output)
    std::memmove(output, inputs[root], bytes);
  Exchange to_all = ctx.step();
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer != root) to_all.send(peer, inputs[peer], bytes);
  }
  ctx.run(to_all);
}

}  // namespace comm::tcp
